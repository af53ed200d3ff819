"""What the neuron compiler did in this process, and a readable report of it.

Vocabulary: a *graph* is one Dynamo graph compiled for one input signature (sizes, strides,
dtypes); it reaches its executable by one of four *sources*: ``compiled`` (a cache miss, the
compiler ran), ``memory`` (compiled earlier in this process), ``disk`` (the persistent cache),
or ``eager`` (the compiler failed and ``fallback_to_eager`` ran the graph op by op). Graph
breaks and recompilations come from Dynamo's own records, so the report also explains *why* a
function produced the graphs it did.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from typing import Any

__all__ = ["GraphRecord", "graphs", "counters", "report", "reset"]


@dataclasses.dataclass(frozen=True)
class GraphRecord:
    """One graph the backend produced an executable for."""

    name: str
    signature: str
    source: str  # "compiled" | "memory" | "disk" | "eager"
    seconds: float  # compile time, or load time for cache hits
    key: str = ""
    reason: str = ""  # why the graph fell back to eager
    kernels: int = 0  # C++ kernels in the executable (fused loops); 0 for eager fallbacks


_lock = threading.Lock()
_records: list[GraphRecord] = []


def _record(record: GraphRecord) -> None:
    with _lock:
        _records.append(record)


def graphs() -> list[GraphRecord]:
    """Every graph this process compiled, loaded or ran eagerly, in order."""
    with _lock:
        return list(_records)


def counters() -> dict[str, Any]:
    """Totals: graphs by source, compile seconds, and the persistent cache's own counters."""
    records = graphs()
    by_source = collections.Counter(record.source for record in records)
    compiled = [record.seconds for record in records if record.source == "compiled"]
    totals: dict[str, Any] = {
        "graphs": len(records),
        "compilations": by_source["compiled"],
        "memory_hits": by_source["memory"],
        "persistent_hits": by_source["disk"],
        "misses": by_source["compiled"] + by_source["eager"],
        "eager_fallbacks": by_source["eager"],
        "compile_seconds_total": sum(compiled),
        "compile_seconds_max": max(compiled, default=0.0),
        "graph_breaks": sum(_graph_breaks().values()),
        "recompilations": len(_recompilations()),
    }
    return totals


def _graph_breaks() -> dict[str, int]:
    from torch._dynamo.utils import counters as dynamo_counters

    return dict(dynamo_counters["graph_break"])


def _recompilations() -> list[tuple[str, str]]:
    from torch._dynamo.utils import get_compilation_metrics

    return [(f"{m.co_name} [{m.compile_id}]", m.recompile_reason.strip())
            for m in get_compilation_metrics() if m.recompile_reason]


def reset() -> None:
    """Forgets the records (not the compiled graphs, nor Dynamo's own counters)."""
    with _lock:
        _records.clear()


def report() -> str:
    """A multi-line report: totals, each graph, graph breaks and recompilations with reasons."""
    totals = counters()
    lines = ["neuron compiler",
             f"  graphs: {totals['graphs']}  compiled: {totals['compilations']}  "
             f"in-memory hits: {totals['memory_hits']}  persistent hits: {totals['persistent_hits']}  "
             f"misses: {totals['misses']}  eager fallbacks: {totals['eager_fallbacks']}",
             f"  compile time: total {totals['compile_seconds_total']:.2f} s, "
             f"max {totals['compile_seconds_max']:.2f} s per graph"]
    try:
        from neuron_compile.cache import default_cache

        cache = default_cache()
        stats = cache.stats()
        lines.append(f"  persistent cache: {cache.location}  "
                     + "  ".join(f"{k}: {v}" for k, v in dataclasses.asdict(stats).items()))
    except Exception as error:  # the report must not fail because of the cache's environment
        lines.append(f"  persistent cache: unavailable ({error})")
    records = graphs()
    if records:
        lines.append("  graphs (name, inputs, source, compile or load time, fused kernels):")
        for record in records:
            extra = f"  ({record.reason})" if record.reason else ""
            lines.append(f"    {record.name}  {record.signature}  {record.source}  "
                         f"{record.seconds:.3f} s  {record.kernels} kernels{extra}")
    breaks = _graph_breaks()
    lines.append(f"  graph breaks: {sum(breaks.values())}")
    lines += [f"    {count} x {reason}" for reason, count in breaks.items()]
    recompiles = _recompilations()
    lines.append(f"  recompilations: {len(recompiles)}")
    lines += [f"    {where}: {reason}" for where, reason in recompiles]
    return "\n".join(lines)
