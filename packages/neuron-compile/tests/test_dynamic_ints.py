"""Python ints that change between calls: run-time arguments, tensor shapes still static."""

from __future__ import annotations

import pytest
import torch

from neuron_compile import backend, metrics


def _scale(x: torch.Tensor, n: int) -> torch.Tensor:
    return x * n + (n - 1)


def _ones_of(x: torch.Tensor, n: int) -> torch.Tensor:
    return x.sum() + torch.ones(n, device=x.device).cumsum(0)


def _pick(x: torch.Tensor, n: int) -> torch.Tensor:
    return x[n] * 2


@pytest.fixture(autouse=True)
def _fresh_dynamo_records():
    torch._dynamo.utils.clear_compilation_metrics()  # the recompilation count is process-wide
    yield


def _dynamo_recompiles() -> int:
    return metrics.counters()["recompilations"]


def test_a_changing_int_becomes_one_executable_argument(fresh_compiler):
    compiled = torch.compile(_scale, backend="neuron")
    x = torch.randn(4, 8, device="neuron")
    with torch.no_grad():
        for n in (3, 4, 7, 11, 4, 250):
            torch.testing.assert_close(compiled(x, n).cpu(), _scale(x.cpu(), n), rtol=0, atol=0)
    # the first value is specialised (Dynamo's default); from the first change on, one graph
    assert metrics.counters()["graphs"] == 2
    assert _dynamo_recompiles() == 1
    assert [record.signature for record in metrics.graphs()] == ["x=4x8", "x=4x8 n=int"]


def test_the_run_time_int_executable_is_loaded_from_the_persistent_cache(fresh_compiler):
    compiled = torch.compile(_scale, backend="neuron")
    x = torch.randn(5, device="neuron")
    with torch.no_grad():
        compiled(x, 3), compiled(x, 4)
        torch._dynamo.reset()
        backend._forget_compiled()
        metrics.reset()
        compiled = torch.compile(_scale, backend="neuron")
        compiled(x, 5)
        result = compiled(x, 6)  # symbolic again: the same key as the first process's
    torch.testing.assert_close(result.cpu(), _scale(x.cpu(), 6))
    assert metrics.counters()["persistent_hits"] == 1
    assert metrics.counters()["compilations"] == 1  # only the specialised first value


def test_an_int_that_sizes_a_tensor_compiles_per_value_without_retracing(fresh_compiler):
    compiled = torch.compile(_ones_of, backend="neuron")
    x = torch.randn(3, device="neuron")
    lengths = (2, 5, 9, 5, 2)
    with torch.no_grad():
        for n in lengths:
            torch.testing.assert_close(compiled(x, n).cpu(), _ones_of(x.cpu(), n))
    # the first call's graph (n a constant), then one per length: shapes stay static
    assert metrics.counters()["graphs"] == 1 + len(set(lengths))
    assert _dynamo_recompiles() == 1


def _window(x: torch.Tensor, n: int) -> torch.Tensor:
    return x[:, n:n + 2] * 2


def test_an_int_index_is_a_run_time_argument_within_dynamos_bounds(fresh_compiler):
    compiled = torch.compile(_pick, backend="neuron")
    x = torch.randn(6, 3, device="neuron")
    values = (1, 2, 5, -1, -6, 3, 0, -3, 4)
    with torch.no_grad():
        for n in values:
            torch.testing.assert_close(compiled(x, n).cpu(), _pick(x.cpu(), n))
    # Dynamo guards the index's range (negative indices are another trace); within a range
    # the lowering knows the index is in bounds, so one executable serves every value
    signatures = [record.signature for record in metrics.graphs()]
    assert signatures.count("x=6x3 n=int") == len(signatures) - 1 < len(values) - 3, signatures


def test_slicing_at_an_int_offset_matches_eager(fresh_compiler):
    compiled = torch.compile(_window, backend="neuron")
    x = torch.randn(6, 6, device="neuron")
    with torch.no_grad():
        for n in (1, 2, 4, 3, 0, 2):
            torch.testing.assert_close(compiled(x, n).cpu(), _window(x.cpu(), n))
    assert metrics.counters()["graphs"] == 2


def test_dynamic_false_still_specialises_ints(fresh_compiler):
    compiled = torch.compile(_scale, backend="neuron", dynamic=False)
    x = torch.randn(4, device="neuron")
    with torch.no_grad():
        for n in (3, 4, 5):
            torch.testing.assert_close(compiled(x, n).cpu(), _scale(x.cpu(), n))
    assert _dynamo_recompiles() == 2


def test_tensor_shapes_stay_static_under_the_default_dynamic(fresh_compiler):
    compiled = torch.compile(_scale, backend="neuron")
    with torch.no_grad():
        for length in (4, 6, 8):
            compiled(torch.randn(length, device="neuron"), 3)
    assert [record.signature for record in metrics.graphs()] == ["x=4", "x=6", "x=8"]  # n=3: a constant


def test_training_with_a_changing_int_matches_eager(fresh_compiler):
    torch.manual_seed(0)
    linear = torch.nn.Linear(8, 8)
    reference = torch.nn.Linear(8, 8)
    reference.load_state_dict(linear.state_dict())
    linear.to("neuron")

    def step(module: torch.nn.Module, x: torch.Tensor, n: int) -> torch.Tensor:
        return (module(x) * n).pow(2).mean()

    compiled = torch.compile(step, backend="neuron")
    for n in (2, 3, 4, 5):
        x = torch.randn(4, 8)
        compiled(linear, x.to("neuron"), n).backward()
        step(reference, x, n).backward()
    torch.testing.assert_close(linear.weight.grad.cpu(), reference.weight.grad, rtol=1e-5, atol=1e-6)
    assert _dynamo_recompiles() == 1


@pytest.mark.parametrize("n", [0, 1])
def test_zero_and_one_after_the_first_change(fresh_compiler, n):
    compiled = torch.compile(_scale, backend="neuron")
    x = torch.randn(3, device="neuron")
    with torch.no_grad():
        compiled(x, 7), compiled(x, 8)
        torch.testing.assert_close(compiled(x, n).cpu(), _scale(x.cpu(), n))


def test_an_int_the_lowering_guards_on_gets_one_executable_per_value(fresh_compiler, monkeypatch):
    from neuron_compile import _lowering
    from neuron_compile._dynamism import IntsSpecialised

    def guarded(shape_env, ints):  # as if Inductor had guarded on the int's value
        if ints:
            raise IntsSpecialised("guard on the value")

    monkeypatch.setattr(_lowering, "_check_ints_unspecialised", guarded)
    compiled = torch.compile(_scale, backend="neuron")
    x = torch.randn(4, device="neuron")
    with torch.no_grad():
        for n in (3, 4, 5, 4):
            torch.testing.assert_close(compiled(x, n).cpu(), _scale(x.cpu(), n))
    assert [record.signature for record in metrics.graphs()] == ["x=4", "x=4 n=4", "x=4 n=5"]
    assert _dynamo_recompiles() == 1  # still no trace per value


def test_an_int_that_sizes_tensors_names_itself_in_the_churn_warning(fresh_compiler):
    import warnings

    from neuron_compile._diagnostics import ShapeChurnWarning

    compiled = torch.compile(_ones_of, backend="neuron", options={"graph_warning_threshold": 3})
    x = torch.randn(3, device="neuron")
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for n in (2, 3, 4, 5, 6):
            compiled(x, n)
    churn = [str(w.message) for w in caught if issubclass(w.category, ShapeChurnWarning)]
    assert len(churn) == 1
    assert "int argument 'n' took" in churn[0] and "sizes a tensor" in churn[0], churn[0]
