"""Demo: train a small transformer block on the emulated Trainium device and compare with the CPU.

Runs a few optimizer steps of the same model, from the same seed, on ``neuron`` and on the
CPU, prints both loss curves, and shows the device's memory report.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn


def make_model(hidden: int, layers: int, vocab: int) -> nn.Module:
    """A small decoder-style language model built from torch.nn blocks."""
    block = nn.TransformerEncoderLayer(hidden, nhead=4, dim_feedforward=4 * hidden, batch_first=True,
                                       norm_first=True, dropout=0.0)
    return nn.Sequential(nn.Embedding(vocab, hidden), nn.TransformerEncoder(block, layers, enable_nested_tensor=False),
                         nn.LayerNorm(hidden), nn.Linear(hidden, vocab))


def train(device: str, args: argparse.Namespace) -> list[float]:
    torch.manual_seed(0)
    model = make_model(args.hidden, args.layers, args.vocab).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, args.vocab, (args.steps, args.batch, args.seq + 1))
    losses = []
    for step in range(args.steps):
        batch = data[step].to(device)
        logits = model(batch[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, args.vocab), batch[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()

    props = torch.neuron.get_device_properties(0)
    print(f"emulated {props.instance}: {torch.neuron.device_count()} x {props.name}, "
          f"{props.total_memory / 2**30:.0f} GiB HBM each")
    curves = {}
    warmup = argparse.Namespace(**{**vars(args), "steps": 1})
    for device in ("neuron", "cpu"):
        train(device, warmup)  # first-use costs (lazy imports, kernel setup) are not timed
    for device in ("neuron", "cpu"):
        start = time.perf_counter()
        curves[device] = train(device, args)
        print(f"{device:>6}: {args.steps} steps in {time.perf_counter() - start:.2f}s")
    for step, (a, b) in enumerate(zip(curves["neuron"], curves["cpu"])):
        print(f"step {step:3d}  loss neuron {a:.5f}  cpu {b:.5f}")
    worst = max(abs(a - b) / abs(b) for a, b in zip(curves["neuron"], curves["cpu"]))
    print(f"largest relative loss difference neuron vs cpu: {worst:.2e}")
    print(torch.neuron.memory_summary(0, abbreviated=True))


if __name__ == "__main__":
    main()
