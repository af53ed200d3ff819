"""torch.compile(optimizer.step, backend="neuron"): graphs that read and update tensors held as
graph attributes (Dynamo installs an optimizer's parameters and state that way)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.fx

from conftest import run_python_lines
from neuron_compile import metrics
from neuron_compile._graph_attributes import lift_tensor_attributes


def _train(device: str, steps: int, compiled: bool, **optimizer_options):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    model = copy.deepcopy(model).to(device)
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, **optimizer_options)
    step = torch.compile(optimizer.step, backend="neuron") if compiled else optimizer.step
    for _ in range(steps):
        optimizer.zero_grad()
        model(x).square().mean().backward()
        step()
    return model, optimizer


@pytest.mark.parametrize("foreach", [False, True])
def test_compiled_adamw_step_updates_the_parameters_and_state_in_place(fresh_compiler, foreach):
    reference, reference_optimizer = _train("cpu", 3, compiled=False, foreach=foreach)
    model, optimizer = _train("neuron", 3, compiled=True, foreach=foreach)
    assert metrics.counters()["compilations"] >= 1
    for expected, got in zip(reference.parameters(), model.parameters()):
        assert got.device.type == "neuron"
        torch.testing.assert_close(got.detach().cpu(), expected.detach(), rtol=1e-5, atol=1e-6)
    for expected, got in zip(reference_optimizer.state.values(), optimizer.state.values()):
        torch.testing.assert_close(got["exp_avg_sq"].cpu(), expected["exp_avg_sq"], rtol=1e-5, atol=1e-8)
        assert got["exp_avg"].device.type == "neuron"


def test_attribute_values_are_read_at_call_time_not_baked_into_the_program(fresh_compiler):
    """The same compiled step keeps working after the state it reads changes (no recompile)."""
    model, optimizer = _train("neuron", 2, compiled=True, foreach=False)
    compilations = metrics.counters()["compilations"]
    reference, reference_optimizer = _train("cpu", 2, compiled=False, foreach=False)
    step = torch.compile(optimizer.step, backend="neuron")
    with torch.no_grad():  # new values in the tensors the graph reads as attributes
        for p, q in zip(model.parameters(), reference.parameters()):
            p.mul_(0.5)
            q.mul_(0.5)
    for p, q in zip(model.parameters(), reference.parameters()):
        p.grad = torch.ones_like(p)
        q.grad = torch.ones_like(q)
    step()
    reference_optimizer.step()
    assert metrics.counters()["compilations"] == compilations
    for expected, got in zip(reference.parameters(), model.parameters()):
        torch.testing.assert_close(got.detach().cpu(), expected.detach(), rtol=1e-5, atol=1e-6)


def test_lift_turns_device_attributes_into_trailing_inputs():
    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(3, device="neuron"))
            self.host = torch.full((3,), 2.0)  # host tensors too (an optimizer's step counts)

    holder = Holder()
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    weight = graph.get_attr("weight")
    host = graph.get_attr("host")
    product = graph.call_function(torch.mul, (x, weight))
    graph.output(graph.call_function(torch.add, (product, graph.call_function(torch.sum, (host,)))))
    gm = torch.fx.GraphModule(holder, graph)
    lifted, values = lift_tensor_attributes(gm)
    kinds = [(n.op, n.target) for n in lifted.graph.nodes if n.op in ("placeholder", "get_attr")]
    assert kinds == [("placeholder", "x"), ("placeholder", "l_attr_weight"), ("placeholder", "l_attr_host")]
    assert values[0] is holder.weight and values[1] is holder.host
    x_value = torch.arange(3.0, device="neuron")
    torch.testing.assert_close(lifted(x_value, *values).cpu(), gm(x_value).cpu())
    plain = torch.fx.symbolic_trace(lambda a: a * 2)
    assert lift_tensor_attributes(plain) == (plain, [])


_PERSISTED = """
    import torch
    from neuron_compile import metrics
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4).to("neuron")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    step = torch.compile(optimizer.step, backend="neuron")
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(1)).to("neuron")
    for _ in range(3):
        optimizer.zero_grad()
        model(x).square().mean().backward()
        step()
    print("SOURCES", sorted({r.source for r in metrics.graphs()}))
    print("WEIGHT", repr(model.weight.sum().item()))
"""


def test_compiled_optimizer_step_persists_across_processes(tmp_path):
    env = {"TORCH_NEURONX_NEFF_CACHE_DIR": str(tmp_path / "neff")}
    cold, warm = (run_python_lines(_PERSISTED, env=env) for _ in range(2))
    assert "compiled" in cold["SOURCES"]
    assert "compiled" not in warm["SOURCES"] and "disk" in warm["SOURCES"]
    assert warm["WEIGHT"] == cold["WEIGHT"]


def _closure_step(device: str, backend: str, **options) -> torch.Tensor:
    torch._dynamo.reset()
    param = torch.rand(2, 3, generator=torch.Generator().manual_seed(0)).to(device).requires_grad_(True)

    def closure():  # a closure is a graph break inside step()
        param.grad = torch.ones_like(param) * 2
        return param.grad

    optimizer = torch.optim.AdamW([param], **options)
    torch.compile(lambda: optimizer.step(closure), backend=backend)()
    return param.detach().cpu()


@pytest.mark.parametrize("backend", ["eager", "neuron"])
def test_step_with_a_closure_compiles_with_neurons_default_foreach(fresh_compiler, backend):
    # Dynamo makes CUDA param groups capturable; without the same for neuron, the default
    # foreach AdamW failed tracing after the closure's graph break (a CPU scalars tensor)
    expected = _closure_step("cpu", "eager", foreach=False)
    torch.testing.assert_close(_closure_step("neuron", backend), expected, rtol=1e-6, atol=1e-7)


def test_compiled_training_keeps_one_step_tensor_on_the_device(fresh_compiler):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Sigmoid(), torch.nn.Linear(3, 1)).to("neuron")
    x = torch.rand(3, 2).to("neuron")
    optimizer = torch.optim.Adam(model.parameters())

    def loop() -> list[torch.Tensor]:
        steps = []
        for i in range(6):
            optimizer.zero_grad()
            if i != 3:  # no gradients: this step leaves the count alone
                model(x).sum().backward()
            optimizer.step()
            steps.append(optimizer.state[model[0].weight]["step"])
        return steps

    steps = torch.compile(loop, backend="eager")()
    assert steps[0].device.type == "neuron"
    assert all(step is steps[0] for step in steps)  # a CPU count was replaced by a device copy
    assert steps[0].item() == 5.0
