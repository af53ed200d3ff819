"""accelerate 1.15 on the "neuron" backend: ``accelerate launch --num_processes 2`` detects
MULTI_NEURON, and accelerate's own test script (``accelerate test``) passes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import WORKERS, assert_case, results

BIN = Path(sys.executable).parent
CONFIG = """compute_environment: LOCAL_MACHINE
distributed_type: MULTI_NEURON
num_processes: 2
num_machines: 1
machine_rank: 0
mixed_precision: 'no'
use_cpu: false
rdzv_backend: static
same_network: true
"""


def _accelerate(tmp_path: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    env = os.environ | {"PATH": f"{BIN}:{os.environ['PATH']}", "PYTHONPATH": str(WORKERS), "OMP_NUM_THREADS": "1"}
    cmd = [str(BIN / "accelerate"), *args[:1], f"--config_file={config}", *args[1:]]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def test_launch_detects_multi_neuron(tmp_path: Path) -> None:
    proc = _accelerate(tmp_path, "launch", "--num_processes=2", str(WORKERS / "accelerate_detect.py"), str(tmp_path))
    values = assert_case(results(tmp_path, 2, proc), "detects_multi_neuron")
    assert values == [
        ["DistributedType.MULTI_NEURON", "neuron", "neuron:0"],
        ["DistributedType.MULTI_NEURON", "neuron", "neuron:1"],
    ]


def test_accelerate_test_script_passes(tmp_path: Path) -> None:
    """accelerate's test script; its FP16 check is skipped (see workers/accelerate_script.py)."""
    proc = _accelerate(tmp_path, "launch", str(WORKERS / "accelerate_script.py"), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "Training yielded the same results on one CPU or distributed setup with batch split." in proc.stdout
    assert "BF16 training check." in proc.stdout
    assert "**Test reinstantiated state**" in proc.stdout
