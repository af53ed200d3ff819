"""Collectives under ``TORCH_DISTRIBUTED_DEBUG=DETAIL``: torch wraps the backend in its
``ProcessGroupWrapper``, which fingerprints every call with the backend's sequence number at
issue and compares it across ranks (through its own gloo group) before the call runs."""

from __future__ import annotations

import torch
import torch.distributed as dist

from _cases import Cases

cases = Cases()
dist.init_process_group("neuron")
RANK, WORLD = dist.get_rank(), dist.get_world_size()
DEVICE = torch.device("neuron", torch.neuron.current_device())


@cases.case
def back_to_back_async_collectives_keep_ranks_in_step() -> int:
    """Async calls queued behind one another are numbered when issued, as the wrapper expects
    (numbering them when their exchange started made the ranks' numbers depend on timing, and
    the wrapper reported a mismatch between identical programs)."""
    assert type(dist.group.WORLD._get_backend(DEVICE)).__name__ == "_ProcessGroupWrapper"
    for iteration in range(50):
        x = torch.full((4,), float(RANK + 1), device=DEVICE)
        gathered = torch.zeros(4 * WORLD, device=DEVICE)
        scattered = torch.zeros(4, device=DEVICE)
        works = [
            dist.all_reduce(x, async_op=True),
            dist.all_gather_into_tensor(gathered, torch.full((4,), float(RANK), device=DEVICE), async_op=True),
            dist.reduce_scatter_tensor(scattered, torch.ones(4 * WORLD, device=DEVICE), async_op=True),
        ]
        for work in works:
            work.wait()
        assert torch.equal(x.cpu(), torch.full((4,), float(sum(range(1, WORLD + 1))))), (iteration, x)
        assert torch.equal(gathered.cpu(), torch.arange(WORLD).repeat_interleave(4).float()), (iteration, gathered)
        assert torch.equal(scattered.cpu(), torch.full((4,), float(WORLD))), (iteration, scattered)
    return dist.group.WORLD._get_backend(DEVICE)._get_sequence_number_for_group()


@cases.case
def ddp_bf16_compress_hook_is_accepted() -> float:
    """The bf16 hook is accepted on neuron groups (torch allows it on CUDA+NCCL and XPU only);
    under DETAIL the group's backend is torch's wrapper around the neuron one."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8).to(DEVICE)
    ddp = DistributedDataParallel(model)
    ddp.register_comm_hook(None, bf16_compress_hook)
    ddp(torch.full((2, 8), float(RANK + 1), device=DEVICE)).sum().backward()
    grads = [torch.zeros_like(model.weight) for _ in range(WORLD)]
    dist.all_gather(grads, model.weight.grad)
    assert all(torch.equal(g, grads[0]) for g in grads), "ranks' gradients differ after the hook"
    return model.weight.grad.sum().item()


@cases.case
def monitored_barrier_is_accepted() -> bool:
    """torch runs monitored_barrier on gloo groups only; neuron groups get it too, wrapped or not."""
    import datetime

    dist.monitored_barrier(timeout=datetime.timedelta(seconds=30))
    return True


cases.run()
dist.destroy_process_group()
