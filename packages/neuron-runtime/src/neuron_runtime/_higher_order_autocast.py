"""Higher-order operators pass through neuron's autocast key, as they do CUDA's and the CPU's.

torch makes every ``HigherOrderOperator`` (``torch.cond``, flex attention, activation
checkpointing's RNG operators, ``invoke_subgraph``...) fall through the autocast keys of the
devices it knows (``AutocastCPU``, ``AutocastCUDA``, ``AutocastXPU``): autocast then applies
to the operators inside them. Without the same for ``AutocastPrivateUse1``, any of them called
on neuron tensors under ``torch.autocast("neuron")`` failed with "could not find kernel for
HigherOrderOperator ... at dispatch key DispatchKey.AutocastPrivateUse1" (``torch.cond`` and
flex attention in eager; a compiled, gradient-checkpointed bf16 training step, TRL's default).
Installing adds the key to torch's list for operators created later and to every existing one.
"""

from __future__ import annotations

import torch
from torch._C import DispatchKey

__all__ = ["install"]


def install() -> None:
    """Makes every higher-order operator fall through ``AutocastPrivateUse1`` (idempotent)."""
    from torch import _ops

    key = DispatchKey.AutocastPrivateUse1
    defaults = getattr(_ops, "_HIGHER_ORDER_OP_DEFAULT_FALLTHROUGH_DISPATCH_KEYS", None)
    if isinstance(defaults, list) and key not in defaults:
        defaults.append(key)
    for operator in list(getattr(_ops, "_higher_order_ops", {}).values()):
        if isinstance(operator, torch._ops.HigherOrderOperator) and key not in operator.py_kernels:
            operator.fallthrough(key)
