#!/usr/bin/env python
"""Per-call cost of the "neuron" c10d backend's own code, without the network in the way.

Launch with torchrun on 2 ranks; rank 0 measures, the other ranks wait until it is done:

    .venv/bin/torchrun --standalone --nproc-per-node 2 bench/collective_overhead.py

On rank 0 the signature exchange's gloo all-gather is replaced by a local copy (every rank's
frame is this rank's), so a 1 KiB all_gather_into_tensor or all_reduce runs the backend's whole
path -- torch's API, the C++ ``c10d::Backend``, the Python steps, the frame copies and checks,
the work handles -- and nothing else. ``api floor`` is the same call into a backend method that
returns an already finished work at once: what torch's API and the C++ forwarding cost by
themselves. A diagnostic, not a goal: ``bench/collectives.py`` compares with gloo end to end.
"""

from __future__ import annotations

import os
import statistics
import time
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist

CALLS = 2000
_DONE = "collective_overhead_done"
ROUNDS = 7


class _Finished:
    """Stands in for gloo's work on the exchange: already complete."""

    def wait(self, timeout=None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


class _LocalExchange:
    """Stands in for the group's gloo process group in the frame exchange: a local all-gather."""

    def __init__(self, world: int) -> None:
        self._world = world

    def _allgather_base(self, recv: torch.Tensor, send: torch.Tensor, *args) -> _Finished:
        recv.view(self._world, -1).copy_(send)
        return _Finished()


def main() -> None:
    warnings.simplefilter("ignore")  # torch's deprecation warning for all_gather_into_tensor
    dist.init_process_group("neuron")
    store = dist.distributed_c10d._get_default_store()
    if dist.get_rank() != 0:
        store.wait([_DONE], timedelta(minutes=10))
        os._exit(0)
    from neuron_dist._work import NeuronWork

    impl = dist.group.WORLD._get_backend(torch.device("neuron")).impl
    impl._frames._gloo = _LocalExchange(dist.get_world_size())
    world, n = dist.get_world_size(), 256  # 1 KiB of float32
    out = torch.empty(world * n, device="neuron")
    shard = torch.ones(n, device="neuron")
    tensor = torch.ones(n, device="neuron")
    finished = NeuronWork([], [out])
    real = type(impl).all_gather_single
    calls = {
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(out, shard),
        "all_reduce": lambda: dist.all_reduce(tensor),
        "all_gather async + wait": lambda: dist.all_gather_into_tensor(out, shard, async_op=True).wait(),
        "api floor": lambda: dist.all_gather_into_tensor(out, shard),
    }
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(ROUNDS):
        for name, call in calls.items():
            type(impl).all_gather_single = (lambda self, o, i, opts=None: finished) if name == "api floor" else real
            for _ in range(200):
                call()
            start = time.perf_counter()
            for _ in range(CALLS):
                call()
            times[name].append((time.perf_counter() - start) / CALLS * 1e6)
    for name, values in times.items():
        print(f"{name:<26} median {statistics.median(values):6.1f} us   min {min(values):6.1f} us per call", flush=True)
    store.set(_DONE, "1")
    os._exit(0)  # the group cannot be torn down with its exchange replaced


if __name__ == "__main__":
    main()
