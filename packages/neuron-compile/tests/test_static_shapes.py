"""One graph per input signature; dynamic=True coerced to per-shape graphs; churn warning."""

from __future__ import annotations

import warnings

import pytest
import torch

from neuron_compile import metrics
from neuron_compile._diagnostics import ShapeChurnWarning


def _f(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x * 3, dim=-1).sum(-1)


def _graphs_by_shape() -> list[str]:
    return [record.signature for record in metrics.graphs()]


@pytest.mark.parametrize("dynamic", [False, None])
def test_each_distinct_shape_is_one_counted_graph(fresh_compiler, dynamic):
    compiled = torch.compile(_f, backend="neuron", dynamic=dynamic)
    lengths = [5, 7, 5, 9, 7, 5]
    with torch.no_grad():
        for n in lengths:
            x = torch.randn(2, n, device="neuron")
            torch.testing.assert_close(compiled(x).cpu(), _f(x.cpu()), rtol=1e-5, atol=1e-5)
    assert _graphs_by_shape() == ["x=2x5", "x=2x7", "x=2x9"]
    assert metrics.counters()["compilations"] == 3


@pytest.mark.parametrize("device", ["cpu", "neuron"])
def test_other_backends_keep_automatic_dynamic_shapes(fresh_compiler, device):
    # The static policy was applied to every Dynamo compilation in the process once the neuron
    # backend had loaded: another backend recompiled for every new length (found by PyTorch's
    # test_nestedtensor.py). It now applies only to graphs the neuron compiler gets.
    from torch._dynamo.testing import CompileCounter

    torch.compile(_f, backend="neuron")(torch.randn(2, 3, device=device))  # loads the policy
    counter = CompileCounter()
    other = torch.compile(lambda x: x * 2, backend=counter)
    for n in (18, 19, 20):
        other(torch.randn(n, 4, device=device))
    assert counter.frame_count == 2  # the second length made the size dynamic; the third reused it
    neuron = torch.compile(lambda x: x * 3, backend="neuron")
    for n in (18, 19, 20):
        neuron(torch.randn(n, 4, device=device))
    assert [r.signature for r in metrics.graphs()][-3:] == ["x=18x4", "x=19x4", "x=20x4"]


def test_dynamic_true_is_coerced_to_static_graphs_with_one_warning(fresh_compiler):
    compiled = torch.compile(_f, backend="neuron", dynamic=True)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for n in (4, 6, 4):
            compiled(torch.randn(3, n, device="neuron"))
    coercions = [w for w in caught if "dynamic=True" in str(w.message)]
    assert len(coercions) == 1
    assert "one graph per input shape" in str(coercions[0].message)
    assert _graphs_by_shape() == ["x=3x4", "x=3x6"]


@pytest.mark.parametrize("enable_gqa", [False, True])
def test_dynamic_true_traces_attention(fresh_compiler, enable_gqa):
    # Dynamo traces with symbolic sizes; neuron's SDPA kernel choice built host views of its
    # inputs, which symbolic sizes do not have ("Expected !size_bytes_is_heap_allocated_").
    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=enable_gqa)

    compiled = torch.compile(attention, backend="neuron", dynamic=True)
    kv_heads = 2 if enable_gqa else 4
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the dynamic=True coercion notice
        for length in (8, 12):
            q = torch.randn(2, 4, length, 8, device="neuron")
            k, v = (torch.randn(2, kv_heads, length, 8, device="neuron") for _ in range(2))
            torch.testing.assert_close(compiled(q, k, v).cpu(), attention(q.cpu(), k.cpu(), v.cpu()))


def test_recompile_limit_fits_the_default_bucket_policy():
    import neuron_compile.backend  # noqa: F401  (raising the limit is part of loading the backend)

    assert torch._dynamo.config.recompile_limit >= 16


def test_many_shapes_warn_once_naming_the_changing_dimension(fresh_compiler):
    compiled = torch.compile(_f, backend="neuron", dynamic=False, options={"graph_warning_threshold": 3})
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for n in (3, 4, 5, 6, 7):
            compiled(torch.randn(2, n, device="neuron"))
    churn = [w for w in caught if issubclass(w.category, ShapeChurnWarning)]
    assert len(churn) == 1
    message = str(churn[0].message)
    assert "input 'x' dimension 1" in message
    assert "MultipleOfBuckets" in message
    assert "4 graphs" in message


def test_same_graph_again_is_an_in_memory_hit(fresh_compiler):
    with torch.no_grad():
        torch.compile(_f, backend="neuron")(torch.randn(2, 3, device="neuron"))
        torch._dynamo.reset()
        torch.compile(_f, backend="neuron")(torch.randn(2, 3, device="neuron"))
    assert [r.source for r in metrics.graphs()] == ["compiled", "memory"]
