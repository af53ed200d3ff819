"""Compiled autograd with the neuron compiler: its backward graphs take the saved tensors as one
list input, which the compiler flattens (see neuron_compile._sequence_inputs)."""

from __future__ import annotations

import copy
import operator

import pytest
import torch
import torch.fx

from neuron_compile import metrics
from neuron_compile._sequence_inputs import UnflattenableInput, flatten_sequence_inputs


def _grads(device: str, compiled: bool) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    model = copy.deepcopy(model).to(device)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1)).to(device)
    forward = torch.compile(model, backend="neuron") if compiled else model
    for _ in range(2):
        if compiled:
            with torch._dynamo.compiled_autograd._enable(torch.compile(backend="neuron")):
                forward(x).square().sum().backward()
        else:
            forward(x).square().sum().backward()
    return [p.grad.cpu() for p in model.parameters()]


def test_compiled_autograd_backward_matches_cpu_eager(fresh_compiler):
    expected = _grads("cpu", compiled=False)
    got = _grads("neuron", compiled=True)
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)
    names = [record.name for record in metrics.graphs()]
    assert any(name.startswith("forward[!") for name in names), names  # compiled autograd's graph


def test_flatten_replaces_a_list_input_by_its_items():
    graph = torch.fx.Graph()
    items = graph.placeholder("items")
    scale = graph.placeholder("scale")
    first = graph.call_function(operator.getitem, (items, 0))
    second = graph.call_function(operator.getitem, (items, -1))
    graph.output(graph.call_function(torch.add, (first, graph.call_function(torch.mul, (second, scale)))))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    a, b = torch.ones(3), torch.arange(3.0)
    flat_gm, flatten = flatten_sequence_inputs(gm, [[a, b], 2.0])
    assert [n.name for n in flat_gm.graph.find_nodes(op="placeholder")] == ["items_0", "items_1", "scale"]
    assert flatten([[a, b], 2.0]) == [a, b, 2.0]
    torch.testing.assert_close(flat_gm(*flatten([[a, b], 2.0])), gm([a, b], 2.0))

    whole = torch.fx.Graph()
    listed = whole.placeholder("items")
    whole.output(whole.call_function(torch.stack, (listed,)))
    with pytest.raises(UnflattenableInput, match="'items'.*not only by indexing"):
        flatten_sequence_inputs(torch.fx.GraphModule(torch.nn.Module(), whole), [[a, b]])
