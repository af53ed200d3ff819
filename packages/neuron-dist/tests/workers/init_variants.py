"""Ways of starting the neuron process group that torch resolves itself: no backend at all, and
a group bound to a core (``device_id``) with CPU-side gloo subgroups."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

from _cases import Cases

cases = Cases()
MODE = sys.argv[2]
LOCAL_RANK = int(os.environ["LOCAL_RANK"])
if MODE == "no_backend":
    dist.init_process_group()
elif MODE == "device_map":
    dist.init_process_group("cpu:gloo,neuron:neuron")
else:
    dist.init_process_group("neuron", device_id=torch.device("neuron", LOCAL_RANK))
RANK, WORLD = dist.get_rank(), dist.get_world_size()
DEVICE = torch.device("neuron", LOCAL_RANK)


def _ddp_step_matches_single_device() -> float:
    torch.manual_seed(0)
    reference = torch.nn.Linear(8, 4)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 4).to(DEVICE))
    model.module.load_state_dict(reference.state_dict())
    batch = torch.randn(2 * WORLD, 8, generator=torch.Generator().manual_seed(1))
    model(batch[RANK::WORLD].to(DEVICE)).pow(2).mean().backward()
    expected = sum(
        torch.autograd.grad(reference(batch[r::WORLD]).pow(2).mean(), reference.weight)[0] for r in range(WORLD)
    ) / WORLD
    got = model.module.weight.grad.cpu()
    assert torch.allclose(got, expected, atol=1e-6), (got - expected).abs().max()
    return float(got.sum())


@cases.case
def no_backend_means_the_neuron_backend() -> str:
    """``init_process_group()`` on a neuron machine: the group's backend is "neuron" (it was
    "undefined" with gloo as its default backend type) and DDP works on it."""
    if MODE != "no_backend":
        return "skipped in this mode"
    assert dist.get_backend() == "neuron", dist.get_backend()
    _ddp_step_matches_single_device()
    return dist.get_backend()


@cases.case
def gloo_subgroup_of_a_core_bound_group() -> list[float]:
    """``new_group(backend="gloo")`` after ``init_process_group(..., device_id=neuron:i)``: torch
    asked gloo for the bound neuron device and failed; now the CPU group is created unbound."""
    if MODE != "device_id":
        return []
    gloo = dist.new_group(backend="gloo")
    x = torch.ones(2) * (RANK + 1)
    dist.all_reduce(x, group=gloo)
    assert x.tolist() == [WORLD * (WORLD + 1) / 2] * 2, x
    _ddp_step_matches_single_device()  # the bound default group still serves neuron tensors
    dist.barrier()
    return x.tolist()


@cases.case
def bf16_hook_on_a_device_map_backend() -> bool:
    """DDP's bf16 compression hook is accepted when neuron tensors go to the neuron backend
    through a device map, not only with init_process_group("neuron")."""
    if MODE != "device_map":
        return False
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4).to(DEVICE))
    model.register_comm_hook(None, default_hooks.bf16_compress_hook)
    model(torch.ones(2, 4, device=DEVICE)).sum().backward()
    return True


cases.run()
dist.destroy_process_group()
