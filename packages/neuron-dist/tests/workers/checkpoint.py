"""torch.distributed.checkpoint with resharding: argv[2] = "save" (FSDP2-sharded model and
optimizer state at this world size) or "load" (into a model sharded over this world size, compared
with the single-device model the saver also wrote); argv[3] = the checkpoint directory."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from _cases import Cases

cases = Cases()
MODE, CKPT = sys.argv[2], Path(sys.argv[3])
dist.init_process_group("neuron")
RANK, WORLD = dist.get_rank(), dist.get_world_size()
DEVICE = torch.device("neuron", torch.neuron.current_device())


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 20), nn.ReLU(), nn.Linear(20, 8)).to(DEVICE)


def _sharded(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = _model(seed)
    mesh = init_device_mesh("neuron", (WORLD,))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _train_step(model: nn.Module, optim: torch.optim.Optimizer) -> None:
    gen = torch.Generator().manual_seed(5)
    batch = torch.randn(4, 12, generator=gen).to(DEVICE)
    model(batch).pow(2).mean().backward()
    optim.step()
    optim.zero_grad()


@cases.case
def save_sharded() -> int | None:
    if MODE != "save":
        return None
    model, optim = _sharded(seed=0)
    _train_step(model, optim)
    model_sd, optim_sd = get_state_dict(model, optim)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(CKPT))
    full = {k: v.full_tensor().cpu() for k, v in model.state_dict().items()}
    if RANK == 0:
        torch.save(full, CKPT / "reference.pt")
    return len(model_sd)


@cases.case
def load_resharded() -> int | None:
    if MODE != "load":
        return None
    model, optim = _sharded(seed=1)  # different weights: the load must overwrite them
    model_sd, optim_sd = get_state_dict(model, optim)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(CKPT))
    set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
    reference = torch.load(CKPT / "reference.pt")
    for name, value in model.state_dict().items():
        assert isinstance(value, DTensor) and value.device == DEVICE
        full = value.full_tensor().cpu()
        assert torch.equal(full, reference[name]), f"{name} differs after load at world size {WORLD}"
    # optimizer state came along: one more step from the loaded state is identical on all ranks
    steps = [s["step"] for s in optim.state_dict()["state"].values()]
    assert all(float(s) == 1.0 for s in steps), steps
    return WORLD


cases.run()
dist.destroy_process_group()
