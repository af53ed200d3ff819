"""The speculation's prediction and stand-in values, in one process (the 2- and 4-rank behaviour is
the ``speculated_collectives_...`` case of test_collectives.py)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from neuron_dist import _config
from neuron_dist._speculation import NO_LAUNCH, LaunchKey, Predictor, _identity

R = dist.ReduceOp.RedOpType
BIG_SUM = LaunchKey("all_reduce", torch.float32, 1 << 20, R.SUM)
GATHER = LaunchKey("all_gather", torch.bfloat16, 1 << 19)


def _header(name: str) -> tuple[int, ...]:
    return (hash(name),)


def _feed(predictor: Predictor, pattern: list[tuple[str, LaunchKey | None]]) -> list[LaunchKey | None]:
    """Feeds one pass of ``pattern``; returns what was predicted before each collective."""
    predicted = []
    for name, key in pattern:
        predicted.append(predictor.predict())
        predictor.record(_header(name), key.words() if key is not None else NO_LAUNCH)
    return predicted


def test_launch_keys_round_trip_through_header_words() -> None:
    for key in (BIG_SUM, GATHER, LaunchKey("reduce_scatter", torch.int8, 64, R.MAX)):
        assert LaunchKey.from_words(key.words()) == key


def test_a_repeating_step_is_predicted_exactly_from_its_second_pass() -> None:
    # a training step: a run of three equal gathers, a reduction, a small barrier-like call
    step = [("gather", GATHER)] * 3 + [("sum", BIG_SUM), ("barrier", None)]
    predictor = Predictor()
    # first pass: nothing known, except a guess once the gathers repeated (a miss at the sum)
    assert _feed(predictor, step) == [None, None, None, GATHER, None]
    # second: all learnt but what follows the barrier (the step's first call, seen at the end)
    assert _feed(predictor, step) == [None, GATHER, GATHER, BIG_SUM, None]
    for _ in range(3):
        assert _feed(predictor, step) == [GATHER, GATHER, GATHER, BIG_SUM, None]


def test_a_long_loop_is_predicted_beyond_the_run_lengths_seen() -> None:
    predictor = Predictor()
    predicted = _feed(predictor, [("sum", BIG_SUM)] * 50)
    assert predicted[:2] == [None, None]
    assert predicted[3:] == [BIG_SUM] * 47  # run lengths never seen: by the previous header alone


def test_a_loop_exit_does_not_unlearn_the_loop() -> None:
    # the same successor key after (sum, run 1) most times, once something else
    predictor = Predictor()
    cycle = [("sum", BIG_SUM), ("gather", GATHER), ("sum", BIG_SUM), ("gather", GATHER),
             ("sum", BIG_SUM), ("barrier", None)]
    _feed(predictor, cycle)
    _feed(predictor, cycle)
    predicted = _feed(predictor, cycle)
    assert predicted[1] == GATHER and predicted[3] == GATHER, predicted


def test_a_successor_that_depends_on_earlier_calls_is_told_apart() -> None:
    # bench/collectives.py's blocks: a barrier is followed by the collective or by another barrier,
    # depending on the runs before it (ABBA order of timed blocks)
    cycle = [("barrier", None), ("sum", BIG_SUM), ("sum", BIG_SUM), ("barrier", None), ("barrier", None),
             ("barrier", None), ("sum", BIG_SUM), ("sum", BIG_SUM), ("barrier", None)]
    predictor = Predictor()
    for _ in range(3):
        _feed(predictor, cycle)
    expected = [key for _, key in cycle]
    for _ in range(3):
        assert _feed(predictor, cycle) == expected


def test_a_mismatch_forgets_the_previous_collective() -> None:
    predictor = Predictor()
    _feed(predictor, [("sum", BIG_SUM)] * 4)
    assert predictor.predict() == BIG_SUM
    predictor.forget_previous()
    assert predictor.predict() is None


_FLOATS = (torch.float32, torch.bfloat16, torch.float64)
_INTEGRAL = (torch.int32, torch.int64, torch.int8, torch.uint8, torch.bool)
_ARITHMETIC = (R.SUM, R.PRODUCT, R.MIN, R.MAX)
_BITWISE = (R.BAND, R.BOR, R.BXOR)


@pytest.mark.parametrize(
    ("dtype", "op"),
    [(d, o) for d in _FLOATS for o in _ARITHMETIC] + [(d, o) for d in _INTEGRAL for o in _ARITHMETIC + _BITWISE],
)
def test_stand_in_values_leave_the_other_ranks_values_unchanged(dtype: torch.dtype, op: R) -> None:
    gen = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        x = torch.randint(0, 2, (257,), generator=gen).bool()
    elif dtype.is_floating_point:
        x = torch.cat([torch.randn(250, generator=gen), torch.tensor([0.0, -0.0, 1e30, -1e30, 3.5, -7.0, 1.0])])
        x = x.to(dtype)
    else:
        info = torch.iinfo(dtype)
        x = torch.cat([torch.randint(info.min, info.max, (250,), generator=gen, dtype=torch.int64).to(dtype),
                       torch.tensor([info.min, info.max, 0, 1, -1 if info.min < 0 else 2], dtype=dtype)])
    stand_in = torch.full_like(x, _identity(dtype, op))
    combine = {R.SUM: torch.add, R.PRODUCT: torch.mul, R.MIN: torch.minimum, R.MAX: torch.maximum,
               R.BAND: torch.bitwise_and, R.BOR: torch.bitwise_or, R.BXOR: torch.bitwise_xor}[op]
    if dtype == torch.bool and op in (R.SUM, R.PRODUCT):
        combine = {R.SUM: torch.logical_or, R.PRODUCT: torch.logical_and}[op]  # gloo's bool SUM / PRODUCT
    out = combine(x, stand_in)
    assert torch.equal(out, x)
    if dtype.is_floating_point:  # the sign of zero too
        assert torch.equal(torch.signbit(out), torch.signbit(x))


def test_speculation_setting_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURON_DIST_SPECULATE", "yes")
    with pytest.raises(ValueError, match="NEURON_DIST_SPECULATE must be 0 or 1"):
        _config._load()
    monkeypatch.setenv("NEURON_DIST_SPECULATE", "0")
    assert _config._load().speculate is False


def test_the_payload_size_is_predicted_with_the_successor() -> None:
    """The exchange frame is sized for the predicted collective: after a barrier (no payload),
    the first of a run of 64 KiB all-gathers; the frame for the barrier after them is small."""
    predictor = Predictor()
    step = [("barrier", 0)] + [("gather", 1 << 16)] * 3
    predicted = []
    for _ in range(4):
        for name, wanted in step:
            predicted.append(predictor.next_collective()[1])
            predictor.record(_header(name), NO_LAUNCH, wanted)
    assert predicted[-4:] == [0, 1 << 16, 1 << 16, 1 << 16]
    assert predicted[-8:-4] == [0, 1 << 16, 1 << 16, 1 << 16]
    assert all(p is None for p in predicted[:2])  # nothing known before anything was exchanged
