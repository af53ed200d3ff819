"""Two "nodes" on one machine: two torchrun invocations (--nnodes 2, --node-rank 0/1) sharing a
rendezvous endpoint; each process binds to its local core."""

from __future__ import annotations

import os
import socket
import subprocess

from conftest import TORCHRUN, WORKERS, assert_case, results


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_nodes(tmp_path) -> None:
    port = _free_port()
    env = os.environ | {"PYTHONPATH": str(WORKERS), "OMP_NUM_THREADS": "1"}
    nodes = [
        subprocess.Popen(
            [TORCHRUN, "--nnodes=2", f"--node-rank={node}", "--nproc-per-node=1",
             "--master-addr=127.0.0.1", f"--master-port={port}", str(WORKERS / "multinode.py"), str(tmp_path)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for node in (0, 1)
    ]
    outputs = []
    try:
        for proc in nodes:
            outputs.append(proc.communicate(timeout=180)[0])
    finally:
        for proc in nodes:
            proc.kill()
    per_rank = results(tmp_path, 2)
    seen = assert_case(per_rank, "ranks_span_nodes_and_bind_local_cores")
    assert seen[0] == seen[1] == [[0, 0, "neuron:0"], [1, 0, "neuron:0"]], (seen, outputs)
