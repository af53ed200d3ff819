"""The metrics report: compilations, hits, graph breaks and recompilations with reasons."""

from __future__ import annotations

import torch

from neuron_compile import metrics


def test_report_names_graph_breaks_and_recompile_guards(fresh_compiler):
    from torch._dynamo.utils import counters

    counters.clear()

    def f(x):
        y = x.sin()
        torch._dynamo.graph_break()
        return y.cos()

    compiled = torch.compile(f, backend="neuron")
    with torch.no_grad():
        compiled(torch.randn(3, device="neuron"))
        compiled(torch.randn(5, device="neuron"))
    text = metrics.report()
    totals = metrics.counters()
    assert totals["graph_breaks"] >= 1
    assert "graph_break" in text or "graph break" in text.lower()
    assert totals["recompilations"] >= 1
    assert "size mismatch" in text  # the guard that failed
    assert totals["compilations"] == 4  # two graphs (around the break) x two shapes
    assert "compile time" in text and "persistent cache" in text


def test_inductors_kernel_count_is_replayed_when_an_executable_comes_from_memory(fresh_compiler):
    import torch._inductor.metrics as inductor_metrics

    def f(x):
        return x.sin() * 2 + x.cos().sum()

    x = torch.randn(8, device="neuron")
    counts = []
    for _ in range(3):
        torch._dynamo.reset()  # compiled again: the executable comes from this process's memory
        inductor_metrics.reset()
        torch.compile(f, backend="neuron")(x)
        counts.append(inductor_metrics.generated_kernel_count)
    assert counts[0] > 0 and counts == [counts[0]] * 3
    assert [record.source for record in metrics.graphs()] == ["compiled", "memory", "memory"]
