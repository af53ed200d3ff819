"""Python floats that change between calls: one executable takes any value, as on other backends."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from neuron_compile import backend, metrics


def _affine(x: torch.Tensor, scale: float) -> torch.Tensor:
    return x * scale + (scale - 1.0)


@pytest.fixture(autouse=True)
def _fresh_dynamo_records():
    torch._dynamo.utils.clear_compilation_metrics()  # the recompilation count is process-wide
    yield


def test_a_changing_float_becomes_one_executable_argument(fresh_compiler):
    compiled = torch.compile(_affine, backend="neuron")
    x = torch.randn(4, 8, device="neuron")
    with torch.no_grad():
        for scale in (0.5, 1.5, -2.25, 1e-3, 0.5, 7.0):
            torch.testing.assert_close(compiled(x, scale).cpu(), _affine(x.cpu(), scale))
    # the first value is specialised (Dynamo's default); from the first change on, one graph
    assert [record.signature for record in metrics.graphs()] == ["x=4x8", "x=4x8 scale=float"]
    assert metrics.counters()["recompilations"] == 1


def test_dynamic_false_still_specialises_floats(fresh_compiler):
    compiled = torch.compile(_affine, backend="neuron", dynamic=False)
    x = torch.randn(4, device="neuron")
    with torch.no_grad():
        for scale in (0.5, 1.5, 2.5):
            torch.testing.assert_close(compiled(x, scale).cpu(), _affine(x.cpu(), scale))
    assert metrics.counters()["graphs"] == 3


def test_nan_and_inf_after_the_first_change_match_eager(fresh_compiler):
    compiled = torch.compile(_affine, backend="neuron")
    x = torch.randn(5, device="neuron")
    with torch.no_grad():
        for scale in (0.5, 1.5, math.inf, -math.inf, math.nan, 2.0):
            torch.testing.assert_close(compiled(x, scale).cpu(), _affine(x.cpu(), scale), equal_nan=True)


def test_the_float_executable_is_loaded_from_the_persistent_cache(fresh_compiler):
    compiled = torch.compile(_affine, backend="neuron")
    x = torch.randn(5, device="neuron")
    with torch.no_grad():
        compiled(x, 0.5), compiled(x, 0.25)
        torch._dynamo.reset()
        backend._forget_compiled()
        metrics.reset()
        compiled = torch.compile(_affine, backend="neuron")
        compiled(x, 0.75)
        result = compiled(x, 3.5)
    torch.testing.assert_close(result.cpu(), _affine(x.cpu(), 3.5))
    assert metrics.counters()["persistent_hits"] == 1
    assert metrics.counters()["compilations"] == 1  # only the specialised first value


def test_training_with_a_changing_loss_scale_matches_eager(fresh_compiler):
    torch.manual_seed(0)
    reference = torch.nn.Linear(6, 3)
    model = copy.deepcopy(reference).to("neuron")

    def loss_of(module: torch.nn.Module, batch: torch.Tensor, scale: float) -> torch.Tensor:
        return (module(batch) * scale).square().mean()

    compiled = torch.compile(loss_of, backend="neuron")
    for scale in (1.0, 0.5, 0.125, 2.0):
        batch = torch.randn(4, 6)
        loss_of(reference, batch, scale).backward()
        compiled(model, batch.to("neuron"), scale).backward()
    for expected, actual in zip(reference.parameters(), model.parameters()):
        torch.testing.assert_close(actual.grad.cpu(), expected.grad)
    assert metrics.counters()["recompilations"] == 1


def test_a_compiled_optimizer_step_under_a_scheduler_compiles_twice_not_per_step(fresh_compiler):
    """A Python float learning rate that a scheduler moves every step (PyTorch's usual recipe)."""
    torch.manual_seed(0)
    reference = torch.nn.Linear(4, 4)
    model = copy.deepcopy(reference).to("neuron")

    def optimizer_and_scheduler(module: torch.nn.Module):
        optimizer = torch.optim.Adam(module.parameters(), lr=0.01, foreach=False)
        return optimizer, torch.optim.lr_scheduler.LinearLR(optimizer, 1.0, 0.1, total_iters=10)

    reference_opt, reference_sched = optimizer_and_scheduler(reference)
    opt, sched = optimizer_and_scheduler(model)
    step = torch.compile(opt.step, backend="neuron")
    for _ in range(6):
        batch = torch.randn(2, 4)
        reference(batch).sum().backward()
        reference_opt.step(), reference_sched.step(), reference_opt.zero_grad()
        model(batch.to("neuron")).sum().backward()
        step(), sched.step(), opt.zero_grad()
    for expected, actual in zip(reference.parameters(), model.parameters()):
        torch.testing.assert_close(actual.detach().cpu(), expected.detach())
    assert metrics.counters()["compilations"] == 2  # lr a constant, then lr a run-time float
    assert metrics.graphs()[-1].signature.startswith("self_param_groups_0_lr=float")
