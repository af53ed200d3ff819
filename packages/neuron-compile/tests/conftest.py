"""Shared fixtures for neuron-compile tests: an isolated compile cache and fresh Dynamo state."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest


@pytest.fixture
def fresh_compiler(tmp_path, monkeypatch):
    """A private persistent cache directory, no compiled graphs in memory, empty metrics."""
    import torch

    from neuron_compile import backend, metrics
    from neuron_compile.cache import default_cache

    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path / "neff"))
    monkeypatch.delenv("TORCH_NEURONX_NEFF_DISABLE_CACHE", raising=False)
    monkeypatch.delenv("TORCH_NEURONX_FALLBACK_TO_EAGER", raising=False)
    default_cache.cache_clear()
    torch._dynamo.reset()
    backend._forget_compiled()
    metrics.reset()
    yield tmp_path / "neff"
    torch._dynamo.reset()
    backend._forget_compiled()
    metrics.reset()
    default_cache.cache_clear()


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs ``code`` in a fresh interpreter with ``env`` added to this environment."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("NEURON_", "LOCAL_RANK"))}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def run_python_lines(code: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """Runs ``code`` like :func:`run_python`, requires success, and returns its ``KEY value`` lines."""
    result = run_python(code, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
