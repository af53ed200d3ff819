"""nn.LSTM, nn.GRU and their cells on neuron: ATen sends every non-CPU device to the fused
cells (CUDA-only upstream); the runtime provides them, differentiable to second order."""

from __future__ import annotations

import copy

import pytest
import torch

_MODULES = {
    "LSTM": lambda bias: torch.nn.LSTM(6, 5, num_layers=2, bidirectional=True, batch_first=True, bias=bias),
    "GRU": lambda bias: torch.nn.GRU(6, 5, num_layers=2, bidirectional=True, batch_first=True, bias=bias),
    "LSTMCell": lambda bias: torch.nn.LSTMCell(6, 5, bias=bias),
    "GRUCell": lambda bias: torch.nn.GRUCell(6, 5, bias=bias),
}


def _outputs(result):
    if isinstance(result, torch.Tensor):
        return [result]
    return [t for item in result for t in _outputs(item)]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("name", sorted(_MODULES))
def test_recurrent_layers_match_cpu_forward_and_backward(name: str, bias: bool) -> None:
    torch.manual_seed(0)
    cpu = _MODULES[name](bias)
    neuron = copy.deepcopy(cpu).to("neuron")
    x = torch.randn(3, 4, 6) if not name.endswith("Cell") else torch.randn(3, 6)
    outs = {}
    for device, module in (("cpu", cpu), ("neuron", neuron)):
        result = _outputs(module(x.to(device)))
        sum(out.pow(2).sum() for out in result).backward()
        outs[device] = result
    for got, want in zip(outs["neuron"], outs["cpu"]):
        assert got.device.type == "neuron"
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)
    for (pname, p_cpu), p_neuron in zip(cpu.named_parameters(), neuron.parameters()):
        torch.testing.assert_close(p_neuron.grad.cpu(), p_cpu.grad, rtol=1e-5, atol=1e-6, msg=pname)


@pytest.mark.parametrize("name", ["LSTMCell", "GRUCell"])
def test_recurrent_cells_second_order_and_inference_mode(name: str) -> None:
    torch.manual_seed(1)
    cpu = _MODULES[name](True)
    neuron = copy.deepcopy(cpu).to("neuron")
    x = torch.randn(2, 6)
    second = {}
    for device, module in (("cpu", cpu), ("neuron", neuron)):
        inp = x.to(device).requires_grad_()
        out = _outputs(module(inp))[0]
        (grad,) = torch.autograd.grad(out.pow(2).sum(), inp, create_graph=True)
        (second[device],) = torch.autograd.grad(grad.sum(), inp)
    torch.testing.assert_close(second["neuron"].cpu(), second["cpu"], rtol=1e-5, atol=1e-6)
    with torch.inference_mode():
        got = _outputs(neuron(x.to("neuron")))[0]
    torch.testing.assert_close(got.cpu(), _outputs(cpu(x))[0].detach(), rtol=1e-5, atol=1e-6)
