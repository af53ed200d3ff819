"""One rank per "node": started by two torchrun invocations sharing a rendezvous endpoint."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from _cases import Cases

cases = Cases()
dist.init_process_group("neuron")
RANK, WORLD = dist.get_rank(), dist.get_world_size()


@cases.case
def ranks_span_nodes_and_bind_local_cores() -> list:
    local_rank = int(os.environ["LOCAL_RANK"])
    node = int(os.environ["GROUP_RANK"])
    assert torch.neuron.current_device() == local_rank
    device = torch.device("neuron", local_rank)
    tensor = torch.full((8,), float(RANK + 1), device=device)
    dist.all_reduce(tensor)
    assert torch.equal(tensor.cpu(), torch.full((8,), float(sum(range(1, WORLD + 1))))), tensor
    seen = [None] * WORLD
    dist.all_gather_object(seen, (node, local_rank, str(tensor.device)))
    return seen


cases.run()
dist.destroy_process_group()
