"""BucketedCausalLM on a small Llama on the neuron device: exact outputs, and graphs bounded by buckets."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
import torch
from torch import nn

from neuron_compile.buckets import MultipleOfBuckets
from neuron_compile.causal_lm import BucketedCausalLM
from neuron_compile.padding import BucketCollator

transformers = pytest.importorskip("transformers")

POLICY = MultipleOfBuckets(16, 64)
VOCAB = 256
TOL = {"rtol": 1e-5, "atol": 1e-5}


def _llama(num_hidden_layers: int = 2, **overrides) -> nn.Module:
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        **overrides,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).to("neuron", torch.float32).eval()


@pytest.fixture(scope="module")
def model() -> nn.Module:
    return _llama()


@pytest.fixture(scope="module")
def one_layer_model() -> nn.Module:
    """For the compile tests: the graph count does not depend on depth, compile time does."""
    return _llama(num_hidden_layers=1)


@pytest.fixture(autouse=True)
def _fresh_dynamo(model):
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    model.zero_grad(set_to_none=True)


def _ids(length: int, batch: int = 2, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, length), generator=generator).to("neuron")


def _seen_lengths(model: nn.Module) -> tuple[list[int], Callable[[], None]]:
    """Records the sequence length of every call to ``model``; returns the list and a remover."""
    seen: list[int] = []
    handle = model.register_forward_pre_hook(
        lambda _, args, kwargs: seen.append(kwargs["input_ids"].size(1)), with_kwargs=True
    )
    return seen, handle.remove


@pytest.mark.parametrize("side", ["right", "left"])
def test_logits_hidden_states_loss_and_gradients_match_the_unpadded_model(model, side):
    ids = _ids(11)
    reference = model(input_ids=ids, labels=ids, output_hidden_states=True, use_cache=False)
    reference.loss.backward()
    reference_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)

    seen, remove = _seen_lengths(model)
    try:
        out = BucketedCausalLM(model, POLICY, padding_side=side)(ids, labels=ids, output_hidden_states=True)
    finally:
        remove()
    assert seen == [16]  # the model ran on the bucket, not on 11 tokens

    assert out.logits.device.type == "neuron"
    torch.testing.assert_close(out.logits, reference.logits, **TOL)
    assert len(out.hidden_states) == len(reference.hidden_states)
    for got, want in zip(out.hidden_states, reference.hidden_states):
        torch.testing.assert_close(got, want, **TOL)
    # Labels padded with -100 (and, on the left, the first real label masked): same loss.
    torch.testing.assert_close(out.loss, reference.loss, **TOL)
    out.loss.backward()
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, reference_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_left_padding_keeps_absolute_positions():
    """Llama's rotary positions are relative, so a shift would go unseen there; GPT-2 learns
    absolute position embeddings, so left padding must give real tokens positions 0..n-1."""
    config = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=64)
    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(config).to("neuron").eval()
    ids = _ids(11)
    with torch.no_grad():
        reference = gpt2(input_ids=ids, labels=ids, use_cache=False)
        out = BucketedCausalLM(gpt2, POLICY, padding_side="left")(ids, labels=ids)
    torch.testing.assert_close(out.logits, reference.logits, **TOL)
    torch.testing.assert_close(out.loss, reference.loss, **TOL)


@pytest.mark.parametrize("side", ["right", "left"])
def test_attentions_are_sliced_to_the_real_tokens(side):
    model = _llama(attn_implementation="eager")
    ids = _ids(5)
    with torch.no_grad():
        reference = model(input_ids=ids, output_attentions=True, use_cache=False)
        out = BucketedCausalLM(model, POLICY, padding_side=side)(ids, output_attentions=True)
    for got, want in zip(out.attentions, reference.attentions, strict=True):
        assert got.shape == want.shape == (2, 4, 5, 5)
        torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize("side", ["right", "left"])
def test_collated_batch_loss_is_the_loss_over_real_tokens(model, side):
    lengths = [3, 9, 14]
    examples = [{"input_ids": _ids(n, batch=1, seed=n)[0].cpu()} for n in lengths]
    for example in examples:
        example["labels"] = example["input_ids"].clone()
    batch = BucketCollator(POLICY, 0, padding_side=side)(examples)
    assert batch["input_ids"].shape == (3, 16)
    with torch.no_grad():
        loss = model(**{k: v.to("neuron") for k, v in batch.items()}, use_cache=False).loss
        # Each unpadded example scores n - 1 next tokens; the batch loss is their token mean.
        total = sum(
            model(input_ids=e["input_ids"][None].to("neuron"), labels=e["labels"][None].to("neuron")).loss * (n - 1)
            for e, n in zip(examples, lengths)
        )
    torch.testing.assert_close(loss, total / sum(n - 1 for n in lengths), **TOL)


def _backend_under_test() -> Callable | None:
    """The lead's "neuron" backend once it loads; None while its module is not written yet."""
    if "neuron" in torch._dynamo.list_backends():
        try:
            return torch._dynamo.lookup_backend("neuron")
        except ModuleNotFoundError as e:
            if e.name != "neuron_compile.backend":
                raise
    return None


class _GraphCounter:
    """A Dynamo backend that records the token shapes of every graph, then compiles it with the
    neuron backend if it is available, or runs it as traced."""

    def __init__(self) -> None:
        self.inner = _backend_under_test()
        self.sequence_lengths: list[int] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        lengths = {
            t.size(1) for t in example_inputs if isinstance(t, torch.Tensor) and t.dtype == torch.long and t.dim() == 2
        }
        assert len(lengths) == 1, f"expected one token tensor shape per graph, got {lengths}"
        self.sequence_lengths.extend(lengths)
        return self.inner(gm, example_inputs) if self.inner is not None else gm.forward


# Raise the recompile limit so that an unbucketed length compiles (and is counted) instead of
# silently falling back to eager once the limit is hit.
_NO_RECOMPILE_LIMIT = {"recompile_limit": 256, "accumulated_recompile_limit": 1024}


@pytest.mark.parametrize("compiled", ["model", "wrapper"])
def test_any_mix_of_lengths_compiles_at_most_one_graph_per_bucket(one_layer_model, compiled, fresh_compiler):
    """Forward graphs (inference: a training step adds only the backward of the same graph)."""
    model = one_layer_model
    counter = _GraphCounter()
    if compiled == "model":
        bucketed = BucketedCausalLM(torch.compile(model, backend=counter, dynamic=False), POLICY)
    else:
        bucketed = torch.compile(BucketedCausalLM(model, POLICY), backend=counter, dynamic=False)
    lengths = [random.Random(i).randint(1, POLICY.max_length) for i in range(20)]
    with torch._dynamo.config.patch(**_NO_RECOMPILE_LIMIT), torch.no_grad():
        for step, length in enumerate(lengths):
            ids = _ids(length, seed=step)
            out = bucketed(ids, labels=ids)
            assert out.logits.shape == (2, length, VOCAB)
            reference = model(input_ids=ids, labels=ids, use_cache=False)
            torch.testing.assert_close(out.loss, reference.loss, rtol=1e-4, atol=1e-4)

    buckets_hit = {POLICY.bucket_for(n) for n in lengths}
    assert buckets_hit == set(POLICY.buckets())  # the lengths exercise every bucket
    assert sorted(counter.sequence_lengths) == sorted(buckets_hit)
    assert len(counter.sequence_lengths) <= POLICY.max_length // POLICY.multiple


def test_the_graph_counter_sees_every_unbucketed_length(fresh_compiler):
    """The control for the test above: without buckets, each length is its own graph."""
    torch.manual_seed(0)
    toy = nn.Sequential(nn.Embedding(VOCAB, 8), nn.Linear(8, 4)).to("neuron")
    counter = _GraphCounter()
    compiled = torch.compile(toy, backend=counter, dynamic=False)
    with torch._dynamo.config.patch(**_NO_RECOMPILE_LIMIT):
        for length in (3, 5, 9, 3):
            compiled(_ids(length))
    assert counter.sequence_lengths == [3, 5, 9]

    torch._dynamo.reset()
    counter = _GraphCounter()
    compiled = torch.compile(toy, backend=counter, dynamic=False)

    def call(input_ids, **_):
        return {"logits": compiled(input_ids)}

    bucketed = BucketedCausalLM(call, POLICY)  # any callable model works
    for length in (3, 5, 9, 3):
        assert bucketed(_ids(length))["logits"].shape == (2, length, 4)
    assert counter.sequence_lengths == [16]


def test_pad_token_defaults_to_the_model_config_then_zero():
    assert BucketedCausalLM(_llama(pad_token_id=5)).pad_token_id == 5
    assert BucketedCausalLM(_llama()).pad_token_id == 0
    assert BucketedCausalLM(_llama(), pad_token_id=3).pad_token_id == 3
    assert BucketedCausalLM(_llama()).policy == MultipleOfBuckets(128, 2048)


def test_bad_calls(model):
    bucketed = BucketedCausalLM(model, POLICY)
    with pytest.raises(ValueError, match="sequence length 65 exceeds the maximum length 64"):
        bucketed(_ids(65))
    with pytest.raises(ValueError, match="past_key_values"):
        bucketed(_ids(4), past_key_values=transformers.DynamicCache())
    with pytest.raises(ValueError, match="use_cache=False"):
        bucketed(_ids(4), use_cache=True)
    with pytest.raises(TypeError, match="return_dict=False"):
        bucketed(_ids(4), return_dict=False)
    with pytest.raises(ValueError, match="padding_side"):
        BucketedCausalLM(model, POLICY, padding_side="center")
