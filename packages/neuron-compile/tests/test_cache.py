"""The persistent compile cache: round trips, LRU limits, corruption, disk failures, several processes."""

from __future__ import annotations

import errno
import hashlib
import os
import re
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest
from filelock import FileLock

from neuron_compile import _cache_files
from neuron_compile.cache import (
    ENV_CACHE_DIR,
    ENV_DISABLE_CACHE,
    ENV_MAX_ENTRIES,
    ENV_MAX_SIZE_MB,
    CacheConfig,
    CompileCache,
    CompileCacheWarning,
    default_cache,
    make_key,
)

_MIB = 1024 * 1024


@pytest.fixture(autouse=True)
def _cache_warnings_are_recorded():
    """Every cache warning is seen by the test, even one the default filter would show only once."""
    with warnings.catch_warnings():
        warnings.simplefilter("always", CompileCacheWarning)
        yield


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def _cache(directory: Path | None, **limits) -> CompileCache:
    return CompileCache(CacheConfig(directory, **limits))


def _files(directory: Path) -> list[str]:
    """Everything in the cache directory except the lock directory."""
    return sorted(name for name in os.listdir(directory) if name != ".locks")


def _entry_size(payload_size: int, metadata: dict | None = None) -> int:
    """Bytes an entry of this payload size takes on disk (header sizes vary with the creation time)."""
    return sum(len(bytes(chunk)) for chunk in _cache_files.encode_entry("k", b"\0" * payload_size, metadata or {},
                                                                        created=time.time()))


def _cache_warnings(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, CompileCacheWarning)]


# ---------------------------------------------------------------------------------------------
# Round trips and the file format.


@pytest.mark.parametrize("payload", [b"", b"\x00neff\xff" * 1000, bytearray(b"abc"), memoryview(b"xyz" * 7)])
def test_put_then_get_returns_the_payload(cache_dir, payload):
    cache = _cache(cache_dir)
    assert cache.put("graph-1", payload, {"graph_name": "forward"})
    assert cache.get("graph-1") == bytes(payload)
    assert cache.get("graph-2") is None
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.writes) == (1, 1, 1)


def test_entries_survive_into_a_new_cache_object(cache_dir):
    _cache(cache_dir).put("k", b"payload", {"n": 1})
    assert _cache(cache_dir).get("k") == b"payload"


def test_put_replaces_an_entry(cache_dir):
    cache = _cache(cache_dir)
    cache.put("k", b"old")
    cache.put("k", b"new", {"version": 2})
    assert cache.get("k") == b"new"
    assert [(e.key, e.metadata) for e in cache.entries()] == [("k", {"version": 2})]


def test_metadata_and_entry_information(cache_dir):
    cache = _cache(cache_dir)
    metadata = {"graph_name": "fwd", "input_specs": [["float32", [2, 128]]], "compile_seconds": 1.5}
    before = time.time()
    cache.put("k", b"x" * 100, metadata)
    (info,) = cache.entries()
    assert info.key == "k" and info.metadata == metadata and info.payload_size == 100
    assert info.size == (cache_dir / "k.neff").stat().st_size
    assert before <= info.created <= info.last_used <= time.time()
    assert info.path == cache_dir / "k.neff" and info.problem is None
    assert cache.entry("k") == info and cache.entry("other") is None


def test_metadata_must_be_json(cache_dir):
    cache = _cache(cache_dir)
    with pytest.raises(TypeError, match="JSON-serialisable"):
        cache.put("k", b"x", {"dtype": object()})
    assert _files(cache_dir) == []


@pytest.mark.parametrize("key", ["", ".hidden", "-x", "a/b", "../escape", "a b", "x" * 201, "naïve"])
def test_keys_are_validated(cache_dir, key):
    cache = _cache(cache_dir)
    with pytest.raises(ValueError, match="invalid compile cache key"):
        cache.put(key, b"x")
    with pytest.raises(ValueError, match="invalid compile cache key"):
        cache.get(key)


def test_make_key_is_stable_and_sensitive_to_content():
    a = make_key({"graph": "abc", "inputs": [[2, 3]], "torch": "2.13.0"})
    assert a == make_key({"torch": "2.13.0", "inputs": [[2, 3]], "graph": "abc"})
    assert a != make_key({"graph": "abc", "inputs": [[2, 4]], "torch": "2.13.0"})
    assert len(a) == 64 and int(a, 16) >= 0
    with pytest.raises(TypeError, match="JSON"):
        make_key({"fn": print})


def test_entry_file_layout(cache_dir):
    """magic, version, header length, JSON header, payload, SHA-256 of everything before it."""
    _cache(cache_dir).put("k", b"PAYLOAD", {"a": 1})
    data = (cache_dir / "k.neff").read_bytes()
    assert data[:8] == b"TNXCACHE" and int.from_bytes(data[8:10], "big") == 1
    header_len = int.from_bytes(data[10:14], "big")
    assert b'"metadata": {"a": 1}' in data[14:14 + header_len]
    assert data[14 + header_len:-32] == b"PAYLOAD"
    assert data[-32:] == hashlib.sha256(data[:-32]).digest()


# ---------------------------------------------------------------------------------------------
# Limits and least-recently-used eviction.


def test_entry_limit_evicts_the_least_recently_used(cache_dir):
    cache = _cache(cache_dir, max_entries=3)
    for key in "abc":
        cache.put(key, key.encode())
    assert cache.get("a") == b"a"  # now b is the least recently used
    cache.put("d", b"d")
    assert sorted(e.key for e in cache.entries()) == ["a", "c", "d"]
    assert cache.stats().evictions == 1
    cache.put("e", b"e")  # c is next
    assert sorted(e.key for e in cache.entries()) == ["a", "d", "e"]


def test_size_limit_evicts_the_least_recently_used(cache_dir):
    payload = 64 * 1024
    entry = _entry_size(payload)
    cache = _cache(cache_dir, max_size_mb=(3 * entry + 100) / _MIB)  # room for three entries
    for key in "abc":
        cache.put(key, b"\1" * payload)
    cache.get("a")
    cache.get("b")  # c is the least recently used
    cache.put("d", b"\1" * payload)
    assert sorted(e.key for e in cache.entries()) == ["a", "b", "d"]
    assert sum(e.size for e in cache.entries()) <= cache.config.max_size_bytes


def test_the_entry_just_written_is_never_evicted(cache_dir):
    small = _entry_size(1000)
    cache = _cache(cache_dir, max_size_mb=(3 * small + 100) / _MIB)
    for key in "abc":
        cache.put(key, b"\1" * 1000)
    cache.put("big", b"\2" * (2 * small))  # needs every older entry's room
    assert [e.key for e in cache.entries()] == ["big"]
    assert cache.get("big") == b"\2" * (2 * small)


def test_the_entry_just_written_is_kept_when_others_look_newer(cache_dir):
    """Another host on a shared directory may have a clock ahead of ours."""
    cache = _cache(cache_dir, max_entries=2)
    cache.put("a", b"a")
    cache.put("b", b"b")
    future = time.time_ns() + 3600 * 10**9
    os.utime(cache_dir / "a.neff", ns=(future, future))
    os.utime(cache_dir / "b.neff", ns=(future + 1, future + 1))
    cache.put("c", b"c")
    assert sorted(e.key for e in cache.entries()) == ["b", "c"]


def test_an_entry_larger_than_the_size_limit_is_not_stored(cache_dir):
    cache = _cache(cache_dir, max_size_mb=1)
    cache.put("small", b"x")
    with pytest.warns(CompileCacheWarning, match=r"huge .* is larger than the whole compile cache"):
        assert not cache.put("huge", b"\0" * (2 * _MIB))
    assert [e.key for e in cache.entries()] == ["small"]
    assert cache.stats().too_large == 1


def test_limits_apply_in_memory_too():
    cache = _cache(None, max_entries=2)
    for key in "abc":
        cache.put(key, key.encode())
    assert cache.location == "memory" and cache.directory is None
    assert sorted(e.key for e in cache.entries()) == ["b", "c"]
    assert cache.get("c") == b"c" and cache.get("a") is None


# ---------------------------------------------------------------------------------------------
# Corrupt entries: one warning, a miss, the entry removed.


def _damage_and_get(cache_dir: Path, damage) -> tuple[bytes | None, list[str], CompileCache]:
    cache = _cache(cache_dir)
    cache.put("victim", os.urandom(4096), {"graph_name": "fwd"})
    path = cache_dir / "victim.neff"
    data = bytearray(path.read_bytes())
    path.write_bytes(damage(data))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        payload = cache.get("victim")
    return payload, _cache_warnings(record), cache


def _flip(offset: int):
    def damage(data: bytearray) -> bytes:
        data[offset] ^= 0x40
        return bytes(data)
    return damage


@pytest.mark.parametrize(("damage", "problem"), [
    (_flip(3000), "checksum mismatch"),  # in the payload
    (_flip(20), "unreadable header|checksum mismatch"),  # in the JSON header
    (_flip(-1), "checksum mismatch"),  # in the checksum itself
    (_flip(0), "not a compile cache entry"),
    (lambda data: bytes(data[:-10]), "truncated"),
    (lambda data: bytes(data[:2000]), "truncated"),
    (lambda data: bytes(data[:30]), "truncated"),
    (lambda data: bytes(data[:5]), "truncated"),
    (lambda data: b"", "truncated"),
    (lambda data: bytes(data) + b"junk", "unexpected bytes"),
], ids=["payload-bit", "header-bit", "checksum-bit", "magic", "cut-10", "cut-payload", "cut-header",
        "cut-preamble", "empty", "trailing"])
def test_a_damaged_entry_warns_once_misses_and_is_removed(cache_dir, damage, problem):
    payload, messages, cache = _damage_and_get(cache_dir, damage)
    assert payload is None
    assert len(messages) == 1, messages
    assert "victim.neff" in messages[0] and "compiled again" in messages[0]
    assert re.search(problem, messages[0]), messages[0]
    assert _files(cache_dir) == []
    stats = cache.stats()
    assert (stats.corrupt, stats.misses, stats.hits) == (1, 1, 0)
    cache.put("victim", b"fresh")  # the caller recompiles and stores again
    assert cache.get("victim") == b"fresh"


def test_an_entry_renamed_to_another_key_is_corrupt(cache_dir):
    cache = _cache(cache_dir)
    cache.put("a", b"payload of a")
    os.rename(cache_dir / "a.neff", cache_dir / "b.neff")
    with pytest.warns(CompileCacheWarning, match="holds the entry for key 'a'"):
        assert cache.get("b") is None


def test_verify_and_entries_report_damage_without_removing(cache_dir):
    cache = _cache(cache_dir)
    cache.put("good", b"g" * 100)
    cache.put("bad", b"b" * 100)
    path = cache_dir / "bad.neff"
    path.write_bytes(path.read_bytes()[:-1])
    (cache_dir / "garbage.neff").write_bytes(b"hello")
    assert cache.verify("good") is None
    assert "truncated" in cache.verify("bad")
    with pytest.raises(KeyError):
        cache.verify("absent")
    problems = {e.key: e.problem for e in cache.entries()}
    assert problems["good"] is None and problems["bad"] is None  # the header is still readable
    assert "truncated" in problems["garbage"]
    assert path.exists()


# ---------------------------------------------------------------------------------------------
# Configuration from the environment.


def test_from_env_reads_every_variable(tmp_path):
    env = {ENV_CACHE_DIR: str(tmp_path / "c"), ENV_DISABLE_CACHE: "0", ENV_MAX_SIZE_MB: " 0.5 ",
           ENV_MAX_ENTRIES: "12"}
    config = CacheConfig.from_env(env)
    assert config == CacheConfig(tmp_path / "c", disabled=False, max_size_mb=0.5, max_entries=12)
    assert config.max_size_bytes == _MIB // 2


def test_default_directory_follows_xdg(tmp_path, monkeypatch):
    assert CacheConfig.from_env({"XDG_CACHE_HOME": str(tmp_path)}).directory == tmp_path / "torch-neuronx" / "neff"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    expected = tmp_path / "home" / ".cache" / "torch-neuronx" / "neff"
    assert CacheConfig.from_env({}).directory == expected
    assert CacheConfig.from_env({"XDG_CACHE_HOME": "relative/ignored"}).directory == expected
    config = CacheConfig.from_env({})
    assert config.max_size_mb is None and config.max_entries is None and not config.disabled


@pytest.mark.parametrize("value", ["1", "true", "TRUE", "yes", "on"])
def test_disabled_cache_never_hits_and_never_writes(cache_dir, value):
    cache = CompileCache.from_env({ENV_CACHE_DIR: str(cache_dir), ENV_DISABLE_CACHE: value})
    assert not cache.enabled
    assert not cache.put("k", b"x")
    assert cache.get("k") is None
    assert not cache_dir.exists()
    assert cache.entries() == [] and cache.stats().misses == 1
    with cache.lock("k"):
        pass


@pytest.mark.parametrize(("name", "value", "expected"), [
    (ENV_DISABLE_CACHE, "maybe", "use 1, true, yes or on"),
    (ENV_MAX_SIZE_MB, "lots", "positive number of MiB"),
    (ENV_MAX_SIZE_MB, "0", "positive number of MiB"),
    (ENV_MAX_SIZE_MB, "-5", "positive number of MiB"),
    (ENV_MAX_SIZE_MB, "nan", "positive number of MiB"),
    (ENV_MAX_SIZE_MB, "inf", "positive number of MiB"),
    (ENV_MAX_ENTRIES, "1.5", "positive whole number"),
    (ENV_MAX_ENTRIES, "0", "positive whole number"),
    (ENV_MAX_ENTRIES, "ten", "positive whole number"),
])
def test_invalid_environment_values_name_the_variable(tmp_path, name, value, expected):
    with pytest.raises(ValueError) as error:
        CacheConfig.from_env({ENV_CACHE_DIR: str(tmp_path), name: value})
    assert f"{name}={value!r}" in str(error.value) and expected in str(error.value)


# ---------------------------------------------------------------------------------------------
# An unusable directory falls back to memory, with one warning.


def _unusable_directories(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "a-file").write_text("not a directory")
    return {"is-a-file": tmp_path / "a-file", "under-a-file": tmp_path / "a-file" / "cache"}


@pytest.mark.parametrize("case", ["is-a-file", "under-a-file"])
def test_unusable_directory_falls_back_to_memory_with_one_warning(tmp_path, case):
    directory = _unusable_directories(tmp_path)[case]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        cache = _cache(directory)
        assert cache.put("k", b"payload") and cache.get("k") == b"payload"
        assert cache.get("absent") is None
        cache.put("k2", b"more")
    (message,) = _cache_warnings(record)
    assert str(directory) in message and "in memory" in message and ENV_CACHE_DIR in message
    assert ("not a directory" in message.lower()) and cache.location == "memory"
    assert cache.fallback_reason is not None


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write to read-only directories")
def test_read_only_directory_falls_back_to_memory(tmp_path):
    directory = tmp_path / "ro"
    directory.mkdir(mode=0o555)
    try:
        with pytest.warns(CompileCacheWarning, match="Permission denied") as record:
            cache = _cache(directory)
        assert len(_cache_warnings(record.list)) == 1 and cache.location == "memory"
    finally:
        directory.chmod(0o755)


def test_permission_denied_is_explained(tmp_path, monkeypatch):
    """The same as above for any user, root included: the probe write is refused."""
    def refuse(self):
        raise PermissionError(errno.EACCES, "Permission denied", str(self.root / ".locks"))
    monkeypatch.setattr(_cache_files.DirectoryStore, "probe", refuse)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        cache = _cache(tmp_path / "c")
    (message,) = _cache_warnings(record)
    assert f"cannot use the compile cache directory {tmp_path / 'c'}: Permission denied ({tmp_path / 'c' / '.locks'})" \
        in message
    assert cache.location == "memory"


def test_default_cache_is_made_once_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_CACHE_DIR, str(tmp_path / "env-dir"))
    default_cache.cache_clear()
    try:
        assert default_cache() is default_cache()
        assert default_cache().directory == tmp_path / "env-dir"
    finally:
        default_cache.cache_clear()


# ---------------------------------------------------------------------------------------------
# A failing disk: no partial entry, one warning, no exception.


def _full_disk_after(limit: int):
    """A stand-in for `_write_all` that writes ``limit`` bytes for real and then fails like a full disk."""
    def write_all(fd, chunks):
        budget = limit
        for chunk in chunks:
            view = memoryview(chunk).cast("B")[:budget]
            os.write(fd, view)
            budget -= len(view)
            if budget == 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return write_all


@pytest.mark.parametrize("where", ["mid-payload", "fsync"])
def test_a_full_disk_leaves_no_partial_entry(cache_dir, monkeypatch, where):
    cache = _cache(cache_dir)
    cache.put("k", b"old payload")  # an older entry for the key survives a failed rewrite
    if where == "fsync":
        def fsync(fd):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        monkeypatch.setattr(_cache_files.os, "fsync", fsync)
    else:
        monkeypatch.setattr(_cache_files, "_write_all", _full_disk_after(5000))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert cache.put("k", b"\7" * 100_000) is False
        assert cache.put("other", b"\7" * 100_000) is False
    monkeypatch.undo()
    messages = _cache_warnings(record)
    assert len(messages) == 2 and all("No space left on device" in m for m in messages)
    assert "could not write compile cache entry k " in messages[0]
    assert _files(cache_dir) == ["k.neff"]  # no temporary file, no new entry
    assert cache.get("k") == b"old payload"
    assert cache.stats().write_failures == 2 and cache.stats().writes == 1


def test_a_failed_rename_leaves_no_temporary_file(cache_dir, monkeypatch):
    cache = _cache(cache_dir)

    def replace(source, target):
        raise PermissionError(errno.EACCES, "Permission denied")
    monkeypatch.setattr(_cache_files.os, "replace", replace)
    with pytest.warns(CompileCacheWarning, match="Permission denied"):
        assert not cache.put("k", b"x")
    monkeypatch.undo()
    assert _files(cache_dir) == []


# ---------------------------------------------------------------------------------------------
# Housekeeping.


def test_remove_and_clear(cache_dir):
    cache = _cache(cache_dir)
    for key in "abc":
        cache.put(key, b"x")
    assert cache.remove("a") and not cache.remove("a")
    (cache_dir / ".dead-writer.0123.tmp").write_bytes(b"partial")
    old = time.time() - 2 * 3600
    os.utime(cache_dir / ".dead-writer.0123.tmp", (old, old))
    (cache_dir / "unrelated.txt").write_text("keep me")
    assert cache.clear() == 2
    assert _files(cache_dir) == ["unrelated.txt"]
    assert os.listdir(cache_dir / ".locks") == [".index.lock"]  # lock files of gone entries are removed


def test_prune_by_age_and_limits(cache_dir):
    cache = _cache(cache_dir, max_entries=10)
    for key in "abcde":
        cache.put(key, b"x" * 100)
    week_ago = time.time_ns() - 7 * 86400 * 10**9
    os.utime(cache_dir / "a.neff", ns=(week_ago, week_ago))
    assert cache.prune(older_than_days=3) == ["a"]
    cache.get("b")
    assert sorted(cache.prune(max_entries=2)) == ["c", "d"]
    assert sorted(e.key for e in cache.entries()) == ["b", "e"]
    assert cache.prune(max_size_mb=1.5 * _entry_size(100) / _MIB) == ["e"]
    assert cache.prune() == []  # the configured limit (10 entries) already holds
    with pytest.raises(ValueError, match="max_entries"):
        cache.prune(max_entries=0)
    with pytest.raises(ValueError, match="older_than_days"):
        cache.prune(older_than_days=-1)


def test_prune_keeps_a_young_temporary_file_of_a_live_writer(cache_dir):
    cache = _cache(cache_dir)
    (cache_dir / ".k.live.tmp").write_bytes(b"being written")
    cache.prune(max_entries=1)
    assert _files(cache_dir) == [".k.live.tmp"]


# ---------------------------------------------------------------------------------------------
# get_or_create and lock() within one process.


def test_get_or_create_compiles_once(cache_dir):
    cache = _cache(cache_dir)
    calls = []

    def compile_graph():
        calls.append(1)
        return b"compiled", {"graph_name": "fwd"}

    assert cache.get_or_create("k", compile_graph) == b"compiled"
    assert cache.get_or_create("k", compile_graph) == b"compiled"
    assert len(calls) == 1
    (info,) = cache.entries()
    assert info.metadata["graph_name"] == "fwd" and info.metadata["compile_seconds"] >= 0
    assert (cache.stats().hits, cache.stats().misses) == (1, 1)


def test_get_or_create_stores_nothing_when_compiling_fails(cache_dir):
    cache = _cache(cache_dir)

    def broken():
        raise RuntimeError("unsupported op aten::foo")
    with pytest.raises(RuntimeError, match="aten::foo"):
        cache.get_or_create("k", broken)
    assert cache.entries() == []
    with FileLock(cache_dir / ".locks" / "k.lock", timeout=0):  # the lock was released
        pass


def test_lock_is_reentrant_with_put_in_one_process(cache_dir):
    cache = _cache(cache_dir)
    other_object = _cache(cache_dir)
    with cache.lock("k", timeout=5), other_object.lock("k", timeout=5):
        assert other_object.put("k", b"x")
    assert cache.get("k") == b"x"


# ---------------------------------------------------------------------------------------------
# Several processes.

_WORKER = textwrap.dedent("""
    import sys, time, warnings
    from pathlib import Path
    from neuron_compile.cache import CacheConfig, CompileCache

    def wait_for(path):
        deadline = time.monotonic() + 60
        while not Path(path).exists():
            if time.monotonic() > deadline:
                sys.exit(f"timed out waiting for {path}")
            time.sleep(0.002)

    warnings.simplefilter("error")  # any cache warning fails the worker
    role, directory, sync = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    cache = CompileCache(CacheConfig(Path(directory), max_entries=int(sys.argv[4]) if len(sys.argv) > 4 else None))
    if role.startswith("writer"):
        keys = role.split(":")[1].split(",")
        (sync / f"ready-{role}").touch()
        wait_for(sync / "go")
        for key in keys:
            assert cache.put(key, role.encode() + b"-" * 1_000_000, {"writer": role}), "put failed"
        if len(keys) == 1:  # (with several keys, another writer may evict this one at once)
            assert cache.get(keys[0]) is not None
    elif role == "holder":  # holds the key's lock as if compiling, writes, then releases
        with cache.lock("graph"):
            (sync / "locked").touch()
            wait_for(sync / "go")
            cache.put("graph", b"compiled by the holder")
    elif role == "waiter":  # the backend's pattern: a miss, then wait for the lock, then look again
        assert cache.get("graph") is None
        (sync / "missed").touch()
        with cache.lock("graph"):
            payload = cache.get("graph")
            if payload is None:
                sys.exit("the waiter found no entry after the lock: it would compile twice")
        print(payload.decode())
    elif role == "get_or_create":
        (sync / "missed").touch()  # just before its first look, which misses
        print(cache.get_or_create("graph", lambda: sys.exit("compiled although another process had")).decode())
""")


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("NEURON_", "TORCH_NEURONX_"))}


def _start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _WORKER, *map(str, args)], env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(path: Path, processes: list[subprocess.Popen], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        for process in processes:
            if process.poll() is not None:
                pytest.fail(f"worker ended early: {process.communicate()}")
        assert time.monotonic() < deadline, f"timed out waiting for {path}"
        time.sleep(0.005)


def _finish(process: subprocess.Popen) -> str:
    out, err = process.communicate(timeout=400)
    assert process.returncode == 0, err
    return out


def test_concurrent_writers_of_one_key_all_succeed_and_leave_one_valid_entry(cache_dir, tmp_path):
    roles = [f"writer{i}:graph" for i in range(4)]
    workers = [_start(role, cache_dir, tmp_path) for role in roles]
    for role in roles:
        _wait_for(tmp_path / f"ready-{role}", workers)
    (tmp_path / "go").touch()
    for worker in workers:
        _finish(worker)
    assert _files(cache_dir) == ["graph.neff"]
    cache = _cache(cache_dir)
    writer = cache.entries()[0].metadata["writer"]
    assert cache.get("graph") == writer.encode() + b"-" * 1_000_000
    assert cache.verify("graph") is None


def test_concurrent_writers_respect_the_entry_limit(cache_dir, tmp_path):
    roles = [f"writer{i}:" + ",".join(f"k{i}-{j}" for j in range(4)) for i in range(3)]
    workers = [_start(role, cache_dir, tmp_path, 3) for role in roles]
    for role in roles:
        _wait_for(tmp_path / f"ready-{role}", workers)
    (tmp_path / "go").touch()
    for worker in workers:
        _finish(worker)
    entries = _cache(cache_dir).entries()
    assert len(entries) == 3 and not [name for name in _files(cache_dir) if name.endswith(".tmp")]
    assert all(_cache(cache_dir).verify(e.key) is None for e in entries)


@pytest.mark.parametrize("role", ["waiter", "get_or_create"])
def test_a_second_process_waits_for_the_lock_and_reuses_the_entry(cache_dir, tmp_path, role):
    holder = _start("holder", cache_dir, tmp_path)
    _wait_for(tmp_path / "locked", [holder])
    # While the holder compiles, this process cannot take the lock either.
    with pytest.raises(TimeoutError):
        with _cache(cache_dir).lock("graph", timeout=0.05):
            pass
    waiter = _start(role, cache_dir, tmp_path)
    _wait_for(tmp_path / "missed", [holder, waiter])
    time.sleep(0.3)  # give the waiter time to reach the lock; without a lock it would compile now
    assert waiter.poll() is None, waiter.communicate()
    (tmp_path / "go").touch()
    _finish(holder)
    assert _finish(waiter).strip() == "compiled by the holder"
