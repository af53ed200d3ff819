"""Entry point of the ``torch.backends`` group: ``import torch`` calls :func:`autoload`.

Entry points run in no guaranteed order, so the runtime is registered first (idempotent): the
backend needs the ``neuron`` device name. neuron-dist depends on the runtime, never the reverse.
"""

from __future__ import annotations


def autoload() -> None:
    """Registers the neuron device (if not yet) and the ``"neuron"`` c10d backend."""
    from neuron_runtime._autoload import autoload as register_device

    register_device()
    from neuron_dist._registration import register

    register()
