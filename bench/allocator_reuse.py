#!/usr/bin/env python
"""Whether neuron memory handed out again is as warm in the host's caches as CPU memory.

An op that frees its output and allocates the next one of the same size (a loop, a layer's
activations, a compiled program's buffers) gets memory back from the caching allocator. If
the allocator handed out the block freed longest ago, a loop would cycle through every cached
block of that size and find each one cold. This times ``b = a + 1; del b`` on 256 KiB of
float32 with 4, 32 and 64 blocks of that size cached beforehand, on neuron and on the CPU
(whose malloc reuses the chunk freed last), interleaved, and prints neuron / CPU:

    .venv/bin/python bench/allocator_reuse.py

A diagnostic of the caching allocator, not a goal: ``bench/eager.py`` and ``bench/compile.py``
measure what it costs end to end.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

ELEMENTS = 64 * 1024  # 256 KiB of float32
CALLS = 100
ROUNDS = 15


def _loop(a: torch.Tensor) -> Callable[[], None]:
    def run() -> None:
        for _ in range(CALLS):
            b = a + 1.0
            del b

    return run


def _microseconds_per_call(run: Callable[[], None]) -> float:
    start = time.perf_counter()
    run()
    return (time.perf_counter() - start) / CALLS * 1e6


def main() -> None:
    torch.set_num_threads(1)  # one core: the comparison is about memory, not threading
    cpu_loop = _loop(torch.randn(ELEMENTS))
    device_input = torch.randn(ELEMENTS, device="neuron")
    print(f"b = a + 1; del b on {ELEMENTS * 4 // 1024} KiB, {CALLS} calls per block, median of {ROUNDS} blocks")
    for cached in (4, 32, 64):
        torch.neuron.empty_cache()
        held = [torch.empty(ELEMENTS, device="neuron") for _ in range(cached)]
        del held  # `cached` blocks of this size are now in the allocator's cache
        neuron_loop = _loop(device_input)
        neuron_loop()
        cpu_loop()
        neuron_times, cpu_times = [], []
        for _ in range(ROUNDS):
            neuron_times.append(_microseconds_per_call(neuron_loop))
            cpu_times.append(_microseconds_per_call(cpu_loop))
        neuron_us, cpu_us = statistics.median(neuron_times), statistics.median(cpu_times)
        ratio = statistics.median(n / c for n, c in zip(neuron_times, cpu_times))
        print(f"  {cached:3d} blocks cached: neuron {neuron_us:6.2f} us  cpu {cpu_us:6.2f} us  neuron/cpu {ratio:.2f}")


if __name__ == "__main__":
    main()
