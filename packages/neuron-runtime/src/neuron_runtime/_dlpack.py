"""DLPack for neuron tensors: ``__dlpack_device__`` names the device as DLPack's ``kDLExtDev``.

torch's ``Tensor.__dlpack_device__`` recognises an out-of-tree device only by the type name
``"privateuse1"``; once the backend is renamed to ``neuron`` it raised "Unknown device type
neuron for Dlpack", and with it ``torch.from_dlpack(tensor)``, which asks for the device first
(``torch.utils.dlpack.to_dlpack`` and the capsule route worked). Neuron tensors now answer as
the renamed PrivateUse1 device they are; the exchange shares memory, as on CUDA.
"""

from __future__ import annotations

import functools

import torch


def install() -> None:
    """Wraps ``torch.Tensor.__dlpack_device__`` once."""
    original = torch.Tensor.__dlpack_device__
    if getattr(original, "_neuron_wrapped", False):
        return

    @functools.wraps(original)
    def __dlpack_device__(self: torch.Tensor) -> tuple[int, int]:
        if not torch.overrides.has_torch_function_unary(self):  # subclasses keep their own
            device = self.device
            if device.type == "neuron":
                from torch.utils.dlpack import DLDeviceType

                return (DLDeviceType.kDLExtDev, device.index if device.index is not None else 0)
        return original(self)

    __dlpack_device__._neuron_wrapped = True  # type: ignore[attr-defined]
    torch.Tensor.__dlpack_device__ = __dlpack_device__  # type: ignore[method-assign]
