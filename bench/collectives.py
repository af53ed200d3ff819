#!/usr/bin/env python
"""Bus bandwidth of the "neuron" c10d backend vs. plain gloo on CPU tensors, in the same run.

Launch with torchrun (2 ranks by default); rank 0 prints the table:

    .venv/bin/torchrun --standalone --nproc-per-node 2 bench/collectives.py
    .venv/bin/torchrun --standalone --nproc-per-node 2 bench/collectives.py --max-mib 4 --iters 5

For all_reduce, all_gather and reduce_scatter at sizes from 1 KiB to 64 MiB (the size is the
full buffer: all_reduce's tensor, all_gather's output, reduce_scatter's input), each rank times
the neuron backend on neuron tensors and a gloo group on CPU tensors, in interleaved blocks
(the order rotated every block), and reports the median time per call. Bus bandwidth follows nccl-tests:
all_reduce moves 2(n-1)/n of the buffer per rank, all_gather and reduce_scatter (n-1)/n.
``ratio = neuron time / gloo time``; the goal is <= 1.1 at every size.

``--control`` adds a second plain gloo group to the same interleaving and reports its time over
the first one's (an A/A comparison): how far two identical backends drift apart on this host in
one run, the noise floor against which the neuron ratios are read.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

GOAL = 1.1


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--min-kib", type=int, default=1)
    parser.add_argument("--max-mib", type=int, default=64)
    parser.add_argument("--iters", type=int, default=0, help="calls per block (default: by size)")
    parser.add_argument("--min-iters", type=int, default=3, help="at least this many calls per block")
    parser.add_argument("--blocks", type=int, default=4, help="blocks per backend (interleaved)")
    parser.add_argument("--control", action="store_true",
                        help="also time a second gloo group against the first (A/A noise floor)")
    args = parser.parse_args()
    if args.max_mib * 1024 < args.min_kib:
        parser.error(f"--max-mib {args.max_mib} is below --min-kib {args.min_kib}: no size to time")
    return args


def _sizes(min_kib: int, max_mib: int) -> list[int]:
    size, out = min_kib * 1024, []
    while size <= max_mib * 1024 * 1024:
        out.append(size)
        size *= 4
    return out


def _calls(op: str, nbytes: int, device: torch.device, group: dist.ProcessGroup, world: int):
    numel = nbytes // 4
    if op == "all_reduce":
        tensor = torch.ones(numel, device=device)
        return lambda: dist.all_reduce(tensor, group=group)
    if op == "all_gather":
        output = torch.empty(numel, device=device)
        shard = torch.ones(numel // world, device=device)
        return lambda: dist.all_gather_into_tensor(output, shard, group=group)
    full = torch.ones(numel, device=device)
    shard = torch.empty(numel // world, device=device)
    return lambda: dist.reduce_scatter_tensor(shard, full, group=group)


def _block(call, iters: int, group: dist.ProcessGroup) -> float:
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(iters):
        call()
    return (time.perf_counter() - start) / iters


def main() -> None:
    args = _parse()
    dist.init_process_group("neuron")
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    control = dist.new_group(backend="gloo") if args.control else None
    neuron_group = dist.group.WORLD
    device = torch.device("neuron", torch.neuron.current_device())
    factor = {"all_reduce": 2 * (world - 1) / world, "all_gather": (world - 1) / world, "reduce_scatter": (world - 1) / world}
    rows = []
    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        for nbytes in _sizes(args.min_kib, args.max_mib):
            iters = args.iters or max(args.min_iters, min(200, (8 << 20) // nbytes))
            calls = {
                "neuron": _calls(op, nbytes, device, neuron_group, world),
                "gloo": _calls(op, nbytes, torch.device("cpu"), gloo, world),
            }
            if control is not None:
                calls["control"] = _calls(op, nbytes, torch.device("cpu"), control, world)
            for name in calls:  # warm-up
                _block(calls[name], 2, neuron_group)
            names = list(calls)
            times: dict[str, list[float]] = {name: [] for name in names}
            for block in range(args.blocks):
                # rotate the order, so that each variant runs first in turn (ABBA with two)
                shift = block % len(names)
                for name in names[shift:] + names[:shift]:
                    times[name].append(_block(calls[name], iters, neuron_group))
            # every rank must agree on the figures: take the slowest rank's median
            medians = torch.tensor([statistics.median(times[name]) for name in names], dtype=torch.float64)
            dist.all_reduce(medians, op=dist.ReduceOp.MAX, group=gloo)
            figures = dict(zip(names, medians.tolist()))
            t_neuron, t_gloo = figures["neuron"], figures["gloo"]
            rows.append((op, nbytes, t_neuron, t_gloo, figures.get("control")))
            if rank == 0:
                busbw = lambda t: nbytes * factor[op] / t / 1e9  # noqa: E731
                ratio = t_neuron / t_gloo
                line = (f"{op:<15}{_fmt(nbytes):>9}  neuron {t_neuron * 1e6:10.1f} us {busbw(t_neuron):7.3f} GB/s"
                        f"   gloo {t_gloo * 1e6:10.1f} us {busbw(t_gloo):7.3f} GB/s   ratio {ratio:5.2f}"
                        f"  {'PASS' if ratio <= GOAL else 'MISS'}")
                if control is not None:
                    line += f"   control gloo/gloo {figures['control'] / t_gloo:5.2f}"
                print(line, flush=True)
    if rank == 0:
        _summary(rows, "neuron", lambda row: row[2] / row[3])
        if control is not None:
            _summary(rows, "control (a second gloo group)", lambda row: row[4] / row[3])
    dist.destroy_process_group()


def _summary(rows: list[tuple], label: str, ratio_of) -> None:
    ratios = [ratio_of(row) for row in rows]
    passed = sum(1 for ratio in ratios if ratio <= GOAL)
    print(f"{label}: {passed}/{len(rows)} sizes within {GOAL}x of gloo; geomean ratio "
          f"{statistics.geometric_mean(ratios):.2f}, best {min(ratios):.2f}, worst {max(ratios):.2f}")


def _fmt(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


if __name__ == "__main__":
    main()
