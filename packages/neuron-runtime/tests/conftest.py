"""Shared helpers for neuron-runtime tests."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs code in a fresh interpreter (for environment-dependent behaviour)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("NEURON_", "LOCAL_RANK"))}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=full_env, capture_output=True, text=True,
        timeout=timeout,
    )


@pytest.fixture
def python_in_subprocess():
    return run_python
