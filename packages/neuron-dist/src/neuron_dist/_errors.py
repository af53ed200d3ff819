"""The errors the neuron process group raises, each naming what went wrong and where."""

from __future__ import annotations

import torch.distributed as dist

__all__ = [
    "CollectiveMismatchError",
    "CollectivePeerError",
    "CollectiveTimeoutError",
    "UnsupportedDeviceError",
]


class CollectiveTimeoutError(dist.DistBackendError):
    """A collective did not complete within the process group's timeout."""


class CollectivePeerError(dist.DistBackendError):
    """A collective failed because a peer rank went away (exited or crashed) or the transport broke."""


class CollectiveMismatchError(RuntimeError):
    """Ranks called a collective with different operations, shapes, dtypes, roots or reduce ops."""


class UnsupportedDeviceError(RuntimeError):
    """A collective was given tensors on a device the neuron backend does not serve."""
