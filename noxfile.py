"""Developer sessions for the torch-neuronx workspace.

Every session runs in the workspace's one virtual environment (``.venv``), which
``uv sync`` creates and keeps in step with the packages; the C++ runtime is built once, not
per session. Default sessions (plain ``nox``) are the test suites CI runs; long suites and
benchmarks are separate sessions.

torch must be the CPU build. Where pip on this machine is configured with a local
directory holding the CPU wheel (``pip config list``: ``find-links``), that directory is
used; otherwise PyTorch's CPU index is. Set ``UV_FIND_LINKS`` or ``UV_INDEX`` yourself to
choose another source.
"""

from __future__ import annotations

import glob
import os
import subprocess

import nox

nox.options.default_venv_backend = "none"
nox.options.sessions = ["runtime", "compile", "dist", "umbrella", "integration"]
nox.options.error_on_missing_interpreters = True

_PYTORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _pip_find_links() -> list[str]:
    try:
        out = subprocess.run(
            ["python3", "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    dirs: list[str] = []
    for line in out.splitlines():
        if "find-links" in line and "=" in line:
            dirs += line.split("=", 1)[1].strip().strip("'\"").split()
    return dirs


def _torch_source_env() -> dict[str, str]:
    """Environment that makes uv resolve torch to the CPU build."""
    if os.environ.get("UV_FIND_LINKS") or os.environ.get("UV_INDEX"):
        return {}
    for directory in _pip_find_links():
        if glob.glob(os.path.join(directory, "torch-2.13.0+cpu-*.whl")):
            return {"UV_FIND_LINKS": directory}
    return {"UV_INDEX": _PYTORCH_CPU_INDEX}


def _sync(session: nox.Session) -> dict[str, str]:
    env = _torch_source_env()
    # Bytecode is compiled at install time: with PYTHONDONTWRITEBYTECODE set (as on CI machines)
    # every process would otherwise recompile torch's sources, about 15 s per `import torch`.
    session.run("uv", "sync", "--all-packages", "--inexact", "--compile-bytecode", external=True, env=env)
    return env


def _pytest(session: nox.Session, *paths: str) -> None:
    env = _sync(session)
    session.run("uv", "run", "--no-sync", "pytest", *paths, *session.posargs, external=True, env=env)


@nox.session
def runtime(session: nox.Session) -> None:
    """neuron-runtime unit tests, with a representative OpInfo subset."""
    _pytest(session, "packages/neuron-runtime/tests", "-n", "2")


@nox.session(name="compile")
def compile_(session: nox.Session) -> None:
    """neuron-compile unit tests: the Dynamo backend, shape buckets, the compile cache."""
    _pytest(session, "packages/neuron-compile/tests", "-n", "2")


@nox.session
def dist(session: nox.Session) -> None:
    """neuron-dist multi-process tests: the c10d backend, DTensor, FSDP2, TP, checkpoints."""
    _pytest(session, "packages/neuron-dist/tests")


@nox.session
def umbrella(session: nox.Session) -> None:
    """torch-neuronx umbrella package tests."""
    _pytest(session, "packages/torch-neuronx/tests")


@nox.session
def integration(session: nox.Session) -> None:
    """Whole-stack tests (integration_tests/)."""
    _pytest(session, "integration_tests")


@nox.session
def opinfo(session: nox.Session) -> None:
    """PyTorch's full OpInfo database on neuron vs. the CPU (float32 and bfloat16, long)."""
    env = _sync(session)
    session.run(
        "uv", "run", "--no-sync", "pytest", "packages/neuron-runtime/tests/opinfo",
        "-n", "2", "-q", "--opinfo-full", *session.posargs, external=True, env=env,
    )


@nox.session
def bench(session: nox.Session) -> None:
    """Eager benchmarks: neuron vs. CPU, printed as ratios."""
    env = _sync(session)
    session.run("uv", "run", "--no-sync", "python", "bench/eager.py", *session.posargs, external=True, env=env)


@nox.session
def demo(session: nox.Session) -> None:
    """The main demo: TRL SFTTrainer on 2 emulated NeuronCores (tensor parallel), then static-cache generation.

    Extra arguments go to ``examples/sft_demo.py`` (``--cores``, ``--tp``, ``--fsdp``, ``--steps``, ``--hidden``...);
    the script launches torchrun itself. The earlier eager demo is ``python examples/demo.py``.
    """
    env = _sync(session)
    session.run("uv", "run", "--no-sync", "python", "examples/sft_demo.py", *session.posargs, external=True, env=env)


@nox.session
def hf_coverage(session: nox.Session) -> None:
    """Every causal-LM architecture of transformers on neuron vs the CPU: docs/architecture_coverage.md.

    Extra arguments go to ``python -m neuron_hf.coverage`` (model types, ``--compiled``, ``--jobs``).
    """
    env = _sync(session)
    args = session.posargs or ["--jobs", "2"]
    session.run("uv", "run", "--no-sync", "python", "-m", "neuron_hf.coverage", *args, external=True, env=env)


@nox.session
def hf_coverage_compiled(session: nox.Session) -> None:
    """The compiled column (torch.compile(backend="neuron")) for every architecture, resumable.

    Several hours on 2 cores (each architecture compiles a training and a decode graph), so it
    records each result in docs/architecture_coverage_compiled.jsonl as it finishes and skips
    the ones already there: stop it any time and run it again to go on. Writes
    docs/architecture_coverage_compiled.md.
    """
    env = _sync(session)
    args = session.posargs or ["--jobs", "2", "--timeout", "1200"]
    session.run("uv", "run", "--no-sync", "python", "-m", "neuron_hf.coverage", "--compiled", *args,
                "--resume", "docs/architecture_coverage_compiled.jsonl",
                "--output", "docs/architecture_coverage_compiled.md", external=True, env=env)


@nox.session
def bench_compile(session: nox.Session) -> None:
    """Compiled benchmarks: backend="neuron" vs eager and CPU Inductor (bench/compile.py).

    Training steps, the matrix-multiply rate, cold vs. warm-cache start, graphs with and without
    shape buckets; ~30 minutes or more on 2 cores.
    """
    env = _sync(session)
    session.run("uv", "run", "--no-sync", "python", "bench/compile.py", *session.posargs, external=True, env=env)
