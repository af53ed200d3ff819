"""DDP + ZeRO's interleaved overlap hook on neuron groups: refused, as torch refuses it on gloo.

``hook_with_zero_step_interleaved`` broadcasts each bucket's updated parameters from inside the
all-reduce future's callback. On NCCL a future completes when its work is queued, so those
broadcasts are issued in program order; on gloo and neuron it completes when the data has moved,
on another thread, so one rank may issue a bucket's broadcast before the next bucket's
all-reduce and another rank after it. torch refuses gloo groups for this ("may meet hangs");
on neuron the ranks' signature check caught the disorder partway through training as a
collective mismatch. It is now refused when the hook is made, with the alternative named:
``hook_with_zero_step`` (broadcasts once, after the last bucket) works on neuron.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

from neuron_dist._after_import import when_imported
from neuron_dist._groups import serves_neuron

__all__ = ["install"]

_MODULE = "torch.distributed.algorithms.ddp_comm_hooks.ddp_zero_hook"
_PATCHED = "_neuron_refuses_interleaved"


def _patch(module: ModuleType) -> None:
    original = module.hook_with_zero_step_interleaved
    if getattr(original, _PATCHED, False):
        return

    @functools.wraps(original)
    def hook_with_zero_step_interleaved(hook: Any, ddp: Any, zero: Any, *args: Any, **kwargs: Any) -> Any:
        if serves_neuron(ddp.process_group):
            raise RuntimeError(
                "neuron: hook_with_zero_step_interleaved issues collectives from future callbacks, "
                "whose order can differ between ranks on the neuron backend (as on gloo, which torch "
                "refuses for it). Use hook_with_zero_step, which overlaps the ZeRO step with "
                "backward and works on neuron."
            )
        return original(hook, ddp, zero, *args, **kwargs)

    setattr(hook_with_zero_step_interleaved, _PATCHED, True)
    module.hook_with_zero_step_interleaved = hook_with_zero_step_interleaved


def install() -> None:
    """Guards ``hook_with_zero_step_interleaved`` once DDP's ZeRO hook module is imported."""
    when_imported(_MODULE, _patch)
