"""Options and fixtures of the OpInfo conformance suite (neuron vs. the CPU).

``--opinfo-full`` (or ``NEURON_OPINFO_FULL=1``, for runs whose rootdir conftest does not
load this file before option parsing) runs PyTorch's whole OpInfo database; without it only
a representative subset of common ops runs.  ``--opinfo-samples N`` changes the per-test
sample cap (default 8).
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys

import pytest

DEFAULT_TIMEOUT_S = 180


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("opinfo", "neuron OpInfo conformance")
    group.addoption("--opinfo-full", action="store_true", default=False,
                    help="run every OpInfo in op_db (default: a representative subset)")
    group.addoption("--opinfo-samples", type=int, default=8,
                    help="maximum sample inputs per (op, dtype, direction) test")
    group.addoption("--opinfo-timeout", type=float, default=DEFAULT_TIMEOUT_S,
                    help="seconds per test before it is failed (0 disables)")


def opinfo_full(config: pytest.Config) -> bool:
    return bool(config.getoption("--opinfo-full", default=False)) or os.environ.get(
        "NEURON_OPINFO_FULL", "") not in ("", "0")


def opinfo_samples(config: pytest.Config) -> int:
    return int(config.getoption("--opinfo-samples", default=8) or 8)


class OpInfoTimeout(Exception):
    pass


@pytest.fixture(autouse=True)
def _opinfo_timeout(request: pytest.FixtureRequest):
    """Fails a hung test (SIGALRM); a hang inside C++ kills the worker after a grace period."""
    timeout = float(request.config.getoption("--opinfo-timeout", default=DEFAULT_TIMEOUT_S) or 0)
    if timeout <= 0 or not hasattr(signal, "SIGALRM"):
        yield
        return

    def on_alarm(signum, frame):
        raise OpInfoTimeout(f"test exceeded {timeout:.0f}s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    faulthandler.dump_traceback_later(timeout + 60, exit=True, file=sys.stderr)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def pytest_configure(config: pytest.Config) -> None:
    # A segfaulting op kills its xdist worker; keep replacing workers instead of stopping the
    # run after xdist's default 4 x workers crashes. (Known crashers run in a subprocess.)
    if getattr(config.option, "maxworkerrestart", "absent") is None:
        config.option.maxworkerrestart = "100000"
