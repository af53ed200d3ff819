"""Registers the ``"neuron"`` backend with ``torch.distributed`` for the ``neuron`` device."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from neuron_dist import (
    _C,
    _bound_device,
    _ddp_hooks,
    _default_backend,
    _dtensor_random,
    _monitored_barrier,
    _pg_timeout,
    _sequence_numbers,
    _zero_overlap,
)
from neuron_dist._process_group import BACKEND_NAME, ProcessGroupNeuron

__all__ = ["register"]


# Devices one backend instance serves: neuron tensors, and CPU tensors (object collectives,
# CPU-side bookkeeping) on the same ordered stream, as "cpu:gloo,neuron:neuron" would need two.
_DEVICES = [BACKEND_NAME, "cpu"]


def _create(options: Any, backend_options: Any = None) -> _C.PythonBackend:
    """Backend factory ``init_process_group`` and ``new_group`` call (extended API).

    Returns a C++ ``Backend`` that torch's ``ProcessGroup`` registers for every device in
    :data:`_DEVICES`, so collectives pass through the ``c10d`` dispatcher ops as gloo's and
    NCCL's do (dispatch modes such as ``CommDebugMode`` see them).
    """
    _dtensor_random.install()
    impl = ProcessGroupNeuron(
        options.store,
        options.group_rank,
        options.group_size,
        options.timeout,
        global_ranks=list(options.global_ranks_in_group),
    )
    return _C.PythonBackend(options.group_rank, options.group_size, impl, BACKEND_NAME)


def _serve_fake_groups() -> None:
    """Lets torch's ``"fake"`` process group take neuron tensors, as it takes CUDA, HPU and XPU ones.

    ``FakeProcessGroup`` (dry runs with ``init_process_group("fake")``, PyTorch's LocalTensor
    tests) moves no data. torch registers it for a fixed device list when its module is first
    imported; it is registered again here with neuron added, and DTensor's random ops on its
    neuron meshes take the per-rank path as on real neuron groups.
    """
    from torch.testing._internal.distributed import fake_pg

    devices = dist.Backend.backend_capability.get(dist.Backend.FAKE, [])
    if BACKEND_NAME in devices:
        return
    create_fake_group = fake_pg._create_fake_pg

    def create(common_options: Any, backend_options: Any = None) -> Any:
        _dtensor_random.install()
        return create_fake_group(common_options, backend_options)

    dist.Backend.register_backend(dist.Backend.FAKE, create, extended_api=True, devices=[*devices, BACKEND_NAME])


def register() -> None:
    """Makes ``init_process_group("neuron")`` create a :class:`ProcessGroupNeuron` backend (idempotent)."""
    if BACKEND_NAME in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=_DEVICES)
    _serve_fake_groups()
    _ddp_hooks.install()
    _default_backend.install()
    _bound_device.install()
    _monitored_barrier.install()
    _pg_timeout.install()
    _sequence_numbers.install()
    _zero_overlap.install()
    _dtensor_random.install_when_imported()
