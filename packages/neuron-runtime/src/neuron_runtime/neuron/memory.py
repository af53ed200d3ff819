"""Memory statistics of the neuron caching allocator, in torch.cuda's format."""

from __future__ import annotations

import collections
from typing import Any

from neuron_runtime import _C

__all__ = [
    "empty_cache", "max_memory_allocated", "max_memory_reserved", "mem_get_info",
    "memory_allocated", "memory_reserved", "memory_stats", "memory_stats_as_nested_dict",
    "memory_summary", "reset_accumulated_memory_stats", "reset_max_memory_allocated",
    "reset_peak_memory_stats",
]


def _index(device: Any) -> int:
    from neuron_runtime.neuron import _device_index

    return _device_index(device)


def empty_cache() -> None:
    """Returns every cached, unused block to the host (memory_reserved drops)."""
    _C._empty_cache()


def memory_stats_as_nested_dict(device: Any = None) -> dict[str, Any]:
    """Allocator statistics as a nested dict (see torch.cuda.memory_stats)."""
    return _C._memory_stats(_index(device))


def memory_stats(device: Any = None) -> dict[str, Any]:
    """Allocator statistics, flattened to ``"allocated_bytes.all.current"``-style keys."""
    result: list[tuple[str, Any]] = []

    def flatten(prefix: str, obj: Any) -> None:
        if isinstance(obj, dict):
            for key, value in obj.items():
                flatten(f"{prefix}.{key}" if prefix else key, value)
        else:
            result.append((prefix, obj))

    flatten("", memory_stats_as_nested_dict(device))
    return collections.OrderedDict(sorted(result))


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
