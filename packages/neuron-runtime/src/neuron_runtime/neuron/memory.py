"""Memory statistics of the neuron caching allocator, in torch.cuda's format."""

from __future__ import annotations

import collections
import pickle
import sys
import threading
import warnings
from typing import Any

import torch

from neuron_runtime import _C

__all__ = [
    "caching_allocator_alloc", "caching_allocator_delete", "empty_cache", "get_allocator_backend",
    "get_per_process_memory_fraction", "host_memory_stats", "host_memory_stats_as_nested_dict",
    "max_memory_allocated", "max_memory_cached", "max_memory_reserved", "mem_get_info",
    "memory_allocated", "memory_cached", "memory_reserved", "memory_snapshot", "memory_stats",
    "memory_stats_as_nested_dict", "memory_summary", "reset_accumulated_host_memory_stats",
    "reset_accumulated_memory_stats", "reset_max_memory_allocated", "reset_max_memory_cached",
    "reset_peak_host_memory_stats", "reset_peak_memory_stats", "set_per_process_memory_fraction",
]


def _index(device: Any) -> int:
    from neuron_runtime.neuron import _device_index

    return _device_index(device)


# Blocks handed out by caching_allocator_alloc, by address: each is held by a byte tensor, so
# the caching allocator accounts for it like any tensor's memory until caching_allocator_delete.
_raw_blocks: dict[int, torch.Tensor] = {}
_raw_blocks_lock = threading.Lock()


def caching_allocator_alloc(size: int, device: Any = None, stream: Any = None) -> int:
    """Allocates ``size`` bytes from the core's caching allocator and returns the address.

    For interoperability with other frameworks, as ``torch.cuda.caching_allocator_alloc``;
    free the block with :func:`caching_allocator_delete`. ``stream`` (a ``torch.neuron.Stream``,
    default the core's current stream) is the stream the block is used on.
    """
    from neuron_runtime.neuron import streams

    index = _index(device)
    if stream is None:
        stream = streams.current_stream(index)
    if not isinstance(stream, torch.Stream) or stream.device.type != "neuron":
        raise TypeError(
            f"Invalid type for stream argument: got {type(stream).__name__}, expected a "
            f"torch.neuron.Stream (or None for the current stream of neuron:{index})."
        )
    if stream.device_index != index:
        raise ValueError(f"The stream is on neuron:{stream.device_index}, but the block is for neuron:{index}.")
    with streams.stream(stream):
        block = torch.empty(int(size), dtype=torch.uint8, device=torch.device("neuron", index))
    address = block.data_ptr()
    if address:
        with _raw_blocks_lock:
            _raw_blocks[address] = block
    return address


def caching_allocator_delete(mem_ptr: int) -> None:
    """Frees a block allocated with :func:`caching_allocator_alloc` (0 is ignored)."""
    if not mem_ptr:
        return
    with _raw_blocks_lock:
        block = _raw_blocks.pop(int(mem_ptr), None)
    if block is None:
        raise RuntimeError(
            f"invalid device pointer: {int(mem_ptr):#x}: caching_allocator_delete frees only "
            "addresses returned by torch.neuron.caching_allocator_alloc, once each."
        )


def get_allocator_backend() -> str:
    """The allocator in use: always ``"native"``, the caching allocator (as on CUDA by default)."""
    return "native"


def empty_cache() -> None:
    """Returns every cached, unused block to the host (memory_reserved drops)."""
    _C._empty_cache()


def memory_stats_as_nested_dict(device: Any = None) -> dict[str, Any]:
    """Allocator statistics as a nested dict (see torch.cuda.memory_stats)."""
    return _C._memory_stats(_index(device))


def _flatten(nested: dict[str, Any]) -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``, sorted by key (torch.cuda's flat layout)."""
    result: list[tuple[str, Any]] = []

    def flatten(prefix: str, obj: Any) -> None:
        if isinstance(obj, dict):
            for key, value in obj.items():
                flatten(f"{prefix}.{key}" if prefix else key, value)
        else:
            result.append((prefix, obj))

    flatten("", nested)
    return collections.OrderedDict(sorted(result))


def memory_stats(device: Any = None) -> dict[str, Any]:
    """Allocator statistics, flattened to ``"allocated_bytes.all.current"``-style keys."""
    return _flatten(memory_stats_as_nested_dict(device))


def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    """Lets this process reserve at most ``fraction`` x the core's HBM (as on CUDA).

    Allocations beyond the cap raise ``torch.OutOfMemoryError``; 1.0 lifts it. Memory already
    reserved is not released.
    """
    if not isinstance(fraction, (float, int)) or isinstance(fraction, bool):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    if not 0 <= fraction <= 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    _C._set_memory_fraction(float(fraction), _index(device))


def get_per_process_memory_fraction(device: Any = None) -> float:
    """The fraction set by set_per_process_memory_fraction (1.0 by default)."""
    return _C._get_memory_fraction(_index(device))


def memory_snapshot() -> list[dict[str, Any]]:
    """Every segment the allocator holds on every core, in torch.cuda.memory_snapshot()'s layout."""
    return _C._memory_snapshot()


def _record_memory_history(
    enabled: str | bool | None = "all",
    context: str | None = "all",
    stacks: str = "all",
    max_entries: int = sys.maxsize,
    device: Any = None,
    clear_history: bool = False,
    compile_context: bool = False,
    global_record_annotations: bool = False,
    skip_actions: list[str] | None = None,
    **legacy: Any,
) -> None:
    """Records the allocator's history for :func:`_snapshot`, as ``torch.cuda.memory``'s does.

    ``enabled``: None stops recording; ``"state"`` keeps the stack of every live block;
    ``"all"`` also keeps the last ``max_entries`` actions per core (alloc, free_requested,
    free_completed, segment_alloc, segment_free, oom, snapshot). ``context``: which actions
    keep their stack (None, ``"state"``, ``"alloc"``, ``"all"``); ``stacks``: ``"python"`` or
    ``"all"`` (with C++ frames). Recording covers every core (``device`` is accepted, as on
    CUDA, and ignored). Dump with :func:`_dump_snapshot` and open the file at
    https://pytorch.org/memory_viz.
    """
    if isinstance(enabled, bool):  # torch.cuda's legacy signature
        max_entries = legacy.pop("trace_alloc_max_entries", 1)
        keeps_history = max_entries > 1
        alloc_stacks = legacy.pop("trace_alloc_record_context", False) and keeps_history
        context = ("alloc" if alloc_stacks else "state") if legacy.pop("record_context", True) else None
        stacks = "all" if legacy.pop("record_context_cpp", False) else "python"
        legacy.pop("_enable_expandable_segments", None)
        enabled = ("all" if keeps_history else "state") if enabled else None
    if legacy:
        raise TypeError(f"_record_memory_history() got unexpected keyword arguments {sorted(legacy)}")
    _C._record_memory_history(enabled, context, stacks, max_entries, clear_history, list(skip_actions or []))


def _snapshot(device: Any = None, augment_with_fx_traces: bool = False) -> dict[str, Any]:
    """The allocator's state in ``torch.cuda.memory._snapshot()``'s layout.

    ``segments`` as :func:`memory_snapshot` (with each live block's allocation stack while
    :func:`_record_memory_history` records), and ``device_traces``: one list of recorded
    actions per core.
    """
    from neuron_runtime.neuron import device_count

    for index in range(device_count()):  # as CUDA, every core's history marks the snapshot
        _C._record_memory_snapshot_taken(index)
    snapshot = {"segments": memory_snapshot(), "device_traces": _C._memory_history(device_count()),
                "allocator_settings": {"PYTORCH_ALLOC_CONF": "", "backend": get_allocator_backend()}}
    if augment_with_fx_traces:
        from torch.cuda.memory import _augment_memory_snapshot_stack_traces

        snapshot = _augment_memory_snapshot_stack_traces(snapshot)
    return snapshot


def _dump_snapshot(filename: str = "dump_snapshot.pickle", augment_with_fx_traces: bool = False) -> None:
    """Pickles :func:`_snapshot` to ``filename``, for https://pytorch.org/memory_viz."""
    snapshot = _snapshot(augment_with_fx_traces=augment_with_fx_traces)
    with open(filename, "wb") as f:
        pickle.dump(snapshot, f)


def host_memory_stats_as_nested_dict() -> dict[str, Any]:
    """Pinned host memory statistics as a nested dict (see torch.cuda.host_memory_stats)."""
    return _C._host_memory_stats()


def host_memory_stats() -> dict[str, Any]:
    """Pinned host memory statistics, flattened to ``"allocated_bytes.current"``-style keys."""
    return _flatten(host_memory_stats_as_nested_dict())


def reset_peak_host_memory_stats() -> None:
    """Resets the peaks of the pinned host memory statistics."""
    _C._reset_host_peak_stats()


def reset_accumulated_host_memory_stats() -> None:
    """Resets the accumulated counters of the pinned host memory statistics."""
    _C._reset_host_accumulated_stats()


def _stat(device: Any, name: str, field: str) -> int:
    return int(_C._memory_stats(_index(device))[name]["all"][field])


def memory_allocated(device: Any = None) -> int:
    """Bytes currently occupied by tensors on the core."""
    return _stat(device, "allocated_bytes", "current")


def max_memory_allocated(device: Any = None) -> int:
    """Peak of memory_allocated since start or the last reset_peak_memory_stats."""
    return _stat(device, "allocated_bytes", "peak")


def memory_reserved(device: Any = None) -> int:
    """Bytes the caching allocator holds on the core (allocated plus cached)."""
    return _stat(device, "reserved_bytes", "current")


def max_memory_reserved(device: Any = None) -> int:
    """Peak of memory_reserved."""
    return _stat(device, "reserved_bytes", "peak")


def memory_cached(device: Any = None) -> int:
    """Deprecated; see :func:`memory_reserved` (kept as torch.cuda keeps it)."""
    return memory_reserved(device)


def max_memory_cached(device: Any = None) -> int:
    """Deprecated; see :func:`max_memory_reserved`."""
    warnings.warn("`torch.neuron.max_memory_cached` has been renamed to `torch.neuron.max_memory_reserved`",
                  FutureWarning, stacklevel=2)
    return max_memory_reserved(device)


def reset_max_memory_cached(device: Any = None) -> None:
    """Deprecated; resets all peak statistics, as :func:`reset_peak_memory_stats`."""
    warnings.warn("torch.neuron.reset_max_memory_cached now calls torch.neuron.reset_peak_memory_stats, "
                  "which resets /all/ peak memory stats.", FutureWarning, stacklevel=2)
    reset_peak_memory_stats(device)


def reset_peak_memory_stats(device: Any = None) -> None:
    """Resets the peak statistics to the current values."""
    _C._reset_peak_stats(_index(device))


def reset_max_memory_allocated(device: Any = None) -> None:
    """Same as reset_peak_memory_stats (kept for torch.cuda parity)."""
    reset_peak_memory_stats(device)


def reset_accumulated_memory_stats(device: Any = None) -> None:
    """Resets the accumulated (allocated/freed totals, retries, OOM) counters."""
    _C._reset_accumulated_stats(_index(device))


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes of the core's emulated HBM."""
    return tuple(_C._mem_get_info(_index(device)))  # type: ignore[return-value]


def _format_size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """A human-readable table of the allocator statistics of one core."""
    index = _index(device)
    stats = _C._memory_stats(index)
    rows = [
        ("Allocated memory", "allocated_bytes", True),
        ("Requested memory", "requested_bytes", True),
        ("Reserved memory", "reserved_bytes", True),
        ("Allocations", "allocation", False),
        ("Active allocs", "active", False),
        ("Segments", "segment", False),
    ]
    free, total = _C._mem_get_info(index)
    lines = [
        "=" * 75,
        f" neuron:{index} memory summary (capacity {_format_size(total)}, free {_format_size(free)})",
        "-" * 75,
        f" {'Metric':<22}{'Cur Usage':>13}{'Peak Usage':>13}{'Tot Alloc':>13}{'Tot Freed':>13}",
        "-" * 75,
    ]
    for label, key, is_bytes in rows:
        for pool in ("all",) if abbreviated else ("all", "large_pool", "small_pool"):
            s = stats[key][pool]
            fmt = _format_size if is_bytes else str
            name = label if pool == "all" else f"  from {pool.replace('_', ' ')}"
            lines.append(
                f" {name:<22}{fmt(s['current']):>13}{fmt(s['peak']):>13}"
                f"{fmt(s['allocated']):>13}{fmt(s['freed']):>13}"
            )
    lines += [
        "-" * 75,
        f" Alloc retries: {stats['num_alloc_retries']}    OOMs: {stats['num_ooms']}",
        "=" * 75,
    ]
    return "\n".join(lines) + "\n"
