"""Every fix, one file per library; importing this imports none of those libraries."""

from __future__ import annotations

from neuron_hf._fix import Fix
from neuron_hf.fixes import accelerate, peft, safetensors, transformers, trl

__all__ = ["ALL_FIXES"]

ALL_FIXES: tuple[Fix, ...] = (*accelerate.FIXES, *transformers.FIXES, *trl.FIXES, *peft.FIXES, *safetensors.FIXES)
