"""Streams and events: identities, priorities, current-stream context, timing."""

from __future__ import annotations

import time

import pytest
import torch


def test_stream_priority_and_identity():
    s = torch.neuron.Stream(priority=-1)
    t = torch.neuron.Stream()
    assert s.priority == -1 and t.priority == 0
    assert s.stream_id != t.stream_id and s.device.type == "neuron"
    assert torch.neuron.default_stream().stream_id == 0


def test_generic_torch_stream_on_neuron():
    s = torch.Stream(device="neuron", priority=-1)
    assert s.device_type == torch.neuron.current_stream().device_type


def test_stream_context_sets_current():
    s = torch.neuron.Stream()
    before = torch.neuron.current_stream()
    with torch.neuron.stream(s):
        assert torch.neuron.current_stream() == s
        x = torch.ones(4, device="neuron") * 2
    assert torch.neuron.current_stream() == before
    assert x.cpu().eq(2).all()


def test_stream_context_on_another_core_restores_the_current_core():
    # The context restored only the stream: a stream on neuron:1 left neuron:1 current after
    # the block, so later tensors landed on the wrong core (torch.cuda.stream restores both).
    torch.neuron.set_device(0)
    other = torch.neuron.Stream(device=1)
    side = torch.neuron.Stream(device=1)
    torch.neuron.set_stream(side)  # neuron:1's current stream, which the block must give back
    torch.neuron.set_device(0)
    try:
        with torch.neuron.stream(other):
            assert torch.neuron.current_device() == 1
            assert torch.neuron.current_stream() == other
            assert torch.ones(1, device="neuron").device == torch.device("neuron", 1)
        assert torch.neuron.current_device() == 0
        assert torch.ones(1, device="neuron").device == torch.device("neuron", 0)
        assert torch.neuron.current_stream(0) == torch.neuron.default_stream(0)
        assert torch.neuron.current_stream(1) == side
    finally:
        torch.neuron.set_stream(torch.neuron.default_stream(1))
        torch.neuron.set_device(0)


def test_event_record_wait_query_and_elapsed_time():
    start = torch.neuron.Event(enable_timing=True)
    end = torch.neuron.Event(enable_timing=True)
    start.record()
    time.sleep(0.02)
    x = torch.randn(256, 256, device="neuron") @ torch.randn(256, 256, device="neuron")
    end.record()
    other = torch.neuron.Stream()
    other.wait_event(end)
    assert end.query() and other.query()
    end.synchronize()
    assert end.elapsed_time(start) < 0 < start.elapsed_time(end)
    assert start.elapsed_time(end) >= 15.0
    assert isinstance(start, torch.neuron.Event) and not isinstance(torch.Event("cpu"), torch.neuron.Event)
    assert x.shape == (256, 256)


def test_elapsed_time_requires_timing():
    a, b = torch.neuron.Event(), torch.neuron.Event()
    a.record()
    b.record()
    with pytest.raises((RuntimeError, ValueError), match="enable_timing=True"):
        a.elapsed_time(b)


def test_synchronize_and_stream_synchronize():
    torch.neuron.synchronize()
    torch.neuron.Stream().synchronize()
    torch.accelerator.synchronize()


def test_record_stream_on_neuron_streams():
    # What DDP does after copying CPU inputs to the device on a side stream.
    side = torch.neuron.Stream()
    with torch.neuron.stream(side):
        copied = torch.arange(6.0).to("neuron")
    current = torch.neuron.current_stream()
    current.wait_stream(side)
    copied.record_stream(current)
    copied.record_stream(side)
    torch.neuron.synchronize()
    assert copied.cpu().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_record_stream_rejects_other_devices_streams():
    tensor = torch.ones(2, device="neuron:0")
    with pytest.raises(RuntimeError, match="neuron stream"):
        tensor.record_stream(torch.Stream(device="cpu"))
    if torch.neuron.device_count() > 1:
        with pytest.raises(RuntimeError, match="belongs to neuron:1"):
            tensor.record_stream(torch.neuron.Stream(device=1))
