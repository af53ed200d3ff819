"""The errors the neuron process group raises, each naming what went wrong and where."""

from __future__ import annotations

import torch.distributed as dist

__all__ = [
    "CollectiveArgumentError",
    "CollectiveMismatchError",
    "CollectivePeerError",
    "CollectiveTimeoutError",
    "UnsupportedDeviceError",
]


class CollectiveTimeoutError(dist.DistBackendError):
    """A collective did not complete within the process group's timeout."""


class CollectivePeerError(dist.DistBackendError):
    """A collective failed because a peer rank went away (exited or crashed) or the transport broke."""


class CollectiveArgumentError(ValueError, RuntimeError):
    """A collective was called with arguments it cannot run with on any rank (a root outside the
    group, lists of the wrong length, tensors of mixed dtypes or sizes, a strided view). Raised when
    the call is made, before anything is sent. A ``RuntimeError`` too, as gloo's refusals are."""


class CollectiveMismatchError(RuntimeError):
    """Ranks called a collective with different operations, shapes, dtypes, roots or reduce ops."""


class UnsupportedDeviceError(RuntimeError):
    """A collective was given tensors on a device the neuron backend does not serve."""
