"""neuron-dist: the ``"neuron"`` torch.distributed backend for the emulated Trainium device.

``import torch`` registers it (through the ``torch.backends`` entry point
``neuron_dist._autoload``), so ``init_process_group("neuron")`` under ``torchrun`` connects one
process per NeuronCore. Collectives run on gloo's transport over zero-copy CPU views of device
memory; DeviceMesh, DTensor, FSDP2, tensor parallelism and distributed checkpoints work on top.
"""

from __future__ import annotations

import neuron_runtime  # noqa: F401  (the device must exist before its backend)

from neuron_dist._errors import (
    CollectiveArgumentError,
    CollectiveMismatchError,
    CollectivePeerError,
    CollectiveTimeoutError,
    UnsupportedDeviceError,
)
from neuron_dist._process_group import BACKEND_NAME, ProcessGroupNeuron
from neuron_dist._registration import register

__all__ = [
    "BACKEND_NAME",
    "CollectiveArgumentError",
    "CollectiveMismatchError",
    "CollectivePeerError",
    "CollectiveTimeoutError",
    "ProcessGroupNeuron",
    "UnsupportedDeviceError",
    "register",
    "__version__",
]
__version__ = "0.1.0"

register()
