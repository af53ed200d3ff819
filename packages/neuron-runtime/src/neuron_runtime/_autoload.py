"""Entry point of the ``torch.backends`` group: ``import torch`` calls :func:`autoload`.

Kept apart from the package ``__init__`` so that importing ``neuron_runtime`` before torch
(which makes torch run this entry point mid-import) does not hit a half-initialised module.
"""

from __future__ import annotations


def autoload() -> None:
    """Registers the neuron device."""
    from neuron_runtime import _backend

    _backend.register()
