"""One report for the whole stack: eager fallbacks, compilation, the compile cache, memory per core.

``torch_neuronx.metrics.report()`` is the emulator's answer to torch_xla's
``metrics_report()`` and TorchNeuron's ``metrics.report()``; ``counters()`` gives the same
figures as a dictionary for programs and tests.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["counters", "report"]


def _memory_per_core() -> list[dict[str, Any]]:
    if not torch.neuron.is_initialized():  # reporting must not initialise the device
        return []
    cores = []
    for index in range(torch.neuron.device_count()):
        stats = torch.neuron.memory_stats(index)
        free, total = torch.neuron.mem_get_info(index)
        cores.append({
            "core": index,
            "allocated": stats.get("allocated_bytes.all.current", 0),
            "peak": stats.get("allocated_bytes.all.peak", 0),
            "reserved": stats.get("reserved_bytes.all.current", 0),
            "capacity": total,
            "ooms": stats.get("num_ooms", 0),
        })
    return cores


def counters() -> dict[str, Any]:
    """Eager, compile and memory figures of this process, as plain data."""
    from neuron_compile import metrics as compile_metrics
    from neuron_runtime import get_fallback_ops, get_float64_ops

    return {
        "eager_copy_fallbacks": get_fallback_ops(),
        "float64_ops": get_float64_ops(),
        "compile": compile_metrics.counters(),
        "memory": _memory_per_core(),
    }


def _mib(value: int) -> str:
    return f"{value / 2**20:,.1f} MiB"


def report() -> str:
    """A readable multi-line report of everything :func:`counters` holds, with reasons."""
    from neuron_compile import metrics as compile_metrics

    figures = counters()
    fallbacks = figures["eager_copy_fallbacks"]
    float64 = figures["float64_ops"]
    lines = ["torch-neuronx metrics",
             f"eager: ops that needed a copy to the host: {sum(fallbacks.values())}"
             + (f" ({', '.join(f'{op} x{n}' for op, n in sorted(fallbacks.items()))})" if fallbacks else ""),
             f"eager: float64 ops (no float64 on Trainium): {sum(float64.values())}"
             + (f" ({', '.join(f'{op} x{n}' for op, n in sorted(float64.items()))})" if float64 else "")]
    lines += compile_metrics.report().splitlines()
    # Under torchrun every rank is its own process: it can only speak for the cores it used.
    lines.append("memory per core, this process (allocated / peak / reserved of capacity, OOMs):")
    if not figures["memory"]:
        lines.append("  device not initialised")
    current = _current_core()
    used = [c for c in figures["memory"] if c["peak"] or c["reserved"] or c["ooms"] or c["core"] == current]
    for core in used:
        lines.append(f"  neuron:{core['core']}  {_mib(core['allocated'])} / {_mib(core['peak'])} / "
                     f"{_mib(core['reserved'])} of {_mib(core['capacity'])}, OOMs {core['ooms']}")
    if figures["memory"] and len(used) < len(figures["memory"]):
        lines.append(f"  ({len(figures['memory']) - len(used)} other cores not used by this process)")
    return "\n".join(lines)


def _current_core() -> int | None:
    try:
        return torch.neuron.current_device()
    except Exception:  # noqa: BLE001 - a report never fails
        return None
