"""Padding a Hugging Face style batch along its sequence dimension up to a shape bucket.

``pad_batch`` pads a rectangular batch (every tensor ``[batch, seq]``) up to
``policy.bucket_for(seq)`` and returns a ``PaddedBatch`` that remembers the real length, so
outputs can be sliced back with ``PaddedBatch.unpad``. ``BucketCollator`` does the same for a
``DataLoader``: it pads a list of variable-length examples to the bucket of the longest one.

What each key is padded with (the sequence dimension is the last one):

==================  =====================================================================
key                 padding
==================  =====================================================================
``input_ids``       ``pad_token_id``
``attention_mask``  0; created (1 on real tokens, 0 on padding) when the batch has none, so
                    every padded batch has one and the keys the model sees never change
``labels``          -100, the index Hugging Face losses ignore
``position_ids``    right padding: continued (last position + 1, + 2, ...); left padding: 0
``token_type_ids``  0
``inputs_embeds``   refused (ValueError): pass ``input_ids``
anything else       left unchanged, unless ``pad_values`` gives a value for it
==================  =====================================================================

Padding only ever adds tokens that real tokens cannot see (they are masked out, and on the right
a causal model never looks ahead), so the outputs at real positions are unchanged. Other keys are
not padded by guesswork: a tensor that happens to have the sequence length somewhere
(``pixel_values``, per-example scalars) is passed through, and ``pad_values`` names any extra
``[batch, seq]`` key and the value to pad it with. The known keys must be ``[batch, seq]``: a 4-D
attention mask is refused rather than padded.

Left padding (``padding_side="left"``) needs two more things to stay exact:

- positions: a model that is given no ``position_ids`` numbers the columns from 0, which after
  left padding would shift the real tokens. So when the batch has none, ``position_ids`` are
  created: ``0 .. length-1`` on the real tokens, as the unpadded model would have used.
- labels: a causal LM scores position ``i`` against ``labels[i + 1]``. After left padding the
  last pad position would be scored against the first real token, a term the unpadded loss does
  not have. With ``causal_labels=True`` (the default) that first real label is set to -100; it is
  never a target in the unpadded batch either. Pass ``causal_labels=False`` for per-token labels
  (token classification), which are not shifted.

Tensors stay on their device (neuron or CPU) and keep their dtype; nothing is copied between
devices.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from .buckets import BucketPolicy

__all__ = ["BucketCollator", "PaddedBatch", "pad_batch"]

PaddingSide = Literal["left", "right"]

_IGNORE_INDEX = -100
"""The label Hugging Face (and ``torch.nn.CrossEntropyLoss``) ignores."""

# Keys padded along their last dimension, and with what; "input_ids" uses pad_token_id and
# "position_ids" is continued, so they are handled apart.
_FIXED_PAD_VALUES: dict[str, int] = {
    "attention_mask": 0,
    "labels": _IGNORE_INDEX,
    "token_type_ids": 0,
}
_SEQUENCE_KEYS = ("input_ids", "attention_mask", "labels", "position_ids", "token_type_ids")


@dataclass(frozen=True)
class PaddedBatch:
    """A batch padded to a bucket, and what is needed to slice outputs back to the real length."""

    batch: dict[str, Any]
    """The padded batch: pass it to the model as ``model(**padded.batch)``."""
    length: int
    """The real sequence length, before padding."""
    padded_length: int
    """The bucket the batch was padded to."""
    padding_side: PaddingSide = "right"

    @property
    def start(self) -> int:
        """Index of the first real column in the padded batch."""
        return self.padded_length - self.length if self.padding_side == "left" else 0

    def unpad(self, output: Tensor, dim: int = 1) -> Tensor:
        """The real-token part of ``output`` along ``dim`` (a view; 1 for ``[batch, seq, ...]``)."""
        if output.size(dim) != self.padded_length:
            raise ValueError(
                f"cannot unpad a tensor of shape {tuple(output.shape)}: dimension {dim} has size "
                f"{output.size(dim)}, expected the padded length {self.padded_length}"
            )
        return output.narrow(dim, self.start, self.length)


def pad_batch(
    batch: Mapping[str, Any],
    policy: BucketPolicy,
    pad_token_id: int,
    *,
    padding_side: PaddingSide = "right",
    causal_labels: bool = True,
    pad_values: Mapping[str, int | float] | None = None,
) -> PaddedBatch:
    """Pad ``batch`` along its sequence dimension to ``policy.bucket_for(length)``.

    ``batch`` maps names to tensors; ``input_ids``, ``attention_mask``, ``labels``,
    ``position_ids`` and ``token_type_ids`` (those present) must be ``[batch, seq]`` (or
    ``[1, seq]`` for ``position_ids``) with one common ``seq``. How each key is padded, and why
    left padding creates ``position_ids`` and masks one label, is in the module docstring.

    Raises ValueError if the length exceeds the policy's maximum, or the sequence keys disagree.
    """
    length = _sequence_length(batch, pad_values)
    return _pad_to(
        batch,
        length,
        policy.bucket_for(length),
        pad_token_id,
        padding_side=padding_side,
        causal_labels=causal_labels,
        pad_values=pad_values,
    )


@dataclass(frozen=True)
class BucketCollator:
    """A ``DataLoader`` ``collate_fn`` that pads variable-length examples to one bucket.

    Each example maps names to 1-D token sequences (lists or tensors) and other values. The
    sequence keys of ``pad_batch`` (and those in ``pad_values``) are padded per example to the
    bucket of the longest example, exactly as ``pad_batch`` pads them, and stacked; every other
    key goes through ``torch.utils.data.default_collate`` and so must already have one shape.
    The batch is a plain dict of CPU tensors, ready for ``model(**batch)`` after moving it to the
    device; padded label positions are -100, so Hugging Face losses only count real tokens.

    An example longer than the policy's maximum raises ValueError: truncate in the tokenizer
    (``truncation=True, max_length=policy.max_length``) or raise the maximum.
    """

    policy: BucketPolicy
    pad_token_id: int
    padding_side: PaddingSide = "right"
    causal_labels: bool = True
    pad_values: Mapping[str, int | float] = field(default_factory=dict)

    def __call__(self, examples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        if not examples:
            raise ValueError("BucketCollator got an empty list of examples")
        padded_keys = set(_SEQUENCE_KEYS) | set(self.pad_values)
        rows: list[dict[str, Any]] = []
        lengths: list[int] = []
        for i, example in enumerate(examples):
            row = {
                k: _as_row(v, k, i) if k in padded_keys else v for k, v in example.items()
            }
            lengths.append(_sequence_length(row, self.pad_values))
            rows.append(row)
        bucket = self.policy.bucket_for(max(lengths))
        padded = [
            _pad_to(
                row,
                length,
                bucket,
                self.pad_token_id,
                padding_side=self.padding_side,
                causal_labels=self.causal_labels,
                pad_values=self.pad_values,
            ).batch
            for row, length in zip(rows, lengths)
        ]
        keys = padded[0].keys()
        for i, row in enumerate(padded):
            if row.keys() != keys:
                raise ValueError(
                    f"example {i} has keys {sorted(row)}, but example 0 has {sorted(keys)}; "
                    "every example must have the same keys"
                )
        out: dict[str, Any] = {}
        for key in keys:
            values = [row[key] for row in padded]
            if key in padded_keys:
                out[key] = torch.cat(values, dim=0)
            else:
                out[key] = torch.utils.data.default_collate(values)
        return out


def _as_row(value: Any, key: str, index: int) -> Tensor:
    """One example's 1-D sequence as a ``[1, seq]`` tensor."""
    tensor = value if isinstance(value, Tensor) else torch.as_tensor(value)
    if tensor.dim() != 1:
        raise ValueError(
            f"example {index}: {key!r} must be a 1-D sequence, got shape {tuple(tensor.shape)}"
        )
    return tensor.unsqueeze(0)


def _sequence_length(batch: Mapping[str, Any], pad_values: Mapping[str, Any] | None) -> int:
    """The common last-dimension size of the sequence keys present in ``batch``."""
    if batch.get("inputs_embeds") is not None:
        raise ValueError(
            "cannot pad inputs_embeds: bucket padding pads token ids; pass input_ids instead"
        )
    keys = [*_SEQUENCE_KEYS, *(k for k in (pad_values or {}) if k not in _SEQUENCE_KEYS)]
    sizes: dict[str, int] = {}
    for key in keys:
        value = batch.get(key)
        if value is None:
            continue
        if not isinstance(value, Tensor):
            raise TypeError(f"{key!r} must be a tensor, got {type(value).__name__}")
        if value.dim() != 2:
            raise ValueError(
                f"{key!r} must be [batch, seq] to be padded, got shape {tuple(value.shape)}"
            )
        sizes[key] = value.size(-1)
    if not sizes:
        raise ValueError(
            f"nothing to pad: the batch has none of {list(_SEQUENCE_KEYS)} (keys: {sorted(batch)})"
        )
    if len(set(sizes.values())) > 1:
        raise ValueError(f"sequence keys disagree on the sequence length: {sizes}")
    return next(iter(sizes.values()))


def _pad_to(
    batch: Mapping[str, Any],
    length: int,
    target: int,
    pad_token_id: int,
    *,
    padding_side: PaddingSide,
    causal_labels: bool,
    pad_values: Mapping[str, int | float] | None,
) -> PaddedBatch:
    """Pad the ``length``-long sequence keys of ``batch`` to exactly ``target`` columns."""
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    if length <= 0:
        raise ValueError(f"cannot pad an empty sequence (length {length})")
    if isinstance(pad_token_id, bool):
        raise TypeError(f"pad_token_id must be an int, got {pad_token_id!r}")
    try:
        pad_token_id = operator.index(pad_token_id)
    except TypeError:
        raise TypeError(f"pad_token_id must be an int, got {pad_token_id!r}") from None
    pad = target - length
    left = padding_side == "left"
    values = {**_FIXED_PAD_VALUES, "input_ids": pad_token_id, **(pad_values or {})}

    out = dict(batch)
    reference = next(batch[k] for k in _SEQUENCE_KEYS if batch.get(k) is not None)
    if out.get("attention_mask") is None:
        out["attention_mask"] = torch.ones(
            reference.size(0), length, dtype=torch.long, device=reference.device
        )
    if left and out.get("position_ids") is None:
        out["position_ids"] = torch.arange(length, device=reference.device).unsqueeze(0)
    if left and causal_labels and out.get("labels") is not None and pad:
        labels = out["labels"].clone()
        labels[:, 0] = _IGNORE_INDEX
        out["labels"] = labels

    if pad:
        for key, value in out.items():
            if key == "position_ids" and value is not None:
                out[key] = _pad_positions(value, pad, left)
            elif key in values and value is not None:
                out[key] = F.pad(value, (pad, 0) if left else (0, pad), value=values[key])
    return PaddedBatch(out, length, target, padding_side)


def _pad_positions(positions: Tensor, pad: int, left: bool) -> Tensor:
    """Right: continue each row (last + 1, last + 2, ...); left: pad with 0."""
    if left:
        return F.pad(positions, (pad, 0), value=0)
    step = torch.arange(1, pad + 1, dtype=positions.dtype, device=positions.device)
    return torch.cat([positions, positions[:, -1:] + step], dim=-1)

