"""End-to-end training on neuron matches the same training on the CPU."""

from __future__ import annotations

import io

import pytest
import torch
from torch import nn


def _model(vocab: int = 128, hidden: int = 64, dropout: float = 0.0) -> nn.Module:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(hidden, 4, 4 * hidden, dropout=dropout, batch_first=True, norm_first=True)
    model = nn.Sequential(nn.Embedding(vocab, hidden), nn.TransformerEncoder(layer, 2, enable_nested_tensor=False),
                          nn.LayerNorm(hidden), nn.Linear(hidden, vocab))
    model[-1].weight = model[0].weight  # tied embeddings, as in most LMs
    return model


def _train(device: str, steps: int, autocast: bool = False, dropout: float = 0.0) -> tuple[list[float], nn.Module]:
    model = _model(dropout=dropout).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torch.manual_seed(1)
    data = torch.randint(0, 128, (steps, 4, 33))
    losses = []
    for step in range(steps):
        batch = data[step].to(device)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
            logits = model(batch[:, :-1])
            loss = nn.functional.cross_entropy(logits.float().reshape(-1, 128), batch[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    return losses, model


def test_fp32_training_matches_cpu():
    neuron_losses, neuron_model = _train("neuron", 6)
    cpu_losses, cpu_model = _train("cpu", 6)
    assert neuron_model[0].weight is neuron_model[-1].weight
    torch.testing.assert_close(neuron_losses, cpu_losses, rtol=1e-5, atol=1e-6)
    # AdamW normalises each gradient, so parameters whose true gradient is zero (the key
    # bias of attention) move by +-lr on rounding noise: compare at the learning-rate scale.
    for (name, p), q in zip(neuron_model.named_parameters(), cpu_model.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-4, atol=1e-4, msg=name)


def test_bf16_autocast_training_matches_cpu_autocast():
    neuron_losses, _ = _train("neuron", 4, autocast=True)
    cpu_losses, _ = _train("cpu", 4, autocast=True)
    torch.testing.assert_close(neuron_losses, cpu_losses, rtol=1e-2, atol=1e-2)


def test_checkpoint_resume_gives_identical_curve():
    losses, _ = _train("neuron", 4, dropout=0.1)  # dropout: the device RNG state must resume too
    model = _model(dropout=0.1).to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torch.manual_seed(1)
    data = torch.randint(0, 128, (4, 4, 33))

    def step(i: int) -> float:
        batch = data[i].to("neuron")
        loss = nn.functional.cross_entropy(model(batch[:, :-1]).reshape(-1, 128), batch[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()

    first = [step(0), step(1)]
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "rng": torch.neuron.get_rng_state()}, buffer)
    buffer.seek(0)
    state = torch.load(buffer, map_location="neuron")
    model = _model(dropout=0.1).to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    torch.neuron.set_rng_state(state["rng"].cpu())  # RNG states live on the CPU, as torch.cuda's
    rest = [step(2), step(3)]
    assert first + rest == pytest.approx(losses, rel=1e-6)
