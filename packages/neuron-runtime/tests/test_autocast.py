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


def test_higher_order_operators_run_under_autocast():
    # torch.cond, flex attention and activation checkpointing's RNG operators are
    # HigherOrderOperators; they fall through the CPU and CUDA autocast keys, and failed on
    # neuron's ("could not find kernel ... at dispatch key AutocastPrivateUse1").
    from torch.nn.attention.flex_attention import flex_attention

    torch.manual_seed(0)
    x = torch.randn(4, 4, device="neuron")
    q = torch.randn(1, 2, 8, 4, device="neuron")
    with torch.autocast("neuron", dtype=torch.bfloat16):
        chosen = torch.cond(x.sum() > 0, lambda a: a @ a, lambda a: a @ a.t(), (x,))
        attended = flex_attention(q, q, q)
    assert chosen.dtype == torch.bfloat16  # autocast applied inside the branch
    expected = x @ x if x.sum() > 0 else x @ x.t()
    torch.testing.assert_close(chosen.float().cpu(), expected.cpu(), rtol=2e-2, atol=5e-2)
    reference = torch.nn.functional.scaled_dot_product_attention(q, q, q)
    torch.testing.assert_close(attended.float().cpu(), reference.cpu(), rtol=2e-2, atol=2e-2)
