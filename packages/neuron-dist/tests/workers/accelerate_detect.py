"""Under ``accelerate launch --num_processes 2``: MULTI_NEURON with the "neuron" c10d backend,
one core per process, and accelerate's collectives working on neuron tensors."""

from __future__ import annotations

import os
import sys

import torch
from accelerate import PartialState
from accelerate.utils import DistributedType, gather, reduce

from _cases import Cases

cases = Cases()
state = PartialState()


@cases.case
def detects_multi_neuron() -> list:
    assert state.distributed_type == DistributedType.MULTI_NEURON, state.distributed_type
    assert state.backend == "neuron", state.backend
    assert torch.distributed.get_backend() == "neuron"
    assert state.device == torch.device("neuron", int(os.environ["LOCAL_RANK"])), state.device
    value = torch.tensor([state.process_index + 1.0], device=state.device)
    gathered = gather(value)
    total = reduce(value, reduction="sum")
    assert gathered.cpu().tolist() == [1.0, 2.0] and total.item() == 3.0, (gathered, total)
    return [str(state.distributed_type), state.backend, str(state.device)]


cases.run(sys.argv[1])
