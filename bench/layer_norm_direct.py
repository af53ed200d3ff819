"""Direct timing of a large layer_norm on neuron vs. the CPU (a cross-check of bench/eager.py).

Each device: warm-up, then 7 blocks of 50 calls; prints the median per-call time of each
device and their ratio, three times, so run-to-run spread is visible.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F


def median_call_us(device: str, size: int, blocks: int = 7, calls: int = 50) -> float:
    x = torch.randn(size, size, device=device)
    w, b = torch.ones(size, device=device), torch.zeros(size, device=device)
    for _ in range(20):
        F.layer_norm(x, (size,), w, b)
    times = []
    for _ in range(blocks):
        start = time.perf_counter()
        for _ in range(calls):
            F.layer_norm(x, (size,), w, b)
        times.append((time.perf_counter() - start) / calls)
    return sorted(times)[blocks // 2] * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for _ in range(args.repeats):
        cpu, neuron = median_call_us("cpu", args.size), median_call_us("neuron", args.size)
        print(f"layer_norm {args.size}x{args.size}: cpu {cpu:.0f} us  neuron {neuron:.0f} us  ratio {neuron / cpu:.3f}")


if __name__ == "__main__":
    main()
