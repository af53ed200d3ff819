"""The ``neuron-compile-cache`` command, end to end: list, inspect, prune, clear, info."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from neuron_compile.cache import (
    ENV_CACHE_DIR,
    ENV_DISABLE_CACHE,
    ENV_MAX_ENTRIES,
    ENV_MAX_SIZE_MB,
    CacheConfig,
    CompileCache,
)
from neuron_compile.cli import main

# Three entries: two whose keys share the prefix "ab", used in this order (oldest first).
_KEYS = {"abc123": "forward", "abd456": "backward", "ff00": "optimizer step"}


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in (ENV_DISABLE_CACHE, ENV_MAX_ENTRIES, ENV_MAX_SIZE_MB):
        monkeypatch.delenv(name, raising=False)
    directory = tmp_path / "cache"
    monkeypatch.setenv(ENV_CACHE_DIR, str(directory))
    cache = CompileCache(CacheConfig(directory))
    for key, name in _KEYS.items():
        cache.put(key, name.encode() * 100, {"graph_name": name, "input_specs": [["float32", [8, 128]]]})
    return directory


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_list_shows_entries_most_recently_used_first(cache_dir, capsys):
    status, out, _ = _run(capsys, "list")
    assert status == 0
    header, *rows, footer = out.splitlines()
    assert header.split() == ["KEY", "SIZE", "CREATED", "LAST", "USED", "DESCRIPTION"]
    assert [row.split()[0] for row in rows] == ["ff00", "abd456", "abc123"]
    assert rows[0].endswith("optimizer step") and "B" in rows[0]
    assert footer.startswith("3 entries") and str(cache_dir) in footer


def test_list_json(cache_dir, capsys):
    status, out, _ = _run(capsys, "list", "--json")
    rows = json.loads(out)
    assert status == 0 and [row["key"] for row in rows] == ["ff00", "abd456", "abc123"]
    assert rows[2]["metadata"]["graph_name"] == "forward" and rows[2]["payload_size"] == 700


def test_list_of_an_empty_cache(tmp_path, capsys):
    status, out, _ = _run(capsys, "--cache-dir", str(tmp_path / "empty"), "list")
    assert status == 0 and "no entries" in out


def test_inspect_by_unique_prefix(cache_dir, capsys):
    status, out, _ = _run(capsys, "inspect", "ff")
    assert status == 0
    assert "key:        ff00" in out and "checksum:   ok" in out
    metadata = json.loads(out.split("metadata:\n", 1)[1])
    assert metadata["graph_name"] == "optimizer step"


def test_inspect_a_corrupt_entry_says_so_and_fails(cache_dir, capsys):
    path = cache_dir / "abc123.neff"
    data = bytearray(path.read_bytes())
    data[-40] ^= 1
    path.write_bytes(bytes(data))
    status, out, _ = _run(capsys, "inspect", "abc")
    assert status == 1 and "CORRUPT: checksum mismatch" in out
    assert path.exists()  # inspecting does not remove


@pytest.mark.parametrize(("prefix", "message"), [
    ("zz", "no cache entry matches 'zz'"),
    ("ab", "key prefix 'ab' is ambiguous: it matches 2 entries (abc123, abd456)"),
    ("", "is ambiguous"),
])
def test_inspect_needs_exactly_one_match(cache_dir, capsys, prefix, message):
    status, out, err = _run(capsys, "inspect", prefix)
    assert status == 1 and out == ""
    assert err.startswith("neuron-compile-cache: error: ") and message in err


def test_inspect_prefers_an_exact_key(cache_dir, capsys):
    CompileCache(CacheConfig(cache_dir)).put("ab", b"x")
    status, out, _ = _run(capsys, "inspect", "ab")
    assert status == 0 and "key:        ab\n" in out


def test_prune_keeps_the_most_recently_used(cache_dir, capsys):
    CompileCache(CacheConfig(cache_dir)).get("abc123")
    status, out, _ = _run(capsys, "prune", "--max-entries", "2")
    assert status == 0 and out.startswith("removed 1 entry") and "2 entries" in out
    assert sorted(os.listdir(cache_dir)) == [".locks", "abc123.neff", "ff00.neff"]


def test_prune_by_age(cache_dir, capsys):
    month_ago = time.time() - 30 * 86400
    os.utime(cache_dir / "abd456.neff", (month_ago, month_ago))
    status, out, _ = _run(capsys, "prune", "--older-than-days", "7")
    assert status == 0 and out.startswith("removed 1 entry")
    assert not (cache_dir / "abd456.neff").exists()


def test_prune_uses_the_configured_limits(cache_dir, capsys, monkeypatch):
    status, _, err = _run(capsys, "prune")
    assert status == 2 and "nothing to prune by" in err
    monkeypatch.setenv(ENV_MAX_ENTRIES, "1")
    status, out, _ = _run(capsys, "prune")
    assert status == 0 and out.startswith("removed 2 entries")
    assert sorted(os.listdir(cache_dir)) == [".locks", "ff00.neff"]


@pytest.mark.parametrize("argv", [["prune", "--max-entries", "0"], ["prune", "--max-size-mb", "x"],
                                  ["prune", "--older-than-days", "-1"], ["inspect"], ["frobnicate"], []])
def test_bad_arguments_exit_2(cache_dir, capsys, argv):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_clear_asks_for_confirmation(cache_dir, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO())  # not a terminal
    status, _, err = _run(capsys, "clear")
    assert status == 2 and "without --yes" in err and len(os.listdir(cache_dir)) == 4

    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    monkeypatch.setattr("builtins.input", lambda prompt: "n")
    status, out, _ = _run(capsys, "clear")
    assert status == 0 and "nothing removed" in out and len(os.listdir(cache_dir)) == 4

    monkeypatch.setattr("builtins.input", lambda prompt: "y")
    status, out, _ = _run(capsys, "clear")
    assert status == 0 and out.startswith("removed 3 entries") and os.listdir(cache_dir) == [".locks"]


def test_clear_yes(cache_dir, capsys):
    status, out, _ = _run(capsys, "clear", "--yes")
    assert status == 0 and out.startswith("removed 3 entries")
    status, out, _ = _run(capsys, "list")
    assert "no entries" in out


def test_info(cache_dir, capsys, monkeypatch):
    monkeypatch.setenv(ENV_MAX_SIZE_MB, "512")
    monkeypatch.setenv(ENV_DISABLE_CACHE, "1")  # the command still works on the directory
    status, out, _ = _run(capsys, "info")
    assert status == 0
    lines = dict(line.split(":", 1) for line in out.splitlines())
    assert lines["directory"].strip() == str(cache_dir)
    assert lines["compile cache"].strip() == f"disabled by {ENV_DISABLE_CACHE}"
    assert lines["max size"].strip().startswith("512 MiB") and lines["max entries"].strip().startswith("unlimited")
    assert lines["entries"].strip() == "3"


def test_cache_dir_option_overrides_the_environment_in_either_position(cache_dir, tmp_path, capsys):
    other = tmp_path / "other"
    CompileCache(CacheConfig(other)).put("only", b"x")
    for argv in (["--cache-dir", str(other), "list"], ["list", "--cache-dir", str(other)]):
        status, out, _ = _run(capsys, *argv)
        assert status == 0 and out.splitlines()[1].startswith("only")


def test_an_invalid_environment_variable_is_an_error(cache_dir, capsys, monkeypatch):
    monkeypatch.setenv(ENV_MAX_ENTRIES, "lots")
    status, _, err = _run(capsys, "list")
    assert status == 2 and f"{ENV_MAX_ENTRIES}='lots'" in err


def test_an_unusable_directory_is_an_error_not_a_warning(tmp_path, capsys):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        status, _, err = _run(capsys, "--cache-dir", str(a_file), "list")
    assert status == 1 and f"cannot use the cache directory {a_file}: it is a file" in err
    assert record == []


def test_the_installed_command_and_python_m(cache_dir):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NEURON_", "TORCH_NEURONX_"))}
    env[ENV_CACHE_DIR] = str(cache_dir)
    result = subprocess.run([sys.executable, "-m", "neuron_compile.cli", "inspect", "abd"], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "backward" in result.stdout and "checksum:   ok" in result.stdout
    script = Path(sys.executable).with_name("neuron-compile-cache")
    if script.exists():
        result = subprocess.run([str(script), "inspect", "nope"], env=env, capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 1 and "no cache entry matches 'nope'" in result.stderr
