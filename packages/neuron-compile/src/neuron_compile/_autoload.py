"""Entry point of the ``torch.backends`` group: ``import torch`` calls :func:`autoload`.

Only routes the default ``torch.compile`` backend's neuron graphs to the neuron compiler (see
:mod:`neuron_compile._default_backend`) and arms Dynamo's optimizer handling for neuron
parameters (:mod:`neuron_compile._compiled_optimizers`), and makes AOTInductor refuse neuron
programs with a clear error (:mod:`neuron_compile._aoti`) and torch's RNG-functionalisation
operators take neuron tensors (:mod:`neuron_compile._rng_functionalization`), and registers
Dynamo's device interface for neuron (:mod:`neuron_compile._device_interface`); the compiler itself
is imported on first use.
"""

from __future__ import annotations


def arm_torch_patches() -> None:
    """Arms the patches of torch modules that must act on neuron tensors in any backend
    (each applied when its module is imported; idempotent)."""
    from neuron_compile import _aoti, _compiled_optimizers, _device_interface, _rng_functionalization

    _compiled_optimizers.install()
    _aoti.install()
    _rng_functionalization.install()
    _device_interface.install()


def autoload() -> None:
    """Makes ``torch.compile(model)`` on neuron tensors use the neuron compiler."""
    from neuron_runtime._autoload import autoload as register_device

    register_device()
    from neuron_compile import _default_backend

    _default_backend.install()
    arm_torch_patches()
