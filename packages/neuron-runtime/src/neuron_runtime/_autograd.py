"""Backward of neuron tensors runs on the thread that calls it, as it does for CPU tensors.

PyTorch's autograd engine hands the backward work of every non-CPU device to a per-device
worker thread (for CUDA that thread feeds the GPU's streams). On the emulated device the work
is host CPU code, so the hand-over buys nothing and costs a lot: each thread that enters an
OpenMP region gets its own OpenMP team, and the caller's team keeps spinning after the forward
while the device thread's team runs the backward, so on a small machine the two teams fight
for the same cores (a small Llama training step measured 1.5x slower in backward).

``torch.autograd.set_multithreading_enabled(False)`` is PyTorch's documented switch for
"run all backward work on the calling thread"; it is thread-local, so it is set here for the
thread that loads the runtime (the main thread: ``import torch`` loads it). Threads started
later keep PyTorch's default and still get correct results on the device threads.
``TORCH_NEURONX_AUTOGRAD_DEVICE_THREADS=1`` keeps PyTorch's default everywhere.
"""

from __future__ import annotations

import torch


def run_backward_on_calling_thread(device_threads: bool) -> None:
    """Unless ``device_threads``, makes this thread run neuron backward work itself."""
    if not device_threads:
        torch.autograd.set_multithreading_enabled(False)
