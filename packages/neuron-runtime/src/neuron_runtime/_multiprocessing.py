"""Neuron tensors through ``torch.multiprocessing`` queues and pipes.

torch shares CPU storages through shared memory and CUDA storages through CUDA IPC; for any
other device its reducer calls a CPU-only sharing method, which fails inside the queue's
feeder thread: the item is dropped and the receiver waits forever. The emulator's device
memory is private to each process, so a neuron storage travels by value instead: its bytes go
through a shared-memory CPU storage and the receiver copies them onto the same core index.
The receiver gets a copy, not shared memory (unlike CUDA IPC): writes in one process are not
seen by the other.
"""

from __future__ import annotations

from multiprocessing import context, reduction
from typing import Any, Callable

import torch
from torch.multiprocessing import reductions

_default_reduce_storage: Callable[[Any], Any] | None = None


def _rebuild_neuron_storage(host: torch.UntypedStorage, index: int) -> torch.UntypedStorage:
    flat = torch.empty(0, dtype=torch.uint8).set_(host)
    return flat.to(torch.device("neuron", index)).untyped_storage()


def _keep_until_spawned(host: torch.UntypedStorage) -> None:
    # Pickled for a process being spawned (a Process argument), the host copy's shared-memory
    # file descriptor is only recorded, and handed to the child when it starts: the copy must
    # outlive pickling, so it lives as long as the parent's handle on that child.
    popen = context.get_spawning_popen()
    if popen is not None:
        popen.__dict__.setdefault("_neuron_host_copies", []).append(host)


def _reduce_storage(storage: Any) -> Any:
    if storage.device.type == "neuron":
        host = storage.cpu()
        _keep_until_spawned(host)
        return (_rebuild_neuron_storage, (host, storage.device.index))
    assert _default_reduce_storage is not None
    return _default_reduce_storage(storage)


def install() -> None:
    """Registers the by-value reducer for storages (idempotent)."""
    global _default_reduce_storage
    if _default_reduce_storage is not None:
        return
    _default_reduce_storage = reductions.reduce_storage
    reduction.register(torch.UntypedStorage, _reduce_storage)
