"""Executables persist: a fresh process loads them from the compile cache without compiling."""

from __future__ import annotations

import pytest
import torch

from conftest import run_python_lines
from neuron_compile import metrics
from neuron_compile.executable import ExecutableFormatError, NeuronExecutable

_SCRIPT = """
    import torch, torch.nn as nn, warnings
    import torch._inductor.cpp_builder as cpp_builder
    from neuron_compile import metrics
    builds = []  # C++ compiler runs that build a shared object: kernels and Inductor's vector-ISA probes
    preprocessed = []  # preprocessor runs: Inductor names its precompiled header by their output
    _build = cpp_builder.CppBuilder.build

    def _counting_build(self, *args, **kwargs):
        if self.get_target_file_path().endswith(".so"):
            builds.append(self.get_target_file_path())
        if self._preprocessing:
            preprocessed.append(self.get_target_file_path())
        return _build(self, *args, **kwargs)

    cpp_builder.CppBuilder.build = _counting_build
    from torch._inductor.cpu_vec_isa import VecISA
    probes = []  # child processes Inductor starts to check that a vector-ISA probe library loads
    _probe_load = VecISA._probe_load

    def _counting_probe_load(self, path):
        probes.append(path)
        return _probe_load(self, path)

    VecISA._probe_load = _counting_probe_load
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4)).to("neuron")
    x = torch.arange(64, dtype=torch.float32).reshape(4, 16).to("neuron") / 64
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = torch.compile(model, backend="neuron")(x).square().sum()
        loss.backward()
    print("SOURCE", [r.source for r in metrics.graphs()])
    print("LOSS", repr(loss.item()))
    print("GRAD", repr(model[0].weight.grad.sum().item()))
    print("WARNINGS", [str(w.message).replace(chr(10), " ") for w in caught if "cache" in str(w.message)])
    print("BUILDS", builds)
    print("PROBES", len(probes))
    print("PREPROCESSED", len(preprocessed))
"""


def _run(env):
    return run_python_lines(_SCRIPT, env=env)


def test_fresh_process_loads_from_disk_without_the_cpp_compiler(tmp_path):
    neff = str(tmp_path / "neff")
    cold = _run({"TORCH_NEURONX_NEFF_CACHE_DIR": neff, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "i1")})
    assert cold["SOURCE"] == "['compiled']"
    # A new Inductor cache directory: the kernels must come from the executable itself.
    warm = _run({"TORCH_NEURONX_NEFF_CACHE_DIR": neff, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "i2")})
    assert warm["SOURCE"] == "['disk']"
    assert (warm["LOSS"], warm["GRAD"]) == (cold["LOSS"], cold["GRAD"])
    assert cold["BUILDS"] != "[]"
    assert warm["BUILDS"] == "[]", "the C++ compiler built something on a cache hit (a kernel or an ISA probe)"
    if cold["PROBES"] != "0":  # x86: the cold process probed the vector ISAs and recorded the outcomes
        assert warm["PROBES"] == "0", "a cache hit on the same CPU ran Inductor's vector-ISA probes again"
    assert cold["PREPROCESSED"] != "0"  # the cold process named its precompiled header
    assert warm["PREPROCESSED"] == "0", "a cache hit ran the C preprocessor to name a header no kernel needs"


def test_recorded_probe_outcomes_apply_only_on_the_same_cpu(tmp_path, monkeypatch):
    from neuron_compile import _isa_probes
    from torch._inductor.cpu_vec_isa import VecISA

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    library = tmp_path / "probe" / "c1.so"
    library.parent.mkdir()
    library.write_bytes(b"not really a library")
    ran = []
    monkeypatch.setattr(VecISA, "_probe_load", lambda self, path: ran.append(path) or False)
    _isa_probes.install_recorder()
    isa = VecISA()
    with _isa_probes.answered_from({"probe/c1.so": True}, _isa_probes.cpu_fingerprint()):
        assert isa._probe_load(str(library)) is True  # replayed: no child process
        assert isa._probe_load(str(tmp_path / "probe" / "other.so")) is False  # not recorded: probed
    assert ran == [str(tmp_path / "probe" / "other.so")]
    with _isa_probes.answered_from({"probe/c1.so": True}, "another CPU"):
        assert isa._probe_load(str(library)) is False
    assert isa._probe_load(str(library)) is False  # outside the context: always probed
    assert ran[1:] == [str(library)] * 2
    assert _isa_probes.recorded_outcomes()["probe/c1.so"] is False


def test_recorded_header_names_apply_only_on_the_same_cpu_and_when_the_header_exists(tmp_path, monkeypatch):
    from neuron_compile import _header_names, _isa_probes
    from torch._inductor import codecache

    monkeypatch.setattr(codecache, "_HEADER_DIR", str(tmp_path))
    named = []  # the preprocessor runs Inductor would do

    def inductor_names(header, cmd_line, **compile_command):
        named.append(cmd_line)
        return str(tmp_path / f"fresh-{cmd_line}.h")

    monkeypatch.setattr(codecache, "_precompile_header", inductor_names)
    _header_names.install_recorder()
    record = {_header_names._key("prefix.h", "-O3"): "ab/recorded.h",
              _header_names._key("prefix.h", "-O1"): "ab/missing.h"}
    (tmp_path / "ab").mkdir()
    (tmp_path / "ab" / "recorded.h").write_text("#include <prefix.h>\n")
    (tmp_path / "ab" / "recorded.h.gch").write_bytes(b"precompiled")
    with _header_names.answered_from(record, _isa_probes.cpu_fingerprint()):
        assert codecache._precompile_header("prefix.h", "-O3") == str(tmp_path / "ab" / "recorded.h")
        assert codecache._precompile_header("prefix.h", "-O1") == str(tmp_path / "fresh--O1.h")  # not on disk
        assert codecache._precompile_header("other.h", "-O3") == str(tmp_path / "fresh--O3.h")  # not recorded
    assert named == ["-O1", "-O3"]
    with _header_names.answered_from(record, "another CPU"):
        codecache._precompile_header("prefix.h", "-O3")
    codecache._precompile_header("prefix.h", "-O3")  # outside the context: always named by Inductor
    assert named[2:] == ["-O3", "-O3"]
    assert _header_names.recorded_names()[_header_names._key("prefix.h", "-O3")] == "fresh--O3.h"


def test_an_entry_that_fails_to_load_is_reported_and_recompiled(fresh_compiler, monkeypatch):
    """For example an entry written by another build of torch-neuronx whose program imports a
    name this build does not have: a cache miss with a warning, never a failed step."""
    from neuron_compile import backend

    a = torch.randn(8, 8, device="neuron")
    fn = lambda a: (a * 3).sin()  # noqa: E731
    expected = torch.compile(fn, backend="neuron")(a)
    torch._dynamo.reset()
    backend._forget_compiled()

    def broken_load(self):
        raise ImportError("cannot import name 'gone' from 'neuron_compile._runtime_support'")

    monkeypatch.setattr(NeuronExecutable, "load", broken_load)
    with pytest.warns(UserWarning, match="cannot be loaded .*ImportError.*recompiling"):
        again = torch.compile(fn, backend="neuron")(a)
    assert [record.source for record in metrics.graphs()] == ["compiled", "compiled"]
    torch.testing.assert_close(again.cpu(), expected.cpu())


_HISTC_SCRIPT = """
    import torch
    from neuron_compile import metrics
    experts = torch.tensor([0, 2, 2, 3, 1, 2], device="neuron")  # an MoE router's choices
    counts = torch.compile(lambda e: torch.histc(e, bins=4, min=0, max=3) * 2, backend="neuron")(experts)
    print("SOURCE", [r.source for r in metrics.graphs()])
    print("COUNTS", counts.cpu().tolist())
"""


def test_fresh_process_loads_a_graph_that_calls_a_device_op(tmp_path):
    """Integer histc lowers to neuron_compile's own custom op; a process that only loads the
    executable from disk must know that op too (it used to fail with 'no attribute histc')."""
    env = {"TORCH_NEURONX_NEFF_CACHE_DIR": str(tmp_path / "neff")}
    runs = [run_python_lines(_HISTC_SCRIPT, env=env) for _ in range(2)]
    assert [r["SOURCE"] for r in runs] == ["['compiled']", "['disk']"]
    assert runs[0]["COUNTS"] == runs[1]["COUNTS"] == "[2, 2, 6, 2]"


def test_corrupt_entry_is_reported_and_recompiled(tmp_path):
    neff = tmp_path / "neff"
    env = {"TORCH_NEURONX_NEFF_CACHE_DIR": str(neff)}
    first = _run(env)
    [entry] = list(neff.glob("*.neff"))
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 0xFF
    entry.write_bytes(bytes(data))
    second = _run(env)
    assert second["SOURCE"] == "['compiled']"
    assert "corrupt" in second["WARNINGS"].lower() or "checksum" in second["WARNINGS"].lower()
    assert second["LOSS"] == first["LOSS"]
    third = _run(env)
    assert third["SOURCE"] == "['disk']"


def test_disabled_cache_compiles_every_process(tmp_path):
    env = {"TORCH_NEURONX_NEFF_CACHE_DIR": str(tmp_path / "neff"), "TORCH_NEURONX_NEFF_DISABLE_CACHE": "1"}
    assert _run(env)["SOURCE"] == "['compiled']"
    assert _run(env)["SOURCE"] == "['compiled']"
    assert not list((tmp_path / "neff").glob("*.neff"))


def _dynamo_graph(fn, *inputs):
    captured = []

    def capture(gm, example_inputs):
        captured.append(gm)
        return gm.forward

    torch.compile(fn, backend=capture)(*inputs)
    return captured[0]


def test_executable_round_trips_and_rejects_damage(fresh_compiler):
    from neuron_compile._lowering import lower_graph

    a = torch.randn(4, 4, device="neuron")
    gm = _dynamo_graph(lambda a: (a + 1).relu() * 2, a)
    executable = lower_graph(gm, [a]).executable
    assert executable is not None and executable.kernels, "the executable bundles its kernels"
    again = NeuronExecutable.from_bytes(executable.to_bytes())
    assert again == executable
    assert executable.header_names, "the names of Inductor's precompiled headers travel with the executable"
    import platform

    if platform.machine() in ("x86_64", "AMD64"):
        assert executable.support, "Inductor's vector-ISA probe travels with the executable"
    with torch.no_grad():
        [out] = again.load()(a)
    torch.testing.assert_close(out.cpu(), (a.cpu() + 1).relu() * 2)
    with pytest.raises(ExecutableFormatError, match="truncated|describes"):
        NeuronExecutable.from_bytes(executable.to_bytes()[:-10])
    with pytest.raises(ExecutableFormatError, match="not a neuron executable"):
        NeuronExecutable.from_bytes(b"x" * 64)


def test_graph_that_cannot_be_serialised_still_runs(fresh_compiler):
    from neuron_compile._lowering import lower_graph

    gm = torch.fx.symbolic_trace(lambda a: (a + 1).relu() * 2)  # no tensor metadata: not cacheable
    a = torch.randn(4, 4, device="neuron")
    lowered = lower_graph(gm, [a])
    assert lowered.executable is None and "call_method" in lowered.not_serialisable
    with torch.no_grad():
        out = lowered.run(a)
    out = out[0] if isinstance(out, (list, tuple)) else out
    torch.testing.assert_close(out.cpu(), (a.cpu() + 1).relu() * 2)


def test_concurrent_processes_compiling_one_graph_both_succeed(tmp_path):
    import subprocess
    import sys
    import textwrap
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("NEURON_")}
    env["TORCH_NEURONX_NEFF_CACHE_DIR"] = str(tmp_path / "neff")
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(_SCRIPT)], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outputs]
    sources = sorted(line for out, _ in outputs for line in out.splitlines() if line.startswith("SOURCE"))
    assert sources in (["SOURCE ['compiled']", "SOURCE ['disk']"], ["SOURCE ['compiled']", "SOURCE ['compiled']"])
    assert len(list((tmp_path / "neff").glob("*.neff"))) == 1
    losses = {line for out, _ in outputs for line in out.splitlines() if line.startswith("LOSS")}
    assert len(losses) == 1


def test_inductor_settings_are_part_of_the_cache_key(fresh_compiler):
    """A graph compiled again under other Inductor settings is compiled again, as Inductor's own
    cache does: it was served the executable built under the first settings (in memory and on
    disk), so ``fallback_random=True`` (eager's random numbers) had no effect."""
    from torch._inductor import config

    def noisy(x: torch.Tensor) -> torch.Tensor:
        return torch.rand_like(x) + x

    x = torch.zeros(64, device="neuron")
    torch.compile(noisy, backend="neuron")(x)
    torch._dynamo.reset()
    with config.patch(fallback_random=True):
        torch.manual_seed(0)
        got = torch.compile(noisy, backend="neuron")(x)
    torch.manual_seed(0)
    assert torch.equal(got.cpu(), noisy(x).cpu())
    assert [record.source for record in metrics.graphs()] == ["compiled", "compiled"]
