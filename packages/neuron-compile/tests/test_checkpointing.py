"""Activation checkpointing under torch.compile: random ops recomputed in the backward."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


class _Attention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)

    def block(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).view(2, 8, 3, 4, 4).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)  # tagged nondeterministic_seeded

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.block, x, use_reentrant=False).square().sum()


@pytest.mark.parametrize("backend", ["neuron", "inductor"])  # inductor: neuron graphs go to the neuron compiler
def test_checkpointed_attention_compiles_and_matches_cpu(fresh_compiler, backend):
    torch.manual_seed(0)
    reference = _Attention()
    model = copy.deepcopy(reference).to("neuron")
    x = torch.randn(2, 8, 16)
    expected = reference(x)
    expected.backward()
    loss = torch.compile(model, backend=backend)(x.to("neuron"))
    loss.backward()
    torch.testing.assert_close(loss.cpu(), expected.detach())
    for want, got in zip(reference.parameters(), model.parameters()):
        torch.testing.assert_close(got.grad.cpu(), want.grad)


def test_checkpointed_dropout_recomputes_the_forwards_mask_and_leaves_the_generator_alone(fresh_compiler):
    weight = torch.randn(64, 64, device="neuron", requires_grad=True)

    def loss_of(x: torch.Tensor) -> torch.Tensor:
        return checkpoint(lambda t: F.dropout(t, 0.5, training=True) * weight, x, use_reentrant=False)

    compiled = torch.compile(loss_of, backend="neuron")
    x = torch.randn(64, 64, device="neuron")
    torch.neuron.manual_seed(3)
    out = compiled(x)
    state_after_forward = torch.neuron.get_rng_state()
    out.sum().backward()
    # d(sum(mask * x * w))/dw = mask * x: equal to out / w only if the backward drew the same mask
    torch.testing.assert_close((weight.grad * weight).cpu(), out.detach().cpu())
    assert 0.3 < (out != 0).float().mean().item() < 0.7
    assert torch.equal(torch.neuron.get_rng_state(), state_after_forward)


def test_a_gradient_checkpointed_llama_compiled_step_matches_cpu(fresh_compiler):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa")
    torch.manual_seed(0)
    reference = LlamaForCausalLM(config)
    model = copy.deepcopy(reference).to("neuron")
    for each in (reference, model):
        each.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        each.train()
    ids = torch.randint(0, 128, (2, 16))
    expected = reference(input_ids=ids, labels=ids).loss
    expected.backward()
    loss = torch.compile(model, backend="neuron")(input_ids=ids.to("neuron"), labels=ids.to("neuron")).loss
    loss.backward()
    torch.testing.assert_close(loss.cpu(), expected.detach())
    for (name, want), got in zip(reference.named_parameters(), model.parameters()):
        torch.testing.assert_close(got.grad.cpu(), want.grad, msg=name)
