"""``BucketedCausalLM``: run a (compiled) causal LM on bucket-padded inputs, return real-length outputs.

A compiled model compiles one graph per input shape. Wrapping it as
``BucketedCausalLM(torch.compile(model, backend="neuron"), policy)`` pads every call's
``[batch, seq]`` inputs up to ``policy.bucket_for(seq)`` (see ``neuron_compile.padding``), calls the
model, and slices the outputs back, so any mix of lengths up to ``policy.max_length`` compiles at
most ``len(policy.buckets())`` graphs, and callers see the same outputs as from the unpadded model:

- ``logits``, every ``hidden_states`` entry (``[batch, seq, ...]``) and every ``attentions`` entry
  (``[batch, heads, seq, seq]``) are sliced back to the real tokens.
- ``loss`` is the model's own: padded labels are -100, which Hugging Face's loss ignores, so it is
  the mean over the real tokens only, equal to the unpadded model's loss.
- Other outputs are returned as the model produced them.

The wrapper is for full-sequence forward passes (training, evaluation, scoring, prefill). It runs
the model with ``use_cache=False`` and refuses ``past_key_values``: a key/value cache built on
padded inputs holds the pad tokens, and incremental decoding needs a static cache instead.

Compile the model inside the wrapper, as above. Compiling the wrapper itself also works: padding
and slicing run outside the compiled graph (they depend on the real length, which would otherwise
be specialised into every graph), and the model call in between sees only bucket shapes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from .buckets import BucketPolicy, MultipleOfBuckets
from .padding import PaddedBatch, PaddingSide, pad_batch

__all__ = ["BucketedCausalLM"]


class BucketedCausalLM(nn.Module):
    """Pads inputs to a shape bucket, calls ``model``, and slices outputs back to the real length.

    Args:
        model: a causal LM taking Hugging Face keyword inputs (``input_ids``, ``attention_mask``,
            ``labels``, ...) and returning a ``ModelOutput`` or dict (a module or any callable); typically
            ``torch.compile(model, backend="neuron")``.
        policy: the buckets; default ``MultipleOfBuckets()`` (multiples of 128 up to 2048).
        pad_token_id: the token to pad ``input_ids`` with; default ``model.config.pad_token_id``,
            else 0. Padded positions are masked out, so the choice never changes real outputs.
        padding_side: ``"right"`` (default) or ``"left"``; left padding creates the position ids
            and masks the one label it would otherwise add to the loss (see
            ``neuron_compile.padding``).
    """

    def __init__(
        self,
        model: nn.Module | Callable[..., Any],
        policy: BucketPolicy | None = None,
        pad_token_id: int | None = None,
        *,
        padding_side: PaddingSide = "right",
    ) -> None:
        super().__init__()
        if padding_side not in ("left", "right"):
            raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
        self.model = model
        self.policy = policy if policy is not None else MultipleOfBuckets()
        self.pad_token_id = pad_token_id if pad_token_id is not None else _config_pad_id(model)
        self.padding_side = padding_side

    # Dynamo skips this frame (it would guard on the real length) but still compiles the model
    # call inside it when the wrapper itself is compiled; padding and slicing never get traced.
    @torch._dynamo.disable(recursive=False)
    def forward(self, input_ids: Tensor | None = None, **inputs: Any) -> Any:
        """``model(input_ids, **inputs)`` on bucket-padded inputs, outputs at the real length."""
        padded = self._pad({"input_ids": input_ids, **inputs})
        output = self.model(**padded.batch)
        return self._unpad(output, padded)

    @torch._dynamo.disable
    def _pad(self, inputs: dict[str, Any]) -> PaddedBatch:
        if inputs.get("past_key_values") is not None:
            raise ValueError(
                "BucketedCausalLM does not take past_key_values: a cache built on padded inputs "
                "holds pad tokens; run incremental decoding on the unwrapped model"
            )
        if inputs.get("use_cache"):
            raise ValueError("BucketedCausalLM runs the model with use_cache=False")
        batch = {k: v for k, v in inputs.items() if v is not None}
        batch["use_cache"] = False
        return pad_batch(batch, self.policy, self.pad_token_id, padding_side=self.padding_side)

    @torch._dynamo.disable
    def _unpad(self, output: Any, padded: PaddedBatch) -> Any:
        if not isinstance(output, Mapping):
            raise TypeError(
                f"BucketedCausalLM needs the model to return a ModelOutput or dict, got "
                f"{type(output).__name__}; do not pass return_dict=False"
            )
        for key in ("logits", "hidden_states", "attentions"):
            value = output.get(key)
            if value is None:
                continue
            if key == "logits":
                output[key] = padded.unpad(value, dim=1)
            elif key == "hidden_states":
                output[key] = tuple(padded.unpad(h, dim=1) for h in value)
            else:
                output[key] = tuple(padded.unpad(padded.unpad(a, dim=-1), dim=-2) for a in value)
        return output

    def extra_repr(self) -> str:
        return f"policy={str(self.policy)!r}, pad_token_id={self.pad_token_id}, padding_side={self.padding_side!r}"


def _config_pad_id(model: nn.Module) -> int:
    """``model.config.pad_token_id`` if the model has one, else 0."""
    config = getattr(model, "config", None)
    pad = getattr(config, "pad_token_id", None)
    return pad if isinstance(pad, int) and not isinstance(pad, bool) else 0
