"""Launching multi-process workers under torchrun, with timeouts, and reading their results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKERS = Path(__file__).parent / "workers"
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: long multi-process runs also covered by quicker tests")


def launch(
    worker: str,
    outdir: Path,
    nproc: int,
    *args: str,
    timeout: float = 240,
    env: dict[str, str] | None = None,
    torchrun_args: tuple[str, ...] = ("--standalone",),
) -> subprocess.CompletedProcess:
    """Runs ``workers/<worker>`` on ``nproc`` ranks under torchrun (killed after ``timeout`` s)."""
    outdir.mkdir(parents=True, exist_ok=True)
    cmd = [TORCHRUN, *torchrun_args, f"--nproc-per-node={nproc}", str(WORKERS / worker), str(outdir), *args]
    full_env = os.environ | {"PYTHONPATH": str(WORKERS), "OMP_NUM_THREADS": "1"} | (env or {})
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)


def results(outdir: Path, world: int, proc: subprocess.CompletedProcess | None = None) -> list[dict]:
    """Each rank's recorded case outcomes (fails with the run's output if a rank wrote none)."""
    out = []
    for rank in range(world):
        path = outdir / f"rank{rank}.json"
        if not path.exists():
            tail = "" if proc is None else (proc.stdout[-3000:] + proc.stderr[-6000:])
            pytest.fail(f"rank {rank} wrote no results; run output:\n{tail}")
        out.append(json.loads(path.read_text()))
    return out


def assert_case(per_rank: list[dict], name: str) -> list[object]:
    """Fails unless case ``name`` passed on every rank; returns its per-rank values."""
    for rank, cases in enumerate(per_rank):
        assert name in cases, f"case {name} did not run on rank {rank}"
        outcome = cases[name]
        assert outcome["ok"], f"rank {rank}, case {name}:\n{outcome['error']}"
    return [cases[name]["value"] for cases in per_rank]
