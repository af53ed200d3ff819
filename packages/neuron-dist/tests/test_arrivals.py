"""The arrivals publisher thread stops at exit, before the interpreter finalizes."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# Registered before neuron_dist is imported, so (atexit runs last-in first-out) it checks the
# publisher after neuron_dist's own exit handler ran.
_SCRIPT = textwrap.dedent(
    """
    import atexit, datetime

    def report():
        from neuron_dist._arrivals import _Publisher
        print("publisher alive at exit:", _Publisher._instance._thread.is_alive(), flush=True)

    atexit.register(report)

    import torch.distributed as dist
    from neuron_dist._arrivals import ArrivalBoard

    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=30))
    board = ArrivalBoard(store, 0, 1)
    board.enter(1)
    """
)


def test_publisher_thread_is_joined_before_finalization() -> None:
    # A daemon thread still running (possibly inside a store call) while the interpreter
    # finalizes can abort the process: groups, and so their boards, live until exit.
    out = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "publisher alive at exit: False" in out.stdout, out.stdout + out.stderr
