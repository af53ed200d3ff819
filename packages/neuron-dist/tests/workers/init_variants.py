"""Ways of starting the neuron process group that torch resolves itself: no backend at all, and
a group bound to a core (``device_id``) with CPU-side gloo subgroups, split groups and a 2-D
DeviceMesh (which splits a bound group instead of calling ``new_group``)."""

from __future__ import annotations

import copy
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
def device_mesh_of_a_core_bound_group() -> list[float]:
    """A 2-D ``init_device_mesh`` after ``init_process_group("neuron", device_id=...)``: DeviceMesh
    makes its dimension groups with ``split_group``, which failed ("its backend does not support
    splitting"). Each dimension's group must be a neuron group of the right ranks, and DTensor
    must compute on the mesh as on one device."""
    if MODE != "device_id":
        return []
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from neuron_dist import _C

    mesh = init_device_mesh("neuron", (2, WORLD // 2), mesh_dim_names=("dp", "tp"))
    sums = []
    for name in ("dp", "tp"):
        group = mesh.get_group(name)
        assert isinstance(group._get_backend(DEVICE), _C.PythonBackend), group._get_backend(DEVICE)
        ranks = dist.get_process_group_ranks(group)
        assert RANK in ranks and len(ranks) == mesh.size(mesh.mesh_dim_names.index(name)), (name, ranks)
        x = torch.full((3,), float(RANK + 1), device=DEVICE)
        dist.all_reduce(x, group=group)
        assert x.tolist() == [float(sum(r + 1 for r in ranks))] * 3, (name, ranks, x)
        sums.append(x[0].item())
    a = torch.randn(8, 6, generator=torch.Generator().manual_seed(0))
    b = torch.randn(6, 4, generator=torch.Generator().manual_seed(1))
    da = distribute_tensor(a.to(DEVICE), mesh, [Shard(0), Shard(1)])
    db = distribute_tensor(b.to(DEVICE), mesh, [Replicate(), Shard(0)])
    product = (da @ db).full_tensor()
    assert product.device == DEVICE and torch.allclose(product.cpu(), a @ b, atol=1e-5), product
    return sums


@cases.case
def split_group_of_a_core_bound_group() -> list[object]:
    """``dist.split_group`` on a bound neuron group: the ranks named get a neuron group with the
    parent's timeout, the others None; the parent's ``options`` (which split_group deep-copies)
    carry the group's timeout and ranks."""
    if MODE != "device_id":
        return []
    parent = dist.group.WORLD._get_backend(DEVICE)
    options = copy.deepcopy(parent.options)
    assert options._timeout == parent.impl._timeout, (options._timeout, parent.impl._timeout)
    assert list(options.global_ranks_in_group) == list(range(WORLD)), options.global_ranks_in_group
    group = dist.split_group(split_ranks=[[0, 1]])
    if RANK > 1:
        assert group is None, group
        return [None]
    assert dist.get_process_group_ranks(group) == [0, 1] and group.rank() == RANK, group
    assert group._get_backend(DEVICE).impl._timeout == parent.impl._timeout
    x = torch.tensor([float(RANK + 1)], device=DEVICE)
    dist.all_reduce(x, group=group)
    assert x.item() == 3.0, x
    return [x.item()]


@cases.case
def new_group_leaving_ranks_out_of_a_core_bound_group() -> list[object]:
    """``new_group([0, 1])`` on a bound group whose backend splits: torch asks the left-out
    ranks' backend for NCCL's ``perform_nocolor_split``, which the neuron backend lacked."""
    if MODE != "device_id":
        return []
    group = dist.new_group([0, 1])
    if RANK > 1:
        assert group == dist.GroupMember.NON_GROUP_MEMBER, group
        return [None]
    x = torch.tensor([float(RANK + 1)], device=DEVICE)
    dist.all_reduce(x, group=group)
    return [x.item()]


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
