"""Dynamo's device interface for neuron, and device and stream use inside compiled code."""

from __future__ import annotations

import torch
from torch._dynamo.device_interface import get_interface_for_device, get_registered_device_interfaces


def test_neuron_has_a_dynamo_device_interface():
    interface = get_interface_for_device("neuron")
    assert interface is get_interface_for_device(torch.device("neuron", 0))
    assert "neuron" in dict(get_registered_device_interfaces())
    assert interface.is_available() and interface.device_count() == torch.neuron.device_count()
    assert interface.current_device() == torch.neuron.current_device()
    assert interface.get_device_properties(0).name == torch.neuron.get_device_properties(0).name
    assert interface.is_bf16_supported() and not interface.is_triton_capable()
    assert isinstance(interface.current_stream(), torch.neuron.Stream)
    with interface.device(1):
        assert torch.neuron.current_device() == 1
    previous = interface.exchange_device(1)
    assert torch.neuron.current_device() == 1
    interface.set_device(previous)


def test_compiled_code_can_query_the_device_through_dynamo():
    @torch.compile(backend="neuron", fullgraph=True)
    def scaled(x):
        return x * torch.neuron.device_count()

    x = torch.ones(3, device="neuron")
    assert scaled(x).cpu().tolist() == [float(torch.neuron.device_count())] * 3


def test_stream_and_event_use_inside_compiled_code(fresh_compiler):
    # Dynamo records `with stream:` and `event.record()` in the graph; Inductor's CPU code
    # generation emitted them as undefined names (NameError / UnboundLocalError at run time).
    # Streams run in order on the emulated device, so the program computes the same without them.
    x = torch.randn(4, device="neuron")
    side = torch.neuron.Stream()

    def on_side_stream(x):
        with side:
            y = x + 1
        return y * 2

    def recording_an_event(x):
        event = torch.neuron.Event()
        y = x + 1
        event.record()
        return y

    for fn in (on_side_stream, recording_an_event):
        compiled = torch.compile(fn, backend="neuron", fullgraph=True)
        assert torch.equal(compiled(x).cpu(), fn(x).cpu()), fn.__name__
