"""Dynamo compiles a neuron optimizer step as it compiles a CUDA one: ``capturable=True``.

When Dynamo traces ``optimizer.step()`` whose state is not initialised yet, it sets
``capturable=True`` on param groups whose parameters are all CUDA or XPU, so that the step
counts live on the device and the foreach kernels take device tensors. Neuron parameters were
left out. Neuron optimizers default to ``foreach=True`` (a PrivateUse1 device counts as
foreach-capable), and the non-capturable foreach path is broken under tracing on every device
(PyTorch's own ``test_closure_graph_break`` fails on the CPU with ``foreach=True``: Adam passes
a CPU scalars tensor to ``_foreach_addcdiv_``, whose fake kernel refuses it). A step after a
graph break (``step(closure)``) therefore failed on neuron with any backend, and a CPU step
count was later replaced by a device copy mid-run (``test_guard_on_none_grads``). Neuron
parameter groups now get the same treatment as CUDA's.

Installed at ``import torch`` as a post-import hook on Dynamo's optimizer module, so that it
applies to every backend (``backend="eager"`` too) without importing Dynamo early.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

__all__ = ["install"]

_MODULE = "torch._dynamo.variables.optimizer"
_MARK = "_neuron_capturable"


def _on_capturable_device(param: Any) -> bool:
    return param.is_cuda or param.is_xpu or param.device.type == "neuron"


def _patch(module: ModuleType) -> None:
    variable = getattr(module, "OptimizerVariable", None)
    original = getattr(variable, "_set_capturable", None)
    if original is None or getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def _set_capturable(self: Any, tx: Any) -> None:
        for group in self.value.param_groups:
            params = group.get("params", [])
            # Upstream's rule with neuron added: only groups of device parameters whose state
            # is not initialised yet; upstream handles CUDA/XPU-only groups itself.
            if ("capturable" in group and any(p.device.type == "neuron" for p in params)
                    and all(_on_capturable_device(p) for p in params)
                    and all(p not in self.value.state for p in params)):
                group["capturable"] = True
        original(self, tx)

    setattr(_set_capturable, _MARK, True)
    variable._set_capturable = _set_capturable


def install() -> None:
    """Arms the patch: applied when Dynamo's optimizer module is imported (now, if it is)."""
    from neuron_runtime._post_import import install_finder, register_post_import_hook

    install_finder()
    register_post_import_hook(_MODULE, _patch)
