"""DLPack exchange of neuron tensors: the protocol (``torch.from_dlpack(tensor)``) and capsules."""

from __future__ import annotations

import pytest
import torch
from torch.utils.dlpack import DLDeviceType, from_dlpack, to_dlpack


@pytest.mark.parametrize("index", [0, 1])
def test_from_dlpack_shares_the_neuron_tensor(index):
    # Failed with "Unknown device type neuron for Dlpack": torch's __dlpack_device__ knew an
    # out-of-tree device only by the name "privateuse1".
    x = torch.arange(12.0).reshape(3, 4).to(f"neuron:{index}")
    assert x.__dlpack_device__() == (DLDeviceType.kDLExtDev, index)
    y = torch.from_dlpack(x)
    assert y.device == x.device and y.data_ptr() == x.data_ptr()
    y[0, 0] = 100.0  # one memory: the write shows through x
    assert x[0, 0].item() == 100.0
    strided = x.t()
    z = torch.from_dlpack(strided)
    assert z.stride() == strided.stride() and torch.equal(z.cpu(), strided.cpu())


def test_capsules_round_trip_and_cpu_tensors_are_untouched():
    x = torch.randn(5, device="neuron", dtype=torch.bfloat16)
    y = from_dlpack(to_dlpack(x))
    assert y.device == x.device and y.dtype == x.dtype and torch.equal(y.cpu(), x.cpu())
    assert torch.ones(2).__dlpack_device__() == (DLDeviceType.kDLCPU, 0)
    assert torch.nn.Parameter(torch.ones(2, device="neuron")).__dlpack_device__()[0] == DLDeviceType.kDLExtDev
