"""Dynamo's device interface for ``neuron`` (``torch._dynamo.device_interface``).

Dynamo and Inductor look devices up there to answer device and stream questions about the code
they compile (current device, streams and events, properties, bf16 support); torch registers
CUDA, XPU, MTIA, MPS and the CPU itself, and an out-of-tree device registers its own next to its
compiler. Without it ``get_interface_for_device("neuron")`` raised ``NotImplementedError``. The
answers come from ``torch.neuron``. Registered when ``torch._dynamo.device_interface`` is
imported, so ``import torch`` does not import Dynamo.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["install"]

_MODULE = "torch._dynamo.device_interface"


def _interface_class(base: type) -> type:
    neuron = torch.neuron

    class NeuronInterface(base):  # type: ignore[misc, valid-type]
        device = neuron.device
        Event = neuron.Event
        Stream = neuron.Stream

        class Worker:
            set_device = staticmethod(neuron.set_device)
            current_device = staticmethod(neuron.current_device)
            get_device_properties = staticmethod(neuron.get_device_properties)

        current_device = staticmethod(neuron.current_device)
        set_device = staticmethod(neuron.set_device)
        device_count = staticmethod(neuron.device_count)
        is_available = staticmethod(neuron.is_available)
        stream = staticmethod(neuron.stream)
        current_stream = staticmethod(neuron.current_stream)
        set_stream = staticmethod(neuron.set_stream)
        synchronize = staticmethod(neuron.synchronize)
        memory_allocated = staticmethod(neuron.memory_allocated)

        @staticmethod
        def maybe_exchange_device(device: int) -> int:
            previous = neuron.current_device()
            if device != previous:
                neuron.set_device(device)
            return previous

        exchange_device = maybe_exchange_device

        @staticmethod
        def get_raw_stream(device_idx: int) -> int:
            return neuron.current_stream(device_idx).stream_id

        @classmethod
        def get_device_properties(cls, device: Any = None) -> Any:
            return neuron.get_device_properties(device)

        @staticmethod
        def get_compute_capability(device: Any = None) -> str:
            return neuron.get_device_properties(device).name  # e.g. "NeuronCore-v3"

        @staticmethod
        def is_bf16_supported(including_emulation: bool = False) -> bool:
            return True

        @staticmethod
        def is_triton_capable(device: Any = None) -> bool:
            return False

    return NeuronInterface


def _register(module: Any) -> None:
    try:
        module.get_interface_for_device("neuron")
        return
    except NotImplementedError:
        pass
    interface = _interface_class(module.DeviceInterface)
    module.register_interface_for_device("neuron", interface)
    for index in range(torch.neuron.device_count()):
        module.register_interface_for_device(f"neuron:{index}", interface)


def install() -> None:
    """Registers the interface once Dynamo's device-interface module is imported (now, if it is)."""
    from neuron_runtime._post_import import install_finder, register_post_import_hook

    install_finder()
    register_post_import_hook(_MODULE, _register)
