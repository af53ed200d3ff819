"""``torch.compile(model)`` (the default backend, Inductor) on neuron tensors uses the neuron compiler."""

from __future__ import annotations

import copy

import warnings

import pytest
import torch

from conftest import run_python
from neuron_compile import metrics


def test_import_torch_routes_without_importing_the_compiler():
    out = run_python("""
        import sys, torch
        print(getattr(torch._TorchCompileInductorWrapper.__call__, "_neuron_compile_routes_neuron_graphs", False),
              "torch._dynamo" in sys.modules, "neuron_compile.backend" in sys.modules)
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["True", "False", "False"]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4))


def test_default_backend_training_on_neuron_matches_cpu(fresh_compiler):
    cpu = _model()
    neuron = copy.deepcopy(cpu).to("neuron")
    x = torch.randn(8, 16)
    losses = []
    for model, inputs in ((cpu, x), (neuron, x.to("neuron"))):
        loss = torch.compile(model)(inputs).pow(2).mean()
        loss.backward()
        losses.append(loss)
    assert losses[1].device.type == "neuron"
    torch.testing.assert_close(losses[1].cpu(), losses[0], rtol=1e-5, atol=1e-6)
    for a, b in zip(cpu.parameters(), neuron.parameters()):
        assert b.grad.device.type == "neuron"
        torch.testing.assert_close(b.grad.cpu(), a.grad, rtol=1e-5, atol=1e-6)
    # the neuron model's graphs were compiled by the neuron compiler; the CPU model's by Inductor
    assert metrics.counters()["compilations"] >= 1


def test_default_backend_leaves_cpu_graphs_to_inductor(fresh_compiler):
    out = torch.compile(lambda t: (t * 2 + 1).sin())(torch.randn(5))
    assert out.device.type == "cpu"
    assert metrics.counters()["graphs"] == 0


def test_graph_creating_neuron_tensors_without_neuron_inputs(fresh_compiler):
    make = torch.compile(lambda: torch.ones(3, device="neuron") * 2)
    assert torch.equal(make().cpu(), torch.full((3,), 2.0))
    assert metrics.counters()["graphs"] == 1


def test_inductor_settings_on_neuron_name_themselves_and_the_fix(fresh_compiler):
    compiled = torch.compile(lambda t: t + 1, options={"epilogue_fusion": False})
    with pytest.raises(Exception, match=r"neuron compiler.*'epilogue_fusion'.*backend='neuron'"):
        compiled(torch.ones(2, device="neuron"))


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"])
def test_torch_compile_modes_compile_neuron_graphs(fresh_compiler, mode, monkeypatch):
    """As CPU Inductor ignores CUDA graphs for CPU graphs (transformers' CompileConfig defaults
    to mode='reduce-overhead' with the default backend)."""
    from neuron_compile import options

    monkeypatch.setattr(options, "_warned_autotune", False)
    compiled = torch.compile(lambda t: t * 3 + 1, mode=mode)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = compiled(torch.ones(2, device="neuron"))
    assert torch.equal(out.cpu(), torch.full((2,), 4.0))
    assert metrics.counters()["compilations"] == 1
    autotune_warnings = [w for w in caught if "autotuning" in str(w.message)]
    assert len(autotune_warnings) == (1 if mode.startswith("max-autotune") else 0)
