"""torchrun worker: DTensor programs compiled with ``torch.compile(backend="neuron")`` on 2 ranks.

Each rank checks against the same computation run eagerly on a single device, then writes
``OUT_DIR/rank{N}.json`` with what it measured (the test compares the ranks and asserts).

* ``tp_training``: a LayerNorm-MLP block parallelised with ColwiseParallel/RowwiseParallel and
  compiled; three SGD steps, loss and every gradient compared with the single-device block
  (also under bf16 autocast).
* ``redistribute``: a compiled function that all-gathers a Shard(0) DTensor and scales it.
"""

from __future__ import annotations

import copy
import json
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import neuron_compile.metrics

DIM = 16
STEPS = 3


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.norm = nn.LayerNorm(DIM)
        self.up = nn.Linear(DIM, 4 * DIM)
        self.down = nn.Linear(4 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(self.norm(x))))


def _max_error(a: torch.Tensor, b: torch.Tensor) -> float:
    a = a.full_tensor() if isinstance(a, DTensor) else a
    return (a.detach().cpu() - b.detach().cpu()).abs().max().item() / (b.detach().abs().max().item() + 1e-6)


def tp_training(mesh, device, autocast: bool = False) -> dict:
    """``autocast``: both models under ``torch.autocast("neuron", bfloat16)``; AOTAutograd traces
    the DTensor graph on the device, casts included, and the compiler must not apply autocast to
    its plain graphs a second time."""
    reference = _Block().to(device)
    model = parallelize_module(copy.deepcopy(reference), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    compiled = torch.compile(model, backend="neuron", options={"fallback_to_eager": False})
    # foreach=False: the plan leaves the norm's parameters plain tensors, and foreach kernels refuse a mix
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1, foreach=False) for m in (model, reference)]
    gen = torch.Generator().manual_seed(2)
    losses, grad_errors, output_errors = [], [], []
    for _ in range(STEPS):
        x = torch.randn(2, 8, DIM, generator=gen).to(device)  # the same batch on every rank
        with torch.autocast("neuron", dtype=torch.bfloat16, enabled=autocast):
            out, ref_out = compiled(x), reference(x)
        assert out.dtype == ref_out.dtype, (out.dtype, ref_out.dtype)
        loss, ref_loss = out.float().pow(2).mean(), ref_out.float().pow(2).mean()
        loss.backward()
        ref_loss.backward()
        output_errors.append(_max_error(out, ref_out))
        grad_errors.append(max(_max_error(p.grad, r.grad) for p, r in zip(model.parameters(), reference.parameters())))
        losses.append([loss.item(), ref_loss.item()])
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
    return {"losses": losses, "grad_errors": grad_errors, "output_errors": output_errors,
            "dtensor_params": sum(isinstance(p, DTensor) for p in model.parameters())}


def fsdp2_training(mesh, device) -> dict:
    """FSDP2 shards every parameter; the compiled block runs between its all-gathers."""
    from torch.distributed.fsdp import fully_shard

    reference = _Block().to(device)
    model = copy.deepcopy(reference)
    fully_shard(model, mesh=mesh)
    compiled = torch.compile(model, backend="neuron", options={"fallback_to_eager": False})
    rank, world = dist.get_rank(), dist.get_world_size()
    gen = torch.Generator().manual_seed(3)
    losses, grad_errors = [], []
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1, foreach=False) for m in (model, reference)]
    for _ in range(STEPS):
        batch = torch.randn(4 * world, 8, DIM, generator=gen).to(device)  # rank r trains on rows r::world
        loss = compiled(batch[rank::world]).pow(2).mean()
        loss.backward()
        ref_loss = torch.stack([reference(batch[r::world]).pow(2).mean() for r in range(world)]).mean()
        ref_loss.backward()
        grad_errors.append(max(_max_error(p.grad, r.grad) for p, r in zip(model.parameters(), reference.parameters())))
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss, op=dist.ReduceOp.AVG)
        losses.append([mean_loss.item(), ref_loss.item()])
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
    return {"losses": losses, "grad_errors": grad_errors}


def redistribute(mesh, device) -> dict:
    a = torch.randn(8, 4, generator=torch.Generator().manual_seed(4)).to(device)

    def program(x: DTensor) -> torch.Tensor:
        return (x.redistribute(mesh, [Replicate()]) * 2).to_local()

    out = torch.compile(program, backend="neuron", fullgraph=True)(distribute_tensor(a, mesh, [Shard(0)]))
    return {"error": _max_error(out, a * 2), "shape": list(out.shape)}


def main() -> int:
    out_dir = Path(sys.argv[1])
    dist.init_process_group("neuron")
    rank = dist.get_rank()
    device = torch.device("neuron", torch.neuron.current_device())
    mesh = init_device_mesh("neuron", (dist.get_world_size(),))
    result: dict = {"rank": rank, "device": str(device)}
    try:
        result["tp_training"] = tp_training(mesh, device)
        result["tp_training_bf16_autocast"] = tp_training(mesh, device, autocast=True)
        result["fsdp2_training"] = fsdp2_training(mesh, device)
        result["redistribute"] = redistribute(mesh, device)
        result["counters"] = neuron_compile.metrics.counters()
        result["ok"] = True
    except Exception:  # noqa: BLE001 - reported to the test
        result["ok"], result["error"] = False, traceback.format_exc()
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
