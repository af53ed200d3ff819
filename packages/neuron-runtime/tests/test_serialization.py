"""torch.save / torch.load with neuron tensors and map_location in both directions."""

from __future__ import annotations

import io

import torch


def _roundtrip(obj, **load_kwargs):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, **load_kwargs)


def test_save_neuron_load_neuron():
    x = torch.randn(4, 3, device="neuron:1")
    y = _roundtrip(x)
    assert y.device == torch.device("neuron", 1) and y.cpu().equal(x.cpu())


def test_save_neuron_load_to_cpu():
    x = torch.randn(4, device="neuron")
    y = _roundtrip(x, map_location="cpu")
    assert y.device.type == "cpu" and y.equal(x.cpu())


def test_save_cpu_load_to_neuron():
    x = torch.randn(4)
    y = _roundtrip(x, map_location="neuron:2")
    assert y.device == torch.device("neuron", 2) and y.cpu().equal(x)


def test_optimizer_state_roundtrip():
    model = torch.nn.Linear(4, 2).to("neuron")
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(3, 4, device="neuron")).sum().backward()
    opt.step()
    state = _roundtrip({"model": model.state_dict(), "opt": opt.state_dict()})
    assert state["opt"]["state"][0]["exp_avg"].device.type == "neuron"
    restored = torch.nn.Linear(4, 2).to("neuron")
    restored.load_state_dict(state["model"])
    assert restored.weight.cpu().equal(model.weight.cpu())
