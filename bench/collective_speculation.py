#!/usr/bin/env python
"""Large collectives with and without speculation (neuron_dist._speculation), against gloo, in one
process per rank. Launch with torchrun:

    .venv/bin/torchrun --standalone --nproc-per-node 2 bench/collective_speculation.py

For all_reduce, all_gather_into_tensor and reduce_scatter_tensor at sizes too large to travel
inside the signature exchange (the size is the full buffer, as in bench/collectives.py), each
rank times three variants in interleaved blocks, rotating their order every round: the neuron
backend posting gloo's collective with the exchange when the group predicts it ("spec"), the
same backend waiting for the exchange first ("wait"; the group's speculation switched off
between blocks, a private switch: NEURON_DIST_SPECULATE=0 does the same for a whole process),
and a plain gloo group on CPU tensors. Two calls before each timed block let the group re-learn
the pattern after the switch. Alternating inside one process takes out most of the host's
run-to-run drift, which on a shared 2-core machine is larger than the effect measured.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

VARIANTS = ("spec", "wait", "gloo")
CASES = (("all_reduce", 1), ("all_reduce", 4), ("all_reduce", 16), ("all_gather", 4), ("all_gather", 16),
         ("reduce_scatter", 4), ("reduce_scatter", 16))


def _call(op: str, nbytes: int, device: torch.device, group: dist.ProcessGroup | None, world: int) -> Callable[[], None]:
    numel = nbytes // 4
    if op == "all_reduce":
        tensor = torch.ones(numel, device=device)
        return lambda: dist.all_reduce(tensor, group=group)
    if op == "all_gather":
        output, shard = torch.empty(numel, device=device), torch.ones(numel // world, device=device)
        return lambda: dist.all_gather_into_tensor(output, shard, group=group)
    full, shard = torch.ones(numel, device=device), torch.empty(numel // world, device=device)
    return lambda: dist.reduce_scatter_tensor(shard, full, group=group)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=14)
    args = parser.parse_args()
    dist.init_process_group("neuron")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("neuron", torch.neuron.current_device())
    gloo = dist.new_group(backend="gloo")
    frames = dist.group.WORLD._get_backend(device).impl._frames
    if not frames._speculate:
        raise SystemExit("speculation is off in this process (NEURON_DIST_SPECULATE=0?): nothing to compare")
    for op, mib in CASES:
        nbytes = mib << 20
        calls = {"spec": _call(op, nbytes, device, None, world), "gloo": _call(op, nbytes, torch.device("cpu"), gloo, world)}
        calls["wait"] = calls["spec"]
        iters = max(3, 8 // mib)
        times: dict[str, list[float]] = {name: [] for name in VARIANTS}
        for r in range(args.rounds):
            for name in VARIANTS[r % 3:] + VARIANTS[: r % 3]:
                frames._speculate = name != "wait"
                dist.barrier(group=gloo)
                calls[name]()
                calls[name]()
                start = time.perf_counter()
                for _ in range(iters):
                    calls[name]()
                times[name].append((time.perf_counter() - start) / iters)
        frames._speculate = True
        medians = torch.tensor([statistics.median(times[name]) for name in VARIANTS], dtype=torch.float64)
        dist.all_reduce(medians, op=dist.ReduceOp.MAX, group=gloo)  # the slowest rank's figures
        spec, wait, plain = medians.tolist()
        if rank == 0:
            print(f"{op:<15}{mib:>3} MiB  spec {spec * 1e6:8.0f} us ({spec / plain:.2f}x gloo)   "
                  f"wait {wait * 1e6:8.0f} us ({wait / plain:.2f}x)   gloo {plain * 1e6:8.0f} us", flush=True)
    if rank == 0:
        print(f"predicted launches used / discarded: {frames.speculation['hits']} / {frames.speculation['misses']}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
