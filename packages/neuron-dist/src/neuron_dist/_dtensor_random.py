"""DTensor's random ops on ``neuron`` meshes: every shard gets its part of one random tensor.

On CUDA, DTensor makes a random op on a sharded tensor (``nn.init`` of FSDP2 or tensor-parallel
parameters, dropout on sharded activations) give each shard its own part of the values the
unsharded op would draw, by moving the offset of CUDA's Philox generator to where each shard's
values start. The emulated device's generator is the CPU's Mersenne Twister (equal seeds give
the CPU's stream), which has no offset to move: DTensor's tracker failed on it, and drawing per
shard instead (what DTensor does on CPU meshes) gave every rank seeded alike the *same* values,
so a sharded weight started as one block repeated, and uneven shards left the ranks' generators
out of step.

So on neuron meshes each rank draws the whole tensor with its generator and keeps its shard's
part, which DTensor's own sharding picks (strided FSDP x TP shards included): the result equals
the unsharded op's for the same seed, as on CUDA, and every rank's generator advances alike. The
cost is the unsharded op's draws on each rank. ``bernoulli`` with a tensor of probabilities
(whose other shards this rank does not have), partial tensors, random ops traced by
``torch.compile`` (where the rank's mesh coordinate is symbolic) and random ops under PyTorch's
LocalTensor mode draw per shard, as before. As for CUDA meshes, DTensor's tracker starts by
giving every rank rank 0's generator state (seed every rank alike with ``torch.manual_seed``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from neuron_dist._after_import import when_imported

__all__ = ["install", "install_when_imported"]

_RANDOM = "torch.distributed.tensor._random"
_Mine = Callable[[torch.Tensor], torch.Tensor]  # a whole tensor -> this rank's part of it
_lock = threading.Lock()
_installed = False
aten = torch.ops.aten


def _in_place(func: Any, args: tuple, kwargs: dict, shape: tuple[int, ...], mine: _Mine) -> Any:
    local = args[0]
    whole = torch.empty(shape, dtype=local.dtype, device=local.device)
    func(whole, *args[1:], **kwargs)
    return local.copy_(mine(whole))


def _like(func: Any, args: tuple, kwargs: dict, shape: tuple[int, ...], mine: _Mine) -> Any:
    local = args[0]
    return mine(func(torch.empty(shape, dtype=local.dtype, device=local.device), *args[1:], **kwargs))


def _factory(func: Any, args: tuple, kwargs: dict, shape: tuple[int, ...], mine: _Mine) -> Any:
    return mine(func(list(shape), *args[1:], **kwargs))


def _dropout(func: Any, args: tuple, kwargs: dict, shape: tuple[int, ...], mine: _Mine) -> Any:
    local, p = args[0], args[1]
    train = args[2] if len(args) > 2 else kwargs.get("train")
    if train is False:
        return func(*args, **kwargs)
    # The mask depends only on the shape: draw the whole one, scale this shard as the kernel does.
    _, mask = func(torch.ones(shape, dtype=local.dtype, device=local.device), p, train)
    mask = mine(mask)
    scale = 0.0 if p == 1 else 1.0 / (1.0 - p)
    return local.mul(mask).mul_(scale), mask


# DTensor's random ops whose draws depend only on the tensor's shape, by how to run them whole.
_WHOLE_DRAWS: dict[Any, Callable[..., Any]] = {
    aten.normal_.default: _in_place,
    aten.uniform_.default: _in_place,
    aten.bernoulli_.float: _in_place,
    aten.rand_like.default: _like,
    aten.randn_like.default: _like,
    aten.randint_like.default: _like,
    aten.randint_like.low_dtype: _like,
    aten.rand.default: _factory,
    aten.randn.default: _factory,
    aten.native_dropout.default: _dropout,
}


def _part_picker(spec: Any) -> tuple[tuple[int, ...], _Mine] | None:
    """(this rank's shape, what picks its part of a whole tensor as DTensor shards it), or None
    for placements that hold no part of a whole (Partial). Picking needs no communication: every
    rank drew the same whole tensor."""
    from torch.distributed.tensor import Partial, distribute_tensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if any(isinstance(placement, Partial) for placement in spec.placements):
        return None
    local_shape, _ = compute_local_shape_and_global_offset(tuple(spec.shape), spec.mesh, spec.placements)

    def mine(whole: torch.Tensor) -> torch.Tensor:
        return distribute_tensor(whole, spec.mesh, spec.placements, src_data_rank=None).to_local().clone()

    return tuple(local_shape), mine


class _DrawWhole(TorchDispatchMode):
    """Runs the region's random op on the whole tensor and keeps this rank's part."""

    def __init__(self, spec: Any) -> None:
        super().__init__()
        self._spec = spec
        self._done = False

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        run = _WHOLE_DRAWS.get(func)
        if run is None or self._done:
            return func(*args, **kwargs)
        self._done = True  # one random op per region; anything it calls runs as it is
        picker = _part_picker(self._spec)
        if picker is None:
            return func(*args, **kwargs)
        local_shape, mine = picker
        if (tuple(args[0]) if run is _factory else tuple(args[0].shape)) != local_shape:
            return func(*args, **kwargs)  # not the local shard DTensor describes: leave it alone
        return run(func, args, kwargs, tuple(self._spec.shape), mine)


@contextlib.contextmanager
def _generator_as_default(generator: torch.Generator | None, device: torch.device) -> Iterator[None]:
    """Makes ``generator`` the device's default generator for the region (DTensor takes it out of
    the op's arguments), and hands its advanced state back afterwards."""
    if generator is None:
        yield
        return
    index = device.index if device.index is not None else torch.neuron.current_device()
    saved = torch.neuron.get_rng_state(index)
    torch.neuron.set_rng_state(generator.get_state(), index)
    try:
        yield
    finally:
        generator.set_state(torch.neuron.get_rng_state(index))
        torch.neuron.set_rng_state(saved, index)


def _tracker_class(random_module: ModuleType) -> type:
    """DTensor's ``OffsetBasedRNGTracker``, building a :class:`_DrawWholeTracker` for neuron meshes."""
    upstream = random_module.OffsetBasedRNGTracker
    base = random_module._RNGStateTracker

    class OffsetBasedRNGTracker(upstream):  # type: ignore[misc, valid-type]
        __doc__ = upstream.__doc__

        def __new__(cls, device_mesh: Any = None, *args: Any, **kwargs: Any) -> Any:
            if cls is OffsetBasedRNGTracker and getattr(device_mesh, "device_type", None) == "neuron":
                return super().__new__(_DrawWholeTracker)
            return super().__new__(cls)

    class _DrawWholeTracker(OffsetBasedRNGTracker):
        """DTensor's RNG tracker for neuron meshes: whole draws, this rank's part kept."""

        def __init__(self, device_mesh: Any, run_state_sync: bool = True) -> None:
            base.__init__(self, torch.device("neuron", torch.neuron.current_device()))
            if run_state_sync:  # as DTensor does for CUDA: every rank starts from rank 0's state
                state = torch.neuron.get_rng_state().to(self._device)
                torch.distributed.broadcast(state, 0)
                torch.neuron.set_rng_state(state.cpu())

        @contextlib.contextmanager
        def _distribute_region(self, spec: Any, generator: torch.Generator | None = None) -> Iterator[None]:
            from torch.distributed._functional_collectives import _are_we_tracing
            from torch.distributed._local_tensor import enabled_local_tensor_mode

            # Compiled programs (the mesh coordinate is symbolic there) and LocalTensor mode: per shard.
            if not self.distribute_region_enabled or enabled_local_tensor_mode() or _are_we_tracing():
                with _generator_as_default(generator, self._device):
                    yield
                return
            with _generator_as_default(generator, self._device), _DrawWhole(spec):
                yield

        def _manual_seed(self, parallel_seed: int) -> None:
            torch.neuron.manual_seed(parallel_seed)

    return OffsetBasedRNGTracker


def _patch(random_module: ModuleType) -> None:
    global _installed
    with _lock:
        if _installed:
            return
        random_module.OffsetBasedRNGTracker = _tracker_class(random_module)
        _installed = True


def install() -> None:
    """Makes DTensor's random ops on neuron meshes draw whole tensors (idempotent)."""
    from torch.distributed.tensor import _random

    _patch(_random)


def install_when_imported() -> None:
    """:func:`install` now if DTensor is loaded, else as soon as it is: DTensor random ops on a
    neuron mesh must work whichever process group made the mesh (PyTorch's threaded test group
    too), and importing DTensor at ``import torch`` would cost every program half a second."""
    when_imported(_RANDOM, _patch)
