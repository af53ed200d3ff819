"""DDP's bf16 gradient-compression hook on the ``"neuron"`` backend.

``DistributedDataParallel.register_comm_hook`` refuses ``bf16_compress_hook`` unless torch was
built with CUDA and NCCL >= 2.10, or XPU and XCCL: a build-time proxy for "the collective
library reduces bfloat16". The neuron backend reduces bfloat16 (as Trainium's collectives do),
so for DDP models on a neuron process group the hook is accepted; every other check (callable,
annotations) still runs, and other backends keep torch's rule.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from torch.nn.parallel import DistributedDataParallel

from neuron_dist._groups import serves_neuron

_BF16_HOOKS = ("bf16_compress_hook", "bf16_compress_wrapper_hook")
_original_check: Callable[[Any, Any], None] | None = None


def _check_comm_hook(self: DistributedDataParallel, hook: Any) -> None:
    assert _original_check is not None
    if getattr(hook, "__name__", None) in _BF16_HOOKS and serves_neuron(self.process_group):
        # Same signature (functools.wraps), another name: torch's remaining checks still apply.
        renamed = functools.wraps(hook)(lambda *args, **kwargs: hook(*args, **kwargs))
        renamed.__name__ = f"neuron_{hook.__name__}"
        return _original_check(self, renamed)
    return _original_check(self, hook)


def install() -> None:
    """Patches DistributedDataParallel._check_comm_hook (idempotent)."""
    global _original_check
    if _original_check is not None:
        return
    _original_check = DistributedDataParallel._check_comm_hook
    DistributedDataParallel._check_comm_hook = _check_comm_hook  # type: ignore[method-assign]
