"""When the glue acts: only when the current accelerator is the neuron device."""

from __future__ import annotations

import torch

__all__ = ["on_neuron"]


def on_neuron() -> bool:
    """True when torch's current accelerator is ``neuron`` and it has usable cores."""
    accelerator = torch.accelerator.current_accelerator()
    if accelerator is None or accelerator.type != "neuron":
        return False
    neuron = getattr(torch, "neuron", None)
    return neuron is not None and neuron.is_available()
