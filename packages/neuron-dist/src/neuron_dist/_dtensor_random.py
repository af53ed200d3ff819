"""DTensor's random ops on ``neuron`` meshes: each rank's own generator, as on CPU meshes.

DTensor coordinates random ops across ranks only on devices whose generator is a Philox
(seed, offset) pair, as CUDA's is: it rewrites the offset of the state before each op. It
recognises such devices by their having ``set_rng_state``, which ``torch.neuron`` has for the
checkpointing code of accelerate and transformers; but the emulated device's generator is
the CPU's Mersenne Twister (equal seeds give the CPU's stream), whose 5056-byte state DTensor
cannot rewrite: every random op on a neuron DTensor (``nn.init`` of FSDP2 or TP parameters,
dropout on sharded activations) failed with an AssertionError inside DTensor.

Neuron meshes therefore take DTensor's path for CPU meshes: a random op on a DTensor runs on
each rank's local shard with that rank's generator (seed ranks as the program needs: equal
seeds give equal draws on every shard). As for CPU meshes, DTensor's own
``manual_seed(seed, mesh)`` warns and seeds nothing: seed with ``torch.manual_seed``.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["install"]

_lock = threading.Lock()
_installed = False


def install() -> None:
    """Makes DTensor treat neuron meshes like CPU meshes for random ops (idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        from torch.distributed.tensor import _dispatch, _random

        upstream = _random.is_rng_supported_mesh

        def is_rng_supported_mesh(device_mesh: Any) -> bool:
            if getattr(device_mesh, "device_type", None) == "neuron":
                return False
            return upstream(device_mesh)

        is_rng_supported_mesh.__doc__ = upstream.__doc__
        is_rng_supported_mesh.__wrapped__ = upstream  # type: ignore[attr-defined]
        # _api and manual_seed read the module attribute; _dispatch imported the name.
        _random.is_rng_supported_mesh = is_rng_supported_mesh
        if getattr(_dispatch, "is_rng_supported_mesh", None) is upstream:
            _dispatch.is_rng_supported_mesh = is_rng_supported_mesh
        _installed = True
