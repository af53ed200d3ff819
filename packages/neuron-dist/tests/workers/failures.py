"""Failure behaviour: a collective that times out, and a rank that dies. Run as one rank per
process with a short timeout; argv[2] picks the scenario."""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import neuron_dist
from _cases import Cases

cases = Cases()
SCENARIO = sys.argv[2]
dist.init_process_group("neuron", timeout=timedelta(seconds=3))
RANK, WORLD = dist.get_rank(), dist.get_world_size()
DEVICE = torch.device("neuron", torch.neuron.current_device())


def _last_rank_misses_collective_two(scenario: str) -> torch.Tensor | None:
    """In ``scenario``: every rank runs collective #1; the last rank then sleeps past the 3 s
    timeout (and gets None), the others get the tensor to issue collective #2 with."""
    if SCENARIO != scenario:
        return None
    tensor = torch.ones(4, device=DEVICE)
    dist.all_reduce(tensor)  # collective #1, everyone
    if RANK == WORLD - 1:
        time.sleep(8)  # misses collective #2 past the 3 s timeout
        return None
    return tensor


@cases.case
def timeout_names_collective_sequence_and_missing_ranks() -> str | None:
    tensor = _last_rank_misses_collective_two("timeout")
    if tensor is None:
        return None
    start = time.monotonic()
    try:
        dist.all_reduce(tensor)
    except neuron_dist.CollectiveTimeoutError as error:
        elapsed = time.monotonic() - start
        text = str(error)
        assert "all_reduce" in text and "collective #2" in text, text
        assert f"ranks that did not arrive: [{WORLD - 1}]" in text, text
        assert elapsed < 15, elapsed
        return text
    raise AssertionError("the all_reduce did not time out")


@cases.case
def failed_collective_raises_from_its_future() -> str | None:
    """A collective that fails (here: a rank misses it past the timeout) raises from wait() on
    its work's future, as from work.wait(); the future held the exception as its value."""
    tensor = _last_rank_misses_collective_two("future")
    if tensor is None:
        return None
    future = dist.all_reduce(tensor, async_op=True).get_future()
    try:
        value = future.wait()
    except RuntimeError as error:
        text = str(error)
        assert "timed out" in text and "all_reduce" in text, text
        return text
    raise AssertionError(f"the future's wait() returned {value!r}")


@cases.case
def dead_rank_fails_the_others_within_the_timeout() -> str | None:
    if SCENARIO != "dead":
        return None
    tensor = torch.ones(4, device=DEVICE)
    dist.all_reduce(tensor)
    if RANK == WORLD - 1:
        os._exit(0)  # dies without a word (the test expects its results to be missing)
    time.sleep(0.5)
    start = time.monotonic()
    try:
        dist.all_reduce(tensor)
    except (neuron_dist.CollectivePeerError, neuron_dist.CollectiveTimeoutError) as error:
        elapsed = time.monotonic() - start
        text = str(error)
        assert "all_reduce" in text and "collective #2" in text, text
        assert f"did not arrive: [{WORLD - 1}]" in text, text
        assert elapsed < 15, elapsed
        return text
    raise AssertionError("the all_reduce did not fail")


@cases.case
def monitored_barrier_names_the_rank_that_did_not_arrive() -> str | None:
    """torch allows monitored_barrier on gloo only; the neuron backend implements it too."""
    if SCENARIO != "monitored":
        return None
    dist.monitored_barrier(timeout=timedelta(seconds=10))  # everyone arrives
    if RANK == WORLD - 1:
        time.sleep(6)  # misses the next one (2 s)
        return None
    if RANK != 0:
        return None  # rank 0 reports; the others wait for rank 0 and fail with it
    try:
        dist.monitored_barrier(timeout=timedelta(seconds=2))
    except RuntimeError as error:
        text = str(error)
        assert f"Rank {WORLD - 1}" in text, text
        return text
    raise AssertionError("monitored_barrier did not report the missing rank")


@cases.case
def unwaited_async_collective_finishes_before_exit() -> str | None:
    """A rank that issues an async collective and exits without waiting (or destroying the
    group) still takes part in it, as with gloo, which finishes queued work before the process
    ends: the others, issuing it later, get the result instead of a closed connection."""
    if SCENARIO != "unwaited":
        return None
    tensor = torch.full((1 << 20,), float(RANK + 1), device=DEVICE)  # too big to travel in the exchange
    if RANK == WORLD - 1:
        dist.all_reduce(tensor, async_op=True)
        return "issued"  # the process then exits normally, below
    time.sleep(1.0)  # the last rank is exiting by now
    dist.all_reduce(tensor)
    expected = float(sum(range(1, WORLD + 1)))
    assert tensor.min().item() == expected and tensor.max().item() == expected, tensor[:4]
    return "reduced"


cases.run()
if SCENARIO == "unwaited":
    sys.exit(0)  # a normal exit (atexit handlers run), without destroy_process_group
os._exit(0)  # skip destroy_process_group: the group is broken on purpose
