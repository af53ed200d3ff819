"""Random number generator state of the neuron cores (torch.cuda.random's API)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch._compile import _disable_dynamo  # lazy: imports Dynamo on first call only

from neuron_runtime import _C

__all__ = [
    "default_generators", "get_rng_state", "get_rng_state_all", "initial_seed", "manual_seed",
    "manual_seed_all", "seed", "seed_all", "set_rng_state", "set_rng_state_all",
]


class _DefaultGenerators:
    """Lazy tuple-like view of each core's default torch.Generator."""

    def __getitem__(self, index: int | slice) -> Any:
        # Indexed as torch.cuda.default_generators (a tuple): [-1] is the last core, slices
        # work, and a core past the last raises IndexError.
        return tuple(self)[index]

    def __len__(self) -> int:
        return _C._device_count()

    def __iter__(self):  # type: ignore[no-untyped-def]
        return (_C._default_generator(i) for i in range(len(self)))


default_generators = _DefaultGenerators()


def _generator(device: Any = None) -> torch.Generator:
    from neuron_runtime.neuron import _device_index

    return _C._default_generator(_device_index(device))


@_disable_dynamo  # a graph break, as for torch.cuda's (Dynamo skips those by name)
def get_rng_state(device: Any = "neuron") -> torch.Tensor:
    """The RNG state of a core as a ByteTensor (on the CPU)."""
    return _generator(device).get_state()


@_disable_dynamo  # a graph break, as for torch.cuda's (Dynamo skips those by name)
def get_rng_state_all() -> list[torch.Tensor]:
    """The RNG states of all cores."""
    return [get_rng_state(i) for i in range(_C._device_count())]


@_disable_dynamo  # a graph break, as for torch.cuda's (Dynamo skips those by name)
def set_rng_state(new_state: torch.Tensor, device: Any = "neuron") -> None:
    """Restores a core's RNG state from get_rng_state's result."""
    # As torch.cuda: the state must be a CPU ByteTensor (the generator raises TypeError
    # otherwise); only its layout is fixed here. No tensor op on a contiguous state: callers
    # restore states inside dispatch modes (LocalTensor's per-rank RNG under DTensor's fake
    # sharding propagation), where even a clone of a real tensor is refused.
    state = new_state if new_state.is_contiguous() else new_state.contiguous()
    _generator(device).set_state(state)


@_disable_dynamo  # a graph break, as for torch.cuda's (Dynamo skips those by name)
def set_rng_state_all(new_states: Iterable[torch.Tensor]) -> None:
    """Restores every core's RNG state."""
    for index, state in enumerate(new_states):
        set_rng_state(state, index)


def manual_seed(seed: int) -> None:
    """Seeds the current core's generator."""
    _generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    """Seeds every core's generator (torch.manual_seed calls this)."""
    if _C._device_count() == 0:
        return
    for index in range(_C._device_count()):
        _C._default_generator(index).manual_seed(int(seed))


def seed() -> None:
    """Seeds the current core's generator with a random number."""
    _generator().seed()


def seed_all() -> None:
    """Seeds every core's generator with one random number."""
    value = _generator(0).seed()
    for index in range(1, _C._device_count()):
        _C._default_generator(index).manual_seed(value)


def initial_seed() -> int:
    """The seed the current core's generator started from."""
    return _generator().initial_seed()
