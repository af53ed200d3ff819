"""Legacy typed storage classes of the device: ``torch.neuron.FloatStorage`` and its siblings.

PyTorch looks these up by name on the device module, as it does on ``torch.cuda``:
``Tensor.storage_type()``, ``TypedStorage``'s ``type()`` and ``isinstance(storage,
torch.neuron.FloatStorage)`` all need them, and old code still constructs them
(``torch.neuron.FloatStorage(8)`` allocates 8 floats on the current NeuronCore). They are
deprecated upstream in favour of ``UntypedStorage``; like CUDA's, they warn once on use.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._utils import classproperty
from torch.storage import _LegacyStorage, _warn_typed_storage_removal

# The module PyTorch's storage code derives the device from (its last component is "neuron").
_DEVICE_MODULE = "torch.neuron"


class _NeuronLegacyStorage(_LegacyStorage):
    @classmethod
    def from_buffer(cls, *args: Any, **kwargs: Any) -> Any:
        _warn_typed_storage_removal()
        raise RuntimeError("from_buffer: not available for neuron storage; create the storage on "
                           "the CPU and move it with .to('neuron')")

    @classmethod
    def _new_with_weak_ptr(cls, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("_new_with_weak_ptr: not available for neuron storage")

    @classmethod
    def _new_shared_filename(cls, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("_new_shared_filename: not available for neuron storage")


_NeuronLegacyStorage.__module__ = _DEVICE_MODULE


def _legacy_storage_class(name: str, dtype: torch.dtype) -> type:
    def public_dtype(cls: type) -> torch.dtype:
        _warn_typed_storage_removal()
        return dtype

    return type(name, (_NeuronLegacyStorage,), {
        "dtype": classproperty(public_dtype),
        "_dtype": classproperty(lambda cls: dtype),
        "__module__": _DEVICE_MODULE,
        "__qualname__": name,
    })


# The same set torch.cuda defines.
_DTYPES = {
    "ByteStorage": torch.uint8, "CharStorage": torch.int8, "ShortStorage": torch.int16,
    "IntStorage": torch.int32, "LongStorage": torch.int64, "BoolStorage": torch.bool,
    "HalfStorage": torch.float16, "BFloat16Storage": torch.bfloat16, "FloatStorage": torch.float32,
    "DoubleStorage": torch.float64, "ComplexFloatStorage": torch.complex64,
    "ComplexDoubleStorage": torch.complex128,
}

LEGACY_STORAGE_CLASSES: dict[str, type] = {name: _legacy_storage_class(name, dtype)
                                           for name, dtype in _DTYPES.items()}
torch._storage_classes.update(LEGACY_STORAGE_CLASSES.values())
