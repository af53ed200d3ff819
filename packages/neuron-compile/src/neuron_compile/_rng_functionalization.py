"""torch's RNG-functionalisation operators on neuron tensors.

When a compiled graph recomputes a random op in its backward (activation checkpointing under
``torch.compile``; SDPA and dropout's ``rand`` are tagged ``nondeterministic_seeded``),
AOTAutograd's partitioner wraps the op in ``run_and_save_rng_state`` in the forward and
``run_with_rng_state`` in the backward, so that both draw from the same generator state. torch
implements the two operators for CUDA, CPU, HPU and XPU only, through fixed tables: on neuron
tensors the compiled step failed with ``AssertionError: Backend not supported for neuron``
(every TRL trainer with ``torch_compile=True``, whose configs turn gradient checkpointing on).
They now have neuron kernels that save and restore the core's generator state, as the CUDA
kernels do with CUDA's, and neuron tensors are routed to them. Armed at ``import torch``
through a post-import hook on ``torch._prims.rng_prims``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._C import DispatchKey

__all__ = ["install"]

_MODULE = "torch._prims.rng_prims"
_MARK = "_neuron_compile_routes_neuron"


def _run_and_save_on_neuron(op: Any, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    return torch.neuron.get_rng_state(), op(*args, **kwargs)


def _run_with_state_on_neuron(rng_state: torch.Tensor, op: Any, *args: Any, **kwargs: Any) -> Any:
    current = torch.neuron.get_rng_state()
    torch.neuron.set_rng_state(rng_state.cpu())
    try:
        return op(*args, **kwargs)
    finally:
        torch.neuron.set_rng_state(current)


def _route_neuron(hop: Any, neuron_kernel: Callable[..., Any], leading: int, get_device: Callable[..., Any]) -> None:
    """Gives ``hop`` a neuron kernel; its backend selection sends neuron operands there.

    ``leading``: arguments before the op's own operands (the op; the state and the op).
    """
    original = hop.py_kernels.get(DispatchKey.BackendSelect)
    if original is None or getattr(original, _MARK, False):
        return

    def backend_select(*args: Any, **kwargs: Any) -> Any:
        if get_device(args[leading:], kwargs) == "neuron":
            return neuron_kernel(*args, **kwargs)
        return original(*args, **kwargs)

    setattr(backend_select, _MARK, True)
    hop.py_kernels.pop(DispatchKey.BackendSelect)
    if DispatchKey.PrivateUse1 not in hop.py_kernels:
        hop.py_impl(DispatchKey.PrivateUse1)(neuron_kernel)
    hop.py_impl(DispatchKey.BackendSelect)(backend_select)
    getattr(hop, "_dispatch_cache", {}).clear()


def _patch(module: Any) -> None:
    _route_neuron(module.run_and_save_rng_state, _run_and_save_on_neuron, 1, module.get_device)
    _route_neuron(module.run_with_rng_state, _run_with_state_on_neuron, 2, module.get_device)


def install() -> None:
    """Arms the patch: applied when ``torch._prims.rng_prims`` is imported (now, if it is)."""
    from neuron_runtime._post_import import install_finder, register_post_import_hook

    install_finder()
    register_post_import_hook(_MODULE, _patch)
