#!/usr/bin/env python
"""The exchange frame's slot sized for the predicted collective, against the last collective's
size, and plain gloo, in one run (2 ranks):

    .venv/bin/torchrun --standalone --nproc-per-node 2 bench/collective_frame_slot.py

Each block is a barrier and then ``--calls`` equal collectives, the pattern of
``bench/collectives.py``'s blocks. Under the older rule (the slot fits the *last* exchanged
collective's payload) the first call after the barrier found a frame sized for the barrier and
took two round trips; with the slot sized from the group's prediction (``neuron_dist._frames``)
it travels inside the exchange. Both rules run in the same process, blocks interleaved with
gloo's: the older rule is had by hiding the predicted payload size from the exchange. Prints
medians of per-round ratios. A diagnostic, not a goal: ``bench/collectives.py`` compares with
gloo end to end.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable

import torch
import torch.distributed as dist

ROUNDS = 16
SIZES_KIB = (16, 64, 256, 1024, 4096)


def _calls(op: str, kib: int, world: int, gloo: dist.ProcessGroup) -> dict[str, Callable[[], None]]:
    """One call of ``op`` moving ``kib`` KiB, on neuron tensors and on CPU tensors through gloo."""
    n = kib * 256 // world  # float32 elements per rank's share
    shard, whole = torch.ones(n, device="neuron"), torch.ones(n * world, device="neuron")
    cpu_shard, cpu_whole = torch.ones(n), torch.ones(n * world)
    if op == "all_gather":
        return {"neuron": lambda: dist.all_gather_into_tensor(whole, shard),
                "gloo": lambda: dist.all_gather_into_tensor(cpu_whole, cpu_shard, group=gloo)}
    if op == "reduce_scatter":
        return {"neuron": lambda: dist.reduce_scatter_tensor(shard, whole),
                "gloo": lambda: dist.reduce_scatter_tensor(cpu_shard, cpu_whole, group=gloo)}
    return {"neuron": lambda: dist.all_reduce(whole), "gloo": lambda: dist.all_reduce(cpu_whole, group=gloo)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3, help="collectives per block, after its barrier")
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # torch's deprecation warnings for the *_tensor names
    dist.init_process_group("neuron")
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    predictor = dist.group.WORLD._get_backend(torch.device("neuron")).impl._frames._predictor
    predicted = predictor.next_collective

    def last_payload_rule() -> tuple:
        launch, _ = predicted()
        return launch, None  # no predicted size: the slot follows the last collective

    for op in ("all_gather", "reduce_scatter", "all_reduce"):
        for kib in SIZES_KIB:
            calls = _calls(op, kib, world, gloo)
            times: dict[str, list[float]] = {"predicted": [], "last": [], "gloo": []}
            for r in range(ROUNDS):
                for variant in (list(times) if r % 2 == 0 else list(times)[::-1]):
                    predictor.next_collective = last_payload_rule if variant == "last" else predicted
                    call = calls["gloo" if variant == "gloo" else "neuron"]
                    dist.barrier()
                    start = time.perf_counter()
                    for _ in range(args.calls):
                        call()
                    times[variant].append((time.perf_counter() - start) / args.calls * 1e6)
            predictor.next_collective = predicted
            if rank == 0:
                def ratio(a: str, b: str) -> float:
                    return statistics.median(x / y for x, y in zip(times[a], times[b]))

                print(f"{op:<15}{kib:>5} KiB  gloo {statistics.median(times['gloo']):7.0f} us  "
                      f"predicted slot {ratio('predicted', 'gloo'):.2f}x gloo  last-payload slot "
                      f"{ratio('last', 'gloo'):.2f}x gloo  predicted / last {ratio('predicted', 'last'):.2f}",
                      flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
