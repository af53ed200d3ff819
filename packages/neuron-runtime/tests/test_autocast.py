"""torch.autocast("neuron"): CUDA's cast policies on the neuron autocast key."""

from __future__ import annotations

import pytest
import torch


def test_supported_dtypes():
    assert torch.bfloat16 in torch.neuron.get_amp_supported_dtype()


def test_matmul_runs_in_bf16_and_softmax_in_fp32():
    a = torch.randn(8, 8, device="neuron")
    with torch.autocast("neuron", dtype=torch.bfloat16):
        assert torch.is_autocast_enabled("neuron")
        mm = a @ a
        lin = torch.nn.functional.linear(a, a)
        soft = torch.softmax(mm, -1)
        loss = torch.nn.functional.cross_entropy(mm, torch.zeros(8, dtype=torch.long, device="neuron"))
        mixed = torch.addcmul(a, mm, a)  # promote: widest input type
    assert mm.dtype == torch.bfloat16 and lin.dtype == torch.bfloat16
    assert soft.dtype == torch.float32 and loss.dtype == torch.float32
    assert mixed.dtype == torch.float32


def test_autocast_matches_cpu_autocast():
    torch.manual_seed(0)
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = a @ b
    with torch.autocast("neuron", dtype=torch.bfloat16):
        got = a.to("neuron") @ b.to("neuron")
    torch.testing.assert_close(got.cpu(), expected)


def test_autocast_training_step_backward():
    model = torch.nn.Linear(8, 4).to("neuron")
    with torch.autocast("neuron", dtype=torch.bfloat16):
        out = model(torch.randn(2, 8, device="neuron"))
    out.float().sum().backward()
    assert model.weight.grad.dtype == torch.float32


def test_binary_cross_entropy_is_banned_as_on_cuda():
    # CUDA refuses BCE under autocast (log of a low-precision probability); neuron computed it
    # silently in half precision. BCE with logits stays allowed and runs in float32.
    x = torch.randn(2, 3, device="neuron")
    target = torch.rand(2, 3, device="neuron")
    with torch.autocast("neuron", dtype=torch.bfloat16):
        probabilities = torch.sigmoid(x @ torch.randn(3, 3, device="neuron"))
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            torch.nn.functional.binary_cross_entropy(probabilities, target)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(x @ torch.randn(3, 3, device="neuron"), target)
    assert loss.dtype == torch.float32
    # outside autocast it is an ordinary op
    assert torch.nn.functional.binary_cross_entropy(torch.sigmoid(x), target).dtype == torch.float32
