"""Bad options and graphs the compiler cannot handle: clear errors, or eager by request."""

from __future__ import annotations

import pytest
import torch

from neuron_compile import NeuronCompileError, metrics

_lib = torch.library.Library("neuron_compile_test", "DEF")
_lib.define("unlowerable(Tensor x) -> Tensor")


@torch.library.impl(_lib, "unlowerable", "CompositeExplicitAutograd")
def _unlowerable(x):
    return x * 2


@torch.library.register_fake("neuron_compile_test::unlowerable")
def _unlowerable_fake(x):
    return torch.empty_like(x)


def _install_failing_lowering():
    from torch._inductor.lowering import register_lowering

    @register_lowering(torch.ops.neuron_compile_test.unlowerable.default)
    def _fails(x):
        raise NotImplementedError("no neuron lowering for this operator")


_install_failing_lowering()


def _uses_unlowerable(x):
    return torch.ops.neuron_compile_test.unlowerable(x + 1) - 1


def test_uncompilable_graph_raises_naming_the_operator(fresh_compiler):
    compiled = torch.compile(_uses_unlowerable, backend="neuron")
    with pytest.raises(Exception) as info, torch.no_grad():
        compiled(torch.ones(4, device="neuron"))
    message = str(info.value)  # Dynamo wraps backend errors; the message is ours
    assert "NeuronCompileError" in message or isinstance(info.value, NeuronCompileError)
    assert "at operator neuron_compile_test.unlowerable" in message
    assert "fallback_to_eager" in message


def test_fallback_to_eager_runs_the_graph_and_counts_it(fresh_compiler):
    compiled = torch.compile(_uses_unlowerable, backend="neuron", options={"fallback_to_eager": True})
    with pytest.warns(UserWarning, match="running this graph eagerly"), torch.no_grad():
        out = compiled(torch.ones(4, device="neuron"))
    torch.testing.assert_close(out.cpu(), torch.full((4,), 3.0))
    assert metrics.counters()["eager_fallbacks"] == 1
    [record] = metrics.graphs()
    assert record.source == "eager" and "unlowerable" in record.reason
    assert "eager fallbacks: 1" in metrics.report()


@pytest.mark.parametrize("options, match", [
    ({"not_an_option": 1}, "unsupported option 'not_an_option'"),
    ({"fallback_to_eager": "yes"}, "must be bool"),
    ({"graph_warning_threshold": 0}, "at least 1"),
])
def test_unsupported_options_are_named(fresh_compiler, options, match):
    compiled = torch.compile(lambda x: x + 1, backend="neuron", options=options)
    with pytest.raises(Exception, match=match):
        compiled(torch.ones(2, device="neuron"))


def test_modes_compile_as_default_and_unknown_modes_are_refused(fresh_compiler, monkeypatch):
    from neuron_compile import options

    monkeypatch.setattr(options, "_warned_autotune", False)
    out = torch.compile(lambda x: x + 1, backend="neuron", mode="reduce-overhead")(torch.ones(2, device="neuron"))
    assert torch.equal(out.cpu(), torch.full((2,), 2.0))
    with pytest.warns(UserWarning, match="no kernel autotuning"):
        torch.compile(lambda x: x * 2, backend="neuron", mode="max-autotune")(torch.ones(2, device="neuron"))
    with pytest.raises(ValueError, match="unknown mode='fastest'.*reduce-overhead"):
        options.CompileOptions.resolve("fastest")


def test_fallback_from_environment(fresh_compiler, monkeypatch):
    monkeypatch.setenv("TORCH_NEURONX_FALLBACK_TO_EAGER", "1")
    with pytest.warns(UserWarning, match="eagerly"), torch.no_grad():
        torch.compile(_uses_unlowerable, backend="neuron")(torch.ones(2, device="neuron"))
    monkeypatch.setenv("TORCH_NEURONX_FALLBACK_TO_EAGER", "maybe")
    with pytest.raises(Exception, match="TORCH_NEURONX_FALLBACK_TO_EAGER"):
        torch.compile(lambda x: x - 1, backend="neuron")(torch.ones(2, device="neuron"))


def test_tensor_subclass_inputs_compile_through_their_inner_tensors(fresh_compiler):
    """A subclass input (here TwoTensor; DTensor in practice) is desugared by AOTAutograd, and its
    plain forward and backward graphs are compiled like any other (they used to be refused)."""
    import neuron_compile.metrics
    from torch.testing._internal.two_tensor import TwoTensor

    a, b = torch.randn(3), torch.randn(3)
    x = TwoTensor(a.to("neuron"), b.to("neuron")).requires_grad_()
    out = torch.compile(lambda t: (t * 2).sin(), backend="neuron")(x)
    assert isinstance(out, TwoTensor)
    torch.testing.assert_close(out.a.cpu(), (a * 2).sin())
    torch.testing.assert_close(out.b.cpu(), (b * 2).sin())
    out.sum().backward()
    torch.testing.assert_close(x.grad.a.cpu(), 2 * (a * 2).cos())
    counters = neuron_compile.metrics.counters()
    assert counters["graphs"] == 2 and counters["eager_fallbacks"] == 0  # forward and backward


def test_the_lowering_itself_names_a_subclass_input_it_is_given():
    from torch.testing._internal.two_tensor import TwoTensor

    from neuron_compile._lowering import UnsupportedGraphInput, _fake_cpu_inputs
    from torch._subclasses import FakeTensorMode

    x = TwoTensor(torch.ones(2), torch.ones(2))
    with pytest.raises(UnsupportedGraphInput, match="graph input 0 is a TwoTensor"):
        _fake_cpu_inputs([x], FakeTensorMode())