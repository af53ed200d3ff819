"""Inductor's generated-code hook hears about every executable, including those served from memory."""

from __future__ import annotations

import torch
from torch._inductor.utils import run_and_get_code

from neuron_compile import metrics


def _f(x):
    return (x.sin() + 1).relu()


def test_run_and_get_code_reports_executables_served_from_memory(fresh_compiler):
    x = torch.randn(8, device="neuron")
    # run_and_get_code resets Dynamo first; the second call is served from this process's memory
    first_result, first = run_and_get_code(torch.compile(_f, backend="neuron"), x)
    again_result, again = run_and_get_code(torch.compile(_f, backend="neuron"), x)
    assert [r.source for r in metrics.graphs()] == ["compiled", "memory"]
    assert len(first) == 1 and "cpp_fused" in first[0]
    assert again == first
    torch.testing.assert_close(again_result, first_result)


def test_training_graphs_report_forward_and_backward_code_again(fresh_compiler):
    x = torch.randn(4, 8, device="neuron", requires_grad=True)

    def step():
        out = torch.compile(_f, backend="neuron")(x)
        out.sum().backward()
        return out

    _, first = run_and_get_code(step)
    _, again = run_and_get_code(step)
    assert len(first) == 2  # forward and backward programs
    assert again == first


def test_nothing_is_reported_when_no_hook_is_set(fresh_compiler):
    from torch._inductor.graph import GraphLowering

    x = torch.randn(8, device="neuron")
    torch.compile(_f, backend="neuron")(x)
    torch._dynamo.reset()
    torch.compile(_f, backend="neuron")(x)
    assert GraphLowering.save_output_code is None
