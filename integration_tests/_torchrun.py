"""Launching an integration test's worker under torchrun, and reading what each rank wrote.

A worker writes ``OUT_DIR/rank{N}.json`` with ``"ok"`` and, on failure, ``"error"`` (a traceback).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

__all__ = ["rank_results", "torchrun"]

_ENV = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def torchrun(worker: Path, args: list[str], nproc: int, timeout: float,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Runs ``worker args...`` on ``nproc`` ranks; on timeout kills torchrun and every rank, then fails."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           str(worker), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=os.environ | _ENV | (env or {}), start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"torchrun with {nproc} processes timed out after {timeout:.0f} s:\n{output[-6000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, output, "")


def rank_results(out_dir: Path, nproc: int, proc: subprocess.CompletedProcess) -> list[dict[str, Any]]:
    """Every rank's result, in rank order; fails on a missing or failed rank, or a non-zero exit."""
    results = []
    for rank in range(nproc):
        path = out_dir / f"rank{rank}.json"
        if not path.exists():
            pytest.fail(f"rank {rank} wrote no result (exit {proc.returncode}):\n{proc.stdout[-6000:]}")
        result = json.loads(path.read_text())
        assert result["ok"], f"rank {rank} failed:\n{result['error']}"
        results.append(result)
    assert proc.returncode == 0, proc.stdout[-6000:]
    return results
