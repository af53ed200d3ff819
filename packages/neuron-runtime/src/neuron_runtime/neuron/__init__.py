"""``torch.neuron``: the device module, mirroring ``torch.cuda`` function for function.

Everything here is lazy: importing it (or calling ``is_available``/``device_count``) never
initialises the runtime; the first tensor on the device, ``init()`` or ``set_device`` does.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch

from neuron_runtime import _C
from neuron_runtime._config import RuntimeConfig, load_config
from neuron_runtime.neuron import memory
from neuron_runtime.neuron._legacy_storage import LEGACY_STORAGE_CLASSES as _LEGACY_STORAGE_CLASSES
from neuron_runtime.neuron.memory import (
    caching_allocator_alloc,
    caching_allocator_delete,
    empty_cache,
    get_allocator_backend,
    get_per_process_memory_fraction,
    host_memory_stats,
    host_memory_stats_as_nested_dict,
    max_memory_allocated,
    max_memory_cached,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_cached,
    memory_reserved,
    memory_snapshot,
    memory_stats,
    memory_stats_as_nested_dict,
    memory_summary,
    reset_accumulated_host_memory_stats,
    reset_accumulated_memory_stats,
    reset_max_memory_allocated,
    reset_max_memory_cached,
    reset_peak_host_memory_stats,
    reset_peak_memory_stats,
    set_per_process_memory_fraction,
)
from neuron_runtime.neuron.random import (
    default_generators,
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)
from neuron_runtime.neuron.streams import (
    Event,
    Stream,
    StreamContext,
    current_stream,
    default_stream,
    set_stream,
    stream,
    synchronize,
)

__all__ = [
    "Event", "Stream", "StreamContext", "caching_allocator_alloc", "caching_allocator_delete",
    "current_device", "current_stream", "default_generators", "default_stream", "device",
    "device_count", "device_of", "empty_cache", "get_allocator_backend", "get_amp_supported_dtype",
    "get_device_capability", "get_device_name", "get_device_properties",
    "get_per_process_memory_fraction", "get_rng_state", "get_rng_state_all", "host_memory_stats",
    "host_memory_stats_as_nested_dict", "init", "initial_seed", "is_available", "is_bf16_supported",
    "is_initialized", "manual_seed", "manual_seed_all", "max_memory_allocated", "max_memory_cached",
    "max_memory_reserved", "mem_get_info", "memory", "memory_allocated", "memory_cached",
    "memory_reserved", "memory_snapshot", "memory_stats", "memory_stats_as_nested_dict",
    "memory_summary", "reset_accumulated_host_memory_stats", "reset_accumulated_memory_stats",
    "reset_max_memory_allocated", "reset_max_memory_cached", "reset_peak_host_memory_stats",
    "reset_peak_memory_stats", "seed", "seed_all", "set_device", "set_per_process_memory_fraction",
    "set_rng_state", "set_rng_state_all", "set_stream", "stream", "synchronize",
    "NeuronDeviceProperties",
]

# torch.neuron.FloatStorage and the other legacy typed storages, as torch.cuda has them.
globals().update(_LEGACY_STORAGE_CLASSES)
__all__ += sorted(_LEGACY_STORAGE_CLASSES)

_config: RuntimeConfig = load_config()  # replaced by the one the runtime was configured with
_warned_config_error = False


def _warn_config_error() -> None:
    global _warned_config_error
    if _config.error and not _warned_config_error:
        _warned_config_error = True
        warnings.warn(f"neuron: the device is unavailable: {_config.error}", stacklevel=3)


def is_available() -> bool:
    """True if at least one emulated NeuronCore is visible. Does not initialise the device."""
    _warn_config_error()
    return _C._device_count() > 0


def device_count() -> int:
    """Number of visible NeuronCores (logical cores). Does not initialise the device."""
    _warn_config_error()
    return _C._device_count()


# Fixed for the life of a process: torch.compile'd code may call them, and Dynamo folds their
# result into the graph (what ``torch._dynamo.assume_constant_result`` marks) instead of
# failing to trace the extension call inside.
for _constant in (is_available, device_count):
    _constant._dynamo_marked_constant = True  # type: ignore[attr-defined]


def is_initialized() -> bool:
    """Whether the runtime has been initialised in this process."""
    return _C._is_initialized()


def __getattr__(name: str) -> Any:
    # ``torch.utils.checkpoint`` saves and restores a device's RNG state (dropout masks
    # recomputed alike) only if ``device_module._initialized`` is true, the flag torch.cuda
    # keeps. Read on each access: the device initialises lazily.
    if name == "_initialized":
        return _C._is_initialized()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _is_in_bad_fork() -> bool:
    return _C._is_in_bad_fork()


def _lazy_init() -> None:
    _C._lazy_init()


def init() -> None:
    """Initialises the runtime now (it otherwise initialises on first use)."""
    _lazy_init()


def _device_index(device: Any = None, optional: bool = True) -> int:
    """Resolves a device argument (int, str, torch.device or None) to a core index."""
    if device is None:
        return current_device()
    if isinstance(device, int):
        index = device
    else:
        device = torch.device(device)
        if device.type != "neuron":
            raise ValueError(f"Expected a neuron device, but got: {device}")
        index = current_device() if device.index is None else device.index
    _C._check_device_index(index)
    return index


def current_device() -> int:
    """Index of the current core (LOCAL_RANK under torchrun, else 0 until set_device)."""
    return _C._current_device()


def _index_or_negative(device: Any) -> int:
    # As torch.cuda: a negative integer means "no core" and leaves the current core alone.
    if isinstance(device, int) and device < 0:
        return -1
    return _device_index(device)


def set_device(device: Any) -> None:
    """Sets the current core of this thread (a negative index is a no-op, as in torch.cuda)."""
    index = _index_or_negative(device)
    if index >= 0:
        _lazy_init()
        _C._set_device(index)


def _exchange_device(index: int) -> int:
    """Makes ``index`` current and returns the core that was; negative: changes nothing."""
    if index < 0:
        return -1
    previous = current_device()
    if previous != index:
        set_device(index)
    return previous


class device:
    """Context manager that changes the current core (``with torch.neuron.device(1):``).

    As ``torch.cuda.device``: on exit the core current at entry is current again, even if the
    block changed it; a negative index makes the context a no-op.
    """

    def __init__(self, device: Any) -> None:
        self.idx = _index_or_negative(device)
        self.prev_idx = -1

    def __enter__(self) -> None:
        self.prev_idx = _exchange_device(self.idx)

    def __exit__(self, *exc: object) -> bool:
        _exchange_device(self.prev_idx)
        return False


class device_of(device):
    """Context manager that makes the core of a given tensor current."""

    def __init__(self, obj: torch.Tensor) -> None:
        super().__init__(obj.get_device() if obj.device.type == "neuron" else -1)


@dataclass(frozen=True)
class NeuronDeviceProperties:
    """What get_device_properties reports for one emulated core."""

    name: str
    total_memory: int
    major: int
    minor: int
    instance: str
    logical_nc_config: int
    physical_core: int
    multi_processor_count: int = 1

    def __repr__(self) -> str:
        return (
            f"_NeuronDeviceProperties(name='{self.name}', instance='{self.instance}', "
            f"LNC={self.logical_nc_config}, total_memory={self.total_memory // (1 << 20)}MB)"
        )


def get_device_properties(device: Any = None) -> NeuronDeviceProperties:
    """Properties of a core: name, HBM capacity, capability, instance profile."""
    index = _device_index(device)
    profile = _config.profile
    major, minor = profile.capability
    return NeuronDeviceProperties(
        name=profile.core_name,
        total_memory=_config.capacity_bytes,
        major=major,
        minor=minor,
        instance=profile.name,
        logical_nc_config=_config.lnc,
        physical_core=_config.visible_cores[index],
    )


def get_device_name(device: Any = None) -> str:
    """Name of a core, e.g. ``NeuronCore-v3``."""
    return get_device_properties(device).name


def get_device_capability(device: Any = None) -> tuple[int, int]:
    """(major, minor): the NeuronCore generation (2 for trn1, 3 for trn2)."""
    props = get_device_properties(device)
    return props.major, props.minor


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """Trainium computes natively in bfloat16."""
    return is_available()


is_bf16_supported._dynamo_marked_constant = True  # type: ignore[attr-defined]


def get_amp_supported_dtype() -> list[torch.dtype]:
    """Low-precision dtypes torch.autocast("neuron") accepts."""
    return [torch.bfloat16, torch.float16]


def _is_autocast_enabled() -> bool:
    return torch.is_autocast_enabled("neuron")


def _get_autocast_dtype() -> torch.dtype:
    return torch.get_autocast_dtype("neuron")
