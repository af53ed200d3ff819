"""Failures: timeouts name the collective, its sequence number and the missing ranks; a dead
rank makes the others fail within the timeout. (Mismatches and wrong devices: test_collectives.)"""

from __future__ import annotations

import time

import pytest

from conftest import assert_case, launch, results


def test_timeout_names_collective_sequence_and_missing_ranks(tmp_path) -> None:
    proc = launch("failures.py", tmp_path, 2, "timeout", timeout=120)
    per_rank = results(tmp_path, 2, proc)
    text = assert_case(per_rank, "timeout_names_collective_sequence_and_missing_ranks")[0]
    assert "timed out" in text


def test_failed_collective_raises_from_its_future(tmp_path) -> None:
    proc = launch("failures.py", tmp_path, 2, "future", timeout=120)
    per_rank = results(tmp_path, 2, proc)
    text = assert_case(per_rank, "failed_collective_raises_from_its_future")[0]
    assert "collective #2" in text


def test_dead_rank_fails_the_others_within_the_timeout(tmp_path) -> None:
    start = time.monotonic()
    # torchrun would tear the job down on the first exit; a plain rendezvous keeps the survivor running
    proc = launch("failures.py", tmp_path, 2, "dead", timeout=120, torchrun_args=("--standalone", "--max-restarts=0"))
    assert time.monotonic() - start < 110
    per_rank = results(tmp_path, 1, proc)  # rank 1 died before writing
    assert_case(per_rank, "dead_rank_fails_the_others_within_the_timeout")


def test_monitored_barrier_names_the_rank_that_did_not_arrive(tmp_path) -> None:
    proc = launch("failures.py", tmp_path, 2, "monitored", timeout=120)
    values = assert_case(results(tmp_path, 2, proc), "monitored_barrier_names_the_rank_that_did_not_arrive")
    assert values[1] is None and "Rank 1" in values[0]


def test_unwaited_async_collective_finishes_before_exit(tmp_path) -> None:
    proc = launch("failures.py", tmp_path, 2, "unwaited", timeout=120)
    values = assert_case(results(tmp_path, 2, proc), "unwaited_async_collective_finishes_before_exit")
    assert values == ["reduced", "issued"], values


@pytest.mark.parametrize("variable", ["NEURON_DIST_SPECULATE", "NEURON_DIST_INLINE_BYTES", "NEURON_DIST_CHECK_SIGNATURES"])
def test_ranks_with_different_settings_refuse_to_create_the_group(tmp_path, variable: str) -> None:
    proc = launch("settings_mismatch.py", tmp_path, 2, variable, timeout=120)
    texts = assert_case(results(tmp_path, 2, proc), "different_settings_raise_when_the_group_is_created")
    for text in texts:  # every rank names every rank's settings
        assert "different neuron-dist settings" in text and "global rank 0" in text and "global rank 1" in text, text
        assert variable in text
