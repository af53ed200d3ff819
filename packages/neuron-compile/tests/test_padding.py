"""pad_batch and BucketCollator: pad values per key, position ids, left padding, devices, errors."""

from __future__ import annotations

import pickle

import pytest
import torch
from torch.utils.data import DataLoader

from neuron_compile.buckets import MultipleOfBuckets
from neuron_compile.padding import BucketCollator, pad_batch

POLICY = MultipleOfBuckets(8, 32)
PAD = 7


def _batch(device: str = "cpu", length: int = 5) -> dict[str, torch.Tensor]:
    ids = torch.arange(10, 10 + 2 * length, device=device).view(2, length)
    return {
        "input_ids": ids,
        "attention_mask": torch.ones(2, length, dtype=torch.long, device=device),
        "labels": ids + 100,
        "position_ids": torch.arange(3, 3 + length, device=device).expand(2, length),
        "token_type_ids": torch.ones(2, length, dtype=torch.long, device=device),
    }


@pytest.mark.parametrize("device", ["cpu", "neuron"])
def test_right_padding_values_per_key(device):
    batch = _batch(device)
    padded = pad_batch(batch, POLICY, PAD)
    out = padded.batch
    assert (padded.length, padded.padded_length, padded.padding_side) == (5, 8, "right")
    for key, value in out.items():
        assert value.shape == (2, 8), key
        assert value.device == batch[key].device and value.dtype == batch[key].dtype, key
        assert torch.equal(value[:, :5], batch[key]), key
    assert (out["input_ids"][:, 5:] == PAD).all()
    assert (out["attention_mask"][:, 5:] == 0).all()
    assert (out["labels"][:, 5:] == -100).all()
    assert (out["token_type_ids"][:, 5:] == 0).all()


def test_position_ids_are_continued_per_row():
    batch = {
        "input_ids": torch.zeros(2, 3, dtype=torch.long),
        "position_ids": torch.tensor([[0, 1, 2], [10, 11, 12]]),
    }
    out = pad_batch(batch, POLICY, PAD).batch
    assert out["position_ids"].tolist() == [[0, 1, 2, 3, 4, 5, 6, 7], [10, 11, 12, 13, 14, 15, 16, 17]]


def test_position_ids_with_a_broadcast_batch_dimension():
    batch = {"input_ids": torch.zeros(4, 6, dtype=torch.long), "position_ids": torch.arange(6)[None]}
    assert pad_batch(batch, POLICY, PAD).batch["position_ids"].tolist() == [list(range(8))]


@pytest.mark.parametrize("device", ["cpu", "neuron"])
def test_left_padding(device):
    batch = _batch(device)
    padded = pad_batch(batch, POLICY, PAD, padding_side="left")
    out = padded.batch
    assert padded.start == 3
    assert (out["input_ids"][:, :3] == PAD).all() and torch.equal(out["input_ids"][:, 3:], batch["input_ids"])
    assert (out["attention_mask"][:, :3] == 0).all() and (out["attention_mask"][:, 3:] == 1).all()
    assert (out["position_ids"][:, :3] == 0).all()
    assert torch.equal(out["position_ids"][:, 3:], batch["position_ids"])
    # Causal labels: the pad just before the first real token must not be scored against it.
    assert (out["labels"][:, :4] == -100).all()
    assert torch.equal(out["labels"][:, 4:], batch["labels"][:, 1:])
    assert out["labels"].device == batch["labels"].device
    # The caller's tensors are not modified.
    assert (batch["labels"] >= 100).all()


def test_left_padding_with_per_token_labels_keeps_every_label():
    batch = _batch()
    out = pad_batch(batch, POLICY, PAD, padding_side="left", causal_labels=False).batch
    assert torch.equal(out["labels"][:, 3:], batch["labels"])


def test_left_padding_creates_position_ids_the_unpadded_model_would_use():
    batch = {"input_ids": torch.ones(2, 5, dtype=torch.long)}
    out = pad_batch(batch, POLICY, PAD, padding_side="left").batch
    assert out["position_ids"].tolist() == [[0, 0, 0, 0, 1, 2, 3, 4]]
    assert out["attention_mask"].tolist() == [[0, 0, 0, 1, 1, 1, 1, 1]] * 2


def test_right_padding_creates_a_mask_but_no_position_ids():
    out = pad_batch({"input_ids": torch.ones(2, 5, dtype=torch.long)}, POLICY, PAD).batch
    assert set(out) == {"input_ids", "attention_mask"}
    assert out["attention_mask"].tolist() == [[1] * 5 + [0] * 3] * 2


def test_length_already_at_a_bucket_is_unchanged_but_gets_a_mask():
    ids = torch.ones(2, 16, dtype=torch.long)
    padded = pad_batch({"input_ids": ids}, POLICY, PAD)
    assert padded.padded_length == 16 and padded.batch["input_ids"] is ids
    assert padded.batch["attention_mask"].shape == (2, 16)


def test_existing_padding_inside_the_batch_is_kept():
    batch = {"input_ids": torch.ones(1, 4, dtype=torch.long), "attention_mask": torch.tensor([[1, 1, 0, 0]])}
    assert pad_batch(batch, POLICY, PAD).batch["attention_mask"].tolist() == [[1, 1, 0, 0, 0, 0, 0, 0]]


def test_bool_attention_mask():
    batch = {"input_ids": torch.ones(1, 3, dtype=torch.long), "attention_mask": torch.ones(1, 3, dtype=torch.bool)}
    mask = pad_batch(batch, POLICY, PAD).batch["attention_mask"]
    assert mask.dtype == torch.bool and mask.tolist() == [[True] * 3 + [False] * 5]


def test_other_keys_pass_through_unless_given_a_pad_value():
    extra = torch.ones(2, 5)
    pixel = torch.ones(2, 3, 5, 5)
    batch = {"input_ids": torch.ones(2, 5, dtype=torch.long), "extra": extra, "pixel_values": pixel, "flag": True}
    out = pad_batch(batch, POLICY, PAD).batch
    assert out["extra"] is extra and out["pixel_values"] is pixel and out["flag"] is True
    out = pad_batch(batch, POLICY, PAD, pad_values={"extra": -1.0}).batch
    assert out["extra"].tolist() == [[1.0] * 5 + [-1.0] * 3] * 2


def test_unpad_slices_back_to_the_real_tokens():
    for side in ("right", "left"):
        padded = pad_batch({"input_ids": torch.arange(10).view(2, 5)}, POLICY, PAD, padding_side=side)
        hidden = padded.batch["input_ids"][..., None].expand(2, 8, 4)
        assert torch.equal(padded.unpad(hidden)[..., 0], torch.arange(10).view(2, 5))
        with pytest.raises(ValueError, match="expected the padded length 8"):
            padded.unpad(torch.zeros(2, 5, 4))


def test_length_above_the_maximum():
    with pytest.raises(ValueError, match="sequence length 33 exceeds the maximum length 32"):
        pad_batch({"input_ids": torch.ones(1, 33, dtype=torch.long)}, POLICY, PAD)


@pytest.mark.parametrize(
    ("batch", "match"),
    [
        ({"input_ids": torch.ones(2, 5, dtype=torch.long), "labels": torch.ones(2, 6, dtype=torch.long)}, "disagree"),
        ({"input_ids": torch.ones(5, dtype=torch.long)}, r"\[batch, seq\]"),
        ({"attention_mask": torch.ones(2, 1, 5, 5)}, r"\[batch, seq\]"),
        ({"pixel_values": torch.ones(2, 3)}, "nothing to pad"),
        ({"input_ids": torch.ones(2, 0, dtype=torch.long)}, "positive"),
        ({"inputs_embeds": torch.ones(2, 5, 4), "attention_mask": torch.ones(2, 5)}, "inputs_embeds"),
    ],
)
def test_bad_batches(batch, match):
    with pytest.raises(ValueError, match=match):
        pad_batch(batch, POLICY, PAD)


def test_bad_arguments():
    batch = {"input_ids": torch.ones(2, 5, dtype=torch.long)}
    with pytest.raises(ValueError, match="padding_side"):
        pad_batch(batch, POLICY, PAD, padding_side="middle")
    with pytest.raises(TypeError, match="pad_token_id"):
        pad_batch(batch, POLICY, None)
    with pytest.raises(TypeError, match="must be a tensor"):
        pad_batch({"input_ids": [[1, 2]]}, POLICY, PAD)


EXAMPLES = [
    {"input_ids": [1, 2, 3], "labels": [1, 2, 3], "idx": 0},
    {"input_ids": torch.arange(4, 14), "labels": list(range(4, 14)), "idx": 1},
    {"input_ids": [14], "labels": [14], "idx": 2},
]


def test_collator_pads_every_example_to_the_bucket_of_the_longest():
    batch = BucketCollator(POLICY, PAD)(EXAMPLES)
    assert batch["input_ids"].shape == (3, 16)  # longest is 10 -> bucket 16
    assert batch["input_ids"][0].tolist() == [1, 2, 3] + [PAD] * 13
    assert batch["labels"][2].tolist() == [14] + [-100] * 15
    assert batch["attention_mask"].sum(1).tolist() == [3, 10, 1]
    assert batch["idx"].tolist() == [0, 1, 2]
    assert "position_ids" not in batch


def test_collator_left_padding():
    batch = BucketCollator(POLICY, PAD, padding_side="left")(EXAMPLES)
    assert batch["input_ids"][0].tolist() == [PAD] * 13 + [1, 2, 3]
    assert batch["position_ids"][0].tolist() == [0] * 13 + [0, 1, 2]
    assert batch["position_ids"][1].tolist() == [0] * 6 + list(range(10))
    assert batch["labels"][0].tolist() == [-100] * 14 + [2, 3]


def test_collator_in_a_data_loader():
    collator = BucketCollator(MultipleOfBuckets(4, 16), PAD)
    pickle.loads(pickle.dumps(collator))  # usable with worker processes
    lengths = [len(b["input_ids"][0]) for b in DataLoader(EXAMPLES, batch_size=2, collate_fn=collator)]
    assert lengths == [12, 4]


def test_collator_errors():
    collator = BucketCollator(POLICY, PAD)
    with pytest.raises(ValueError, match="sequence length 40 exceeds the maximum length 32"):
        collator([{"input_ids": list(range(40))}])
    with pytest.raises(ValueError, match="1-D"):
        collator([{"input_ids": [[1, 2]]}])
    with pytest.raises(ValueError, match="same keys"):
        collator([{"input_ids": [1]}, {"input_ids": [1], "labels": [1]}])
    with pytest.raises(ValueError, match="empty"):
        collator([])

