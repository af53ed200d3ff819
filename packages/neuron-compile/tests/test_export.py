"""torch.export of neuron models, and AOTInductor's clear refusal of neuron programs."""

from __future__ import annotations

import pytest
import torch

from neuron_compile import _aoti


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.register_buffer("shift", torch.arange(8, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.linear(x)) + self.shift


def _models():
    torch.manual_seed(0)
    reference = _Block()
    model = _Block().to("neuron")
    model.load_state_dict(reference.state_dict())
    return reference, model


def test_an_exported_neuron_program_runs_saves_loads_and_compiles(tmp_path, fresh_compiler):
    reference, model = _models()
    x = torch.randn(3, 8)
    exported = torch.export.export(model, (x.to("neuron"),))
    expected = reference(x)
    torch.testing.assert_close(exported.module()(x.to("neuron")).cpu(), expected)
    torch.export.save(exported, tmp_path / "block.pt2")
    loaded = torch.export.load(tmp_path / "block.pt2")
    result = loaded.module()(x.to("neuron"))
    assert result.device.type == "neuron"
    torch.testing.assert_close(result.cpu(), expected)
    compiled = torch.compile(loaded.module(), backend="neuron")
    torch.testing.assert_close(compiled(x.to("neuron")).cpu(), expected)


def test_aoti_refuses_a_neuron_program_naming_what_to_do_instead():
    _, model = _models()
    exported = torch.export.export(model, (torch.randn(3, 8, device="neuron"),))
    with pytest.raises(NotImplementedError, match="neuron device.*model.to\\('cpu'\\).*backend='neuron'"):
        torch._inductor.aoti_compile_and_package(exported)


def test_aoti_refuses_neuron_inputs_given_to_aot_compile():
    _, model = _models()
    x = torch.randn(3, 8, device="neuron")
    graph = torch.export.export(model, (x,)).module()
    with pytest.raises(NotImplementedError, match="torch._inductor.aot_compile"):
        torch._inductor.aot_compile(graph, (x,))


def test_aoti_still_takes_cpu_programs():
    reference, _ = _models()
    exported = torch.export.export(reference, (torch.randn(3, 8),))
    assert getattr(torch._inductor.aoti_compile_and_package, "_neuron_compile_refuses_neuron_programs", False)
    assert not _aoti._targets_neuron((exported,), {})
    assert not _aoti._targets_neuron((exported.module(), (torch.randn(3, 8),)), {})
