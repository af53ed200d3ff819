"""``torch.compile(backend="neuron")`` on jagged nested tensors (NJTs): one executable per shape of
the NJT's values, matching CPU eager forward and backward, with no eager fallback."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from neuron_compile import metrics

_WIDTH = 16


def _projected(nested: torch.Tensor, linear: torch.nn.Linear) -> torch.Tensor:
    return F.gelu(linear(nested)).sin() * 2


def _attention(nested: torch.Tensor, qkv: torch.nn.Linear, out: torch.nn.Linear) -> torch.Tensor:
    def heads(t: torch.Tensor) -> torch.Tensor:  # (B, j, E) -> (B, H, j, E / H)
        return t.contiguous().unflatten(-1, (2, _WIDTH // 2)).transpose(1, 2)

    q, k, v = qkv(nested).chunk(3, dim=-1)
    attended = F.scaled_dot_product_attention(heads(q), heads(k), heads(v))
    return out(attended.transpose(1, 2).flatten(-2)).relu()


def _run(function, modules, lengths, device: str, compiled: bool) -> list[torch.Tensor]:
    """The output's values and every gradient, for one batch of sequences of ``lengths``."""
    modules = [module.to(device) for module in modules]
    generator = torch.Generator().manual_seed(sum(lengths))
    parts = [torch.randn(n, _WIDTH, generator=generator).to(device).requires_grad_() for n in lengths]
    nested = torch.nested.as_nested_tensor(parts, layout=torch.jagged)
    fn = torch.compile(function, backend="neuron") if compiled else function
    out = fn(nested, *modules)
    assert out.is_nested and out.device.type == device
    (out.values() ** 2).sum().backward()
    grads = [part.grad for part in parts] + [p.grad for module in modules for p in module.parameters()]
    return [t.detach().cpu() for t in (out.values(), *grads)]


def _modules(*shapes: tuple[int, int]) -> list[torch.nn.Linear]:
    """The same weights on every call."""
    torch.manual_seed(0)
    return [torch.nn.Linear(*shape) for shape in shapes]


def _check_matches_cpu(function, shapes, batches) -> None:
    for lengths in batches:
        expected = _run(function, _modules(*shapes), lengths, "cpu", compiled=False)
        got = _run(function, _modules(*shapes), lengths, "neuron", compiled=True)
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


def test_pointwise_and_linear_graphs_on_jagged_tensors_compile(fresh_compiler):
    # Failed with NeuronCompileError: AOTAutograd passes the NJT's ragged size to the graph as
    # a "nested int", which has no value; and the lowering of a new shape, which runs at the
    # call under AOTAutograd's first-call alias-analysis mode, traced under that mode (seen
    # only when Inductor's own caches miss, so they are off here).
    with torch._inductor.config.patch(fx_graph_cache=False):
        _check_matches_cpu(_projected, [(_WIDTH, _WIDTH)], [(3, 5), (4, 7, 2), (3, 5)])
    counters = metrics.counters()
    assert counters["eager_fallbacks"] == 0 and counters["compilations"] >= 2, counters
    # (3, 5) twice: its executables are reused, not compiled again
    assert counters["compilations"] + counters["memory_hits"] + counters["persistent_hits"] == counters["graphs"]


def test_attention_on_jagged_tensors_in_a_compiled_function_matches_the_cpu(fresh_compiler):
    # Failed with "operator aten::stride does not exist": Dynamo traced the runtime's NJT
    # attention while compiling, baked in torch's path, and then ran that path eagerly on
    # neuron after the graph break torch's NJT attention always causes.
    _check_matches_cpu(_attention, [(_WIDTH, 3 * _WIDTH), (_WIDTH, _WIDTH)], [(3, 5), (6, 2, 4)])
    assert metrics.counters()["eager_fallbacks"] == 0
