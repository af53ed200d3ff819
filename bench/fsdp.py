#!/usr/bin/env python
"""A small transformer's training step with FSDP2 and with tensor parallelism on 2 neuron ranks,
against the same model on 1 rank (a single device), in the same run.

    .venv/bin/torchrun --standalone --nproc-per-node 2 bench/fsdp.py
    .venv/bin/torchrun --standalone --nproc-per-node 2 bench/fsdp.py --steps 3 --dim 128

Every rank first trains the single-device model on the whole batch (the 1-rank reference), then
the FSDP2 model (each rank half of the batch) and the TP model (whole batch, weights split), from
the same initial weights. Losses of every step and the gradients of the first step must equal the
reference within fp32 tolerance; rank 0 prints the median step time of each and the ratios.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

VOCAB, HEADS = 256, 4


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.head_dim = dim // HEADS

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = self.norm1(x)
        q, k, v = (proj(h).view(b, t, -1, self.head_dim).transpose(1, 2) for proj in (self.q, self.k, self.v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, -1)
        x = x + self.o(attn)
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Model(nn.Module):
    def __init__(self, dim: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def _loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def _train(model: nn.Module, batches: list[torch.Tensor], reduce_loss: bool) -> tuple[list[float], dict, list[float]]:
    optim = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)  # TP mixes DTensor and plain params
    losses, times, grads = [], [], {}
    for step, tokens in enumerate(batches):
        start = time.perf_counter()
        loss = _loss(model, tokens)
        loss.backward()
        if step == 0:
            grads = {n: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).detach().clone()
                     for n, p in model.named_parameters()}
        optim.step()
        optim.zero_grad()
        value = loss.detach().clone()
        if reduce_loss:
            dist.all_reduce(value, op=dist.ReduceOp.AVG)
        losses.append(value.item())
        times.append(time.perf_counter() - start)
    return losses, grads, times


def _compare(name: str, losses, grads, ref_losses, ref_grads) -> str:
    worst_loss = max(abs(a - b) for a, b in zip(losses, ref_losses))
    worst_grad = max((grads[n].cpu() - ref_grads[n].cpu()).abs().max().item() for n in ref_grads)
    ok = worst_loss <= 1e-4 and all(torch.allclose(grads[n].cpu(), ref_grads[n].cpu(), atol=1e-5, rtol=1e-4) for n in ref_grads)
    return f"{name}: max |loss - ref| {worst_loss:.2e}, max |grad - ref| {worst_grad:.2e}: {'EQUAL' if ok else 'DIFFERENT'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    dist.init_process_group("neuron")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("neuron", torch.neuron.current_device())
    mesh = init_device_mesh("neuron", (world,))
    torch.manual_seed(0)
    reference = Model(args.dim, args.layers).to(device)
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, VOCAB, (args.batch, args.seq + 1), generator=gen).to(device) for _ in range(args.steps)]

    fsdp = copy.deepcopy(reference)
    tp = copy.deepcopy(reference)
    ref_losses, ref_grads, ref_times = _train(reference, batches, reduce_loss=False)

    for block in fsdp.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(fsdp, mesh=mesh)
    shard = args.batch // world
    fsdp_losses, fsdp_grads, fsdp_times = _train(fsdp, [b[rank * shard:(rank + 1) * shard] for b in batches], reduce_loss=True)

    plan = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "o": RowwiseParallel(),
            "up": ColwiseParallel(), "down": RowwiseParallel()}
    for block in tp.blocks:
        parallelize_module(block, mesh, plan)
    tp_losses, tp_grads, tp_times = _train(tp, batches, reduce_loss=False)

    if rank == 0:
        med = lambda ts: statistics.median(ts[1:]) if len(ts) > 1 else ts[0]  # noqa: E731 (first step warms up)
        t_ref, t_fsdp, t_tp = med(ref_times), med(fsdp_times), med(tp_times)
        print(f"model: dim {args.dim}, {args.layers} layers, batch {args.batch} x seq {args.seq}, {args.steps} steps; {world} ranks")
        print(f"1 rank (single device): {t_ref * 1e3:8.1f} ms/step   losses {[round(x, 5) for x in ref_losses]}")
        print(f"FSDP2 on {world} ranks:     {t_fsdp * 1e3:8.1f} ms/step   ({t_fsdp / t_ref:.2f}x the 1-rank step)")
        print(f"TP on {world} ranks:        {t_tp * 1e3:8.1f} ms/step   ({t_tp / t_ref:.2f}x the 1-rank step)")
        print(_compare("FSDP2", fsdp_losses, fsdp_grads, ref_losses, ref_grads))
        print(_compare("TP   ", tp_losses, tp_grads, ref_losses, ref_grads))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
