"""The persistent compile cache: compiled graphs (our NEFFs) kept on disk across processes.

Vocabulary. An *entry* is one compiled artifact (opaque bytes) stored under a *key*, a string of
letters, digits, ``.``, ``_`` and ``-`` that the backend derives from everything that decides
the compiled code (graph, input specs, compiler options, package and torch versions; `make_key`
hashes such a description). Each entry carries JSON *metadata* for people and tools (graph name,
input specs, compile seconds, ...), its creation time and its last use.

Configuration, read once by `CacheConfig.from_env`:

- ``TORCH_NEURONX_NEFF_CACHE_DIR``: the directory (default ``$XDG_CACHE_HOME/torch-neuronx/neff``,
  or ``~/.cache/torch-neuronx/neff``). Several processes and users may share it.
- ``TORCH_NEURONX_NEFF_DISABLE_CACHE``: ``1``/``true``/``yes``/``on`` turns the cache off (every
  lookup misses, nothing is written).
- ``NEURON_COMPILATION_CACHE_MAX_SIZE_MB`` (MiB, may be fractional) and
  ``NEURON_COMPILATION_CACHE_MAX_ENTRIES``: limits, unlimited when unset. After each write the
  least recently used entries are evicted until both hold. The entry just written is never
  evicted; an entry larger than the size limit by itself is not stored at all (with a warning),
  since keeping it would mean evicting everything else.

Guarantees. A write is atomic (a temporary file in the same directory, fsynced, then renamed
over the entry), so readers see a whole entry or none. Writers of one key serialise on a
per-key file lock (the ``filelock`` library), and `lock` exposes that lock so a process that
finds no entry can wait for another process compiling the same graph and reuse its result
(`get_or_create` does exactly this). Every read verifies a SHA-256 checksum over the whole
entry: a corrupt or truncated entry is reported by one `CompileCacheWarning`, removed, and
treated as a miss, so the graph is compiled again. Nothing the disk does raises into a
training run: a failed write (full disk, lost permissions) warns, leaves no partial file, and
the run goes on; a directory that cannot be used at all turns the cache into an in-memory one,
with one warning that says how to fix it.

Directory layout (other files in the directory are left alone)::

    <dir>/<key>.neff              one entry; its modification time is its last use (LRU order)
    <dir>/.<key>.<random>.tmp     an entry being written (removed by prune/clear after an hour,
                                  in case its writer was killed)
    <dir>/.locks/<key>.lock       the per-key file lock
    <dir>/.locks/.index.lock      held while evicting, pruning or clearing

Entry layout (one self-describing file; the same bytes in memory)::

    offset   size  field
    0        8     magic b"TNXCACHE"
    8        2     format version, unsigned big-endian (1)
    10       4     header length H, unsigned big-endian
    14       H     header: UTF-8 JSON {"key", "created", "payload_size", "metadata"}
    14+H     P     payload: the compiled artifact, P = header["payload_size"]
    14+H+P   32    SHA-256 of every byte before it (magic, version, header and payload)

The checksum covers the header too, so a flipped bit anywhere, a truncated file and a file
renamed to another key are all detected.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import re
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from neuron_compile._cache_files import (
    Buffer,
    CorruptEntry,
    DirectoryStore,
    MemoryStore,
    Store,
    StoredFile,
    decode_entry,
    decode_header,
    encode_entry,
    format_size,
    header_end,
)

__all__ = [
    "ENV_CACHE_DIR",
    "ENV_DISABLE_CACHE",
    "ENV_MAX_ENTRIES",
    "ENV_MAX_SIZE_MB",
    "CacheConfig",
    "CacheStats",
    "CompileCache",
    "CompileCacheWarning",
    "EntryInfo",
    "default_cache",
    "make_key",
]

ENV_CACHE_DIR = "TORCH_NEURONX_NEFF_CACHE_DIR"
ENV_DISABLE_CACHE = "TORCH_NEURONX_NEFF_DISABLE_CACHE"
ENV_MAX_SIZE_MB = "NEURON_COMPILATION_CACHE_MAX_SIZE_MB"
ENV_MAX_ENTRIES = "NEURON_COMPILATION_CACHE_MAX_ENTRIES"

_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
_MIB = 1024 * 1024
_STALE_TEMPORARY_SECONDS = 3600.0  # a temporary file this old belongs to a writer that died
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})


class CompileCacheWarning(UserWarning):
    """Something went wrong with the compile cache; the run continues (possibly recompiling)."""


# ---------------------------------------------------------------------------------------------
# Configuration.


def _default_directory(environ: Mapping[str, str]) -> Path:
    base = environ.get("XDG_CACHE_HOME", "")
    root = Path(base) if os.path.isabs(base) else Path("~/.cache").expanduser()
    return root / "torch-neuronx" / "neff"


def _parse_flag(name: str, value: str) -> bool:
    word = value.strip().lower()
    if word in _TRUE or word in _FALSE:
        return word in _TRUE
    raise ValueError(f"{name}={value!r} is not valid: use 1, true, yes or on to disable the compile cache, "
                     f"or 0, false, no, off (or leave it unset) to use it")


def _parse_size_mb(name: str, value: str) -> float | None:
    if not value.strip():
        return None
    try:
        megabytes = float(value)
    except ValueError:
        megabytes = math.nan
    if not (math.isfinite(megabytes) and megabytes > 0):
        raise ValueError(f"{name}={value!r} is not valid: expected a positive number of MiB (for example 4096), "
                         f"or leave it unset for no size limit")
    return megabytes


def _parse_count(name: str, value: str) -> int | None:
    if not value.strip():
        return None
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count <= 0:
        raise ValueError(f"{name}={value!r} is not valid: expected a positive whole number of entries "
                         f"(for example 1000), or leave it unset for no limit")
    return count


@dataclass(frozen=True)
class CacheConfig:
    """Where the cache lives and how big it may grow; ``directory=None`` keeps it in memory."""

    directory: Path | None
    disabled: bool = False
    max_size_mb: float | None = None
    max_entries: int | None = None

    def __post_init__(self) -> None:
        if self.directory is not None:
            object.__setattr__(self, "directory", Path(self.directory).expanduser().absolute())
        if self.max_size_mb is not None and not (math.isfinite(self.max_size_mb) and self.max_size_mb > 0):
            raise ValueError(f"max_size_mb must be a positive number of MiB, got {self.max_size_mb!r}")
        if self.max_entries is not None and not (isinstance(self.max_entries, int) and self.max_entries > 0):
            raise ValueError(f"max_entries must be a positive integer, got {self.max_entries!r}")

    @property
    def max_size_bytes(self) -> int | None:
        """The size limit in bytes, or None."""
        return None if self.max_size_mb is None else int(self.max_size_mb * _MIB)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CacheConfig:
        """Reads the four environment variables; raises ValueError naming any that is invalid."""
        env = os.environ if environ is None else environ
        directory = env.get(ENV_CACHE_DIR, "").strip()
        return cls(
            directory=Path(directory) if directory else _default_directory(env),
            disabled=_parse_flag(ENV_DISABLE_CACHE, env.get(ENV_DISABLE_CACHE, "")),
            max_size_mb=_parse_size_mb(ENV_MAX_SIZE_MB, env.get(ENV_MAX_SIZE_MB, "")),
            max_entries=_parse_count(ENV_MAX_ENTRIES, env.get(ENV_MAX_ENTRIES, "")),
        )


# ---------------------------------------------------------------------------------------------
# What the cache reports.


@dataclass(frozen=True)
class EntryInfo:
    """One entry as listed: sizes in bytes, times in seconds since the epoch."""

    key: str
    size: int
    last_used: float
    created: float | None
    payload_size: int | None
    metadata: dict[str, Any]
    path: Path | None
    problem: str | None = None  # set when even the header cannot be read


@dataclass(frozen=True)
class CacheStats:
    """Counts since this cache object was made (for the metrics report)."""

    hits: int = 0
    misses: int = 0
    corrupt: int = 0  # entries found damaged, removed and counted as misses too
    writes: int = 0
    write_failures: int = 0
    evictions: int = 0
    too_large: int = 0  # entries not stored because they alone exceed the size limit


def make_key(description: Mapping[str, Any]) -> str:
    """A key (64 hex digits) for everything that decides a compiled graph, given as JSON-able data."""
    try:
        text = json.dumps(description, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as error:
        raise TypeError(f"a compile cache key must be described by JSON data (str, numbers, lists, dicts): "
                        f"{error}") from None
    return hashlib.sha256(text.encode()).hexdigest()


def _check_key(key: str) -> None:
    if not (isinstance(key, str) and _KEY.fullmatch(key)):
        raise ValueError(f"invalid compile cache key {key!r}: use 1 to 200 letters, digits, '.', '_' or '-', "
                         f"not starting with '.', '_' or '-' (make_key() builds one)")


def _plan_eviction(files: list[StoredFile], max_bytes: int | None, max_entries: int | None,
                   keep: str | None = None) -> list[StoredFile]:
    """The least recently used entries to remove so that both limits hold (never ``keep``)."""
    total = sum(f.size for f in files)
    count = len(files)
    victims = []
    for candidate in sorted(files, key=lambda f: (f.last_used_ns, f.key)):
        if (max_bytes is None or total <= max_bytes) and (max_entries is None or count <= max_entries):
            break
        if candidate.key == keep:
            continue
        victims.append(candidate)
        total -= candidate.size
        count -= 1
    return victims


def _describe_os_error(error: OSError, directory: Path) -> str:
    path = Path(error.filename) if error.filename else directory
    if isinstance(error, FileExistsError):  # what mkdir(exist_ok=True) raises for a file
        return "it is a file, not a directory" if path == directory else f"{path} is a file, not a directory"
    return f"{error.strerror or error}" + (f" ({path})" if path != directory else "")


# ---------------------------------------------------------------------------------------------
# The cache.


class CompileCache:
    """Compiled artifacts under string keys, in a directory shared by processes (or in memory)."""

    def __init__(self, config: CacheConfig) -> None:
        self._config = config
        self._mutex = threading.Lock()
        self._counts = dict.fromkeys((f.name for f in fields(CacheStats)), 0)
        self._last_ns = 0
        self.fallback_reason: str | None = None
        """Why the configured directory could not be used (the cache is then in memory), or None."""
        self._store: Store | None = None
        if config.disabled:
            return
        if config.directory is None:
            self._store = MemoryStore()
            return
        store = DirectoryStore(config.directory)
        try:
            store.probe()
        except OSError as error:
            self.fallback_reason = _describe_os_error(error, config.directory)
            self._warn(f"cannot use the compile cache directory {config.directory}: {self.fallback_reason}. "
                       f"Compiled graphs are cached in memory for this process only; set {ENV_CACHE_DIR} "
                       f"to a writable directory (or {ENV_DISABLE_CACHE}=1 to turn the cache off).")
            self._store = MemoryStore()
        else:
            self._store = store

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CompileCache:
        """The cache the environment describes (see the module docstring)."""
        return cls(CacheConfig.from_env(environ))

    @property
    def config(self) -> CacheConfig:
        """The configuration this cache was made with."""
        return self._config

    @property
    def enabled(self) -> bool:
        """False when the cache is disabled: nothing is read or written."""
        return self._store is not None

    @property
    def directory(self) -> Path | None:
        """The directory entries live in, or None when they live in memory (or nowhere)."""
        return self._store.root if isinstance(self._store, DirectoryStore) else None

    @property
    def location(self) -> str:
        """Where entries live, for messages."""
        if self._store is None:
            return "nowhere (cache disabled)"
        return str(self.directory) if self.directory is not None else "memory"

    # -- lookups and writes ---------------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        """The payload stored under ``key``, or None (a miss; also for a corrupt entry, after a warning)."""
        _check_key(key)
        payload = self._load(key)
        self._count("hits" if payload is not None else "misses")
        return payload

    def put(self, key: str, payload: Buffer, metadata: Mapping[str, Any] | None = None) -> bool:
        """Stores ``payload`` under ``key``; returns whether it is now cached. Disk errors only warn."""
        _check_key(key)
        store = self._store
        if store is None:
            return False
        chunks = encode_entry(key, payload, metadata or {}, created=time.time())
        size = sum(memoryview(chunk).nbytes for chunk in chunks)
        max_bytes = self._config.max_size_bytes
        if max_bytes is not None and size > max_bytes:
            self._count("too_large")
            self._warn(f"compiled graph {key} ({format_size(size)}) is larger than the whole compile cache "
                       f"({ENV_MAX_SIZE_MB}={self._config.max_size_mb:g}); it is not cached")
            return False
        try:
            with store.key_lock(key, None):
                store.write(key, chunks, self._now_ns())
        except OSError as error:
            self._count("write_failures")
            self._warn(f"could not write compile cache entry {key} to {self.location}: {error}. Nothing "
                       f"partial was left behind; the graph will be compiled again in a new process.")
            return False
        self._count("writes")
        if self._config.max_size_mb is not None or self._config.max_entries is not None:
            self._enforce_limits(keep=key)
        return True

    @contextlib.contextmanager
    def lock(self, key: str, timeout: float | None = None) -> Iterator[None]:
        """Holds the per-key lock (across processes) while compiling ``key``; TimeoutError after ``timeout`` s."""
        _check_key(key)
        with contextlib.ExitStack() as stack:
            if self._store is not None:
                try:
                    stack.enter_context(self._store.key_lock(key, timeout))
                except TimeoutError:
                    raise
                except OSError as error:
                    self._warn(f"could not lock compile cache entry {key} in {self.location}: {error}; "
                               f"compiling without waiting for other processes")
            yield

    def get_or_create(self, key: str, create: Callable[[], tuple[Buffer, Mapping[str, Any]]],
                      timeout: float | None = None) -> bytes:
        """The payload under ``key``; on a miss, ``create()`` (payload, metadata) runs under `lock`, once
        across processes: a process that waited reuses the entry the first one wrote."""
        _check_key(key)
        payload = self._load(key)
        if payload is None:
            with self.lock(key, timeout):
                payload = self._load(key)  # written by another process while this one waited?
                if payload is None:
                    return self._create(key, create)
        self._count("hits")
        return payload

    def _create(self, key: str, create: Callable[[], tuple[Buffer, Mapping[str, Any]]]) -> bytes:
        self._count("misses")
        start = time.perf_counter()
        payload, metadata = create()
        metadata = {"compile_seconds": round(time.perf_counter() - start, 6), **metadata}
        self.put(key, payload, metadata)
        return bytes(payload)

    def _load(self, key: str) -> bytes | None:
        """Reads and verifies an entry; None for a missing, unreadable or corrupt one (then removed)."""
        store = self._store
        if store is None:
            return None
        try:
            found = store.read(key)
        except OSError as error:
            self._warn(f"could not read compile cache entry {key} in {self.location}: {error}; "
                       f"the graph will be compiled again")
            return None
        if found is None:
            return None
        data, identity = found
        try:
            _, payload = decode_entry(data, key)
        except CorruptEntry as problem:
            self._count("corrupt")
            with contextlib.suppress(OSError):
                store.remove(key, identity)
            self._warn(f"compile cache entry {key} ({store.path(key) or 'in memory'}) is corrupt: {problem}. "
                       f"It was removed and the graph will be compiled again.")
            return None
        store.touch(key, self._now_ns())
        return bytes(payload)

    # -- listing and housekeeping -----------------------------------------------------------------

    def entries(self) -> list[EntryInfo]:
        """Every entry, most recently used first."""
        store = self._store
        if store is None:
            return []
        infos = [info for stored in store.scan() if (info := self._describe(store, stored)) is not None]
        return sorted(infos, key=lambda info: (-info.last_used, info.key))

    def entry(self, key: str) -> EntryInfo | None:
        """One entry's information, or None if there is no entry under ``key``."""
        _check_key(key)
        store = self._store
        found = [f for f in store.scan() if f.key == key] if store is not None else []
        return self._describe(store, found[0]) if found else None  # (None as well if just removed)

    def verify(self, key: str) -> str | None:
        """Checks an entry without using or removing it: None if intact, else the problem; KeyError if absent."""
        _check_key(key)
        found = self._store.read(key) if self._store is not None else None
        if found is None:
            raise KeyError(key)
        try:
            decode_entry(found[0], key)
        except CorruptEntry as problem:
            return str(problem)
        return None

    def remove(self, key: str) -> bool:
        """Removes the entry under ``key``; returns whether there was one."""
        _check_key(key)
        return self._store is not None and self._store.remove(key)

    def clear(self) -> int:
        """Removes every entry (and debris of writers that died); returns how many entries."""
        store = self._store
        if store is None:
            return 0
        with store.index_lock():
            removed = sum(store.remove(stored.key) for stored in store.scan())
        store.clean_up(_STALE_TEMPORARY_SECONDS)
        return removed

    def prune(self, max_size_mb: float | None = None, max_entries: int | None = None,
              older_than_days: float | None = None) -> list[str]:
        """Removes entries unused for ``older_than_days``, then least recently used ones until the limits
        hold (the configured limits when none is given); returns the removed keys."""
        if max_size_mb is None and max_entries is None and older_than_days is None:
            max_size_mb, max_entries = self._config.max_size_mb, self._config.max_entries
        limits = CacheConfig(None, max_size_mb=max_size_mb, max_entries=max_entries)  # validates them
        if older_than_days is not None and not (math.isfinite(older_than_days) and older_than_days >= 0):
            raise ValueError(f"older_than_days must be a number of days >= 0, got {older_than_days!r}")
        store = self._store
        if store is None:
            return []
        with store.index_lock():
            files = store.scan()
            victims = []
            if older_than_days is not None:
                cutoff_ns = time.time_ns() - int(older_than_days * 86400e9)
                victims = [f for f in files if f.last_used_ns < cutoff_ns]
                files = [f for f in files if f.last_used_ns >= cutoff_ns]
            victims += _plan_eviction(files, limits.max_size_bytes, limits.max_entries)
            removed = [f.key for f in victims if store.remove(f.key)]
        store.clean_up(_STALE_TEMPORARY_SECONDS)
        return removed

    def stats(self) -> CacheStats:
        """A snapshot of this object's counters."""
        with self._mutex:
            return CacheStats(**self._counts)

    # -- internals --------------------------------------------------------------------------------

    def _enforce_limits(self, keep: str) -> None:
        store = self._store
        assert store is not None
        try:
            with store.index_lock():
                victims = _plan_eviction(store.scan(), self._config.max_size_bytes, self._config.max_entries, keep)
                evicted = sum(store.remove(victim.key) for victim in victims)
        except OSError as error:
            self._warn(f"could not evict old compile cache entries in {self.location}: {error}")
            return
        self._count("evictions", evicted)

    def _describe(self, store: Store, stored: StoredFile) -> EntryInfo | None:
        """Reads an entry's header (not its payload); None if the entry has just gone."""
        header: dict[str, Any] = {}
        problem = None
        try:
            head = store.read_head(stored.key, 4096)
            end = header_end(head, stored.size)
            if end > len(head):
                head = store.read_head(stored.key, end)
            header = decode_header(head, stored.size)
        except CorruptEntry as error:
            problem = str(error)
        except FileNotFoundError:
            return None  # removed since the scan
        except OSError as error:
            problem = f"unreadable: {error}"
        return EntryInfo(
            key=stored.key, size=stored.size, last_used=stored.last_used_ns / 1e9,
            created=header.get("created"), payload_size=header.get("payload_size"),
            metadata=header.get("metadata", {}), path=store.path(stored.key), problem=problem,
        )

    def _now_ns(self) -> int:
        """Wall-clock nanoseconds, strictly increasing within this process (orders LRU uses)."""
        with self._mutex:
            self._last_ns = max(time.time_ns(), self._last_ns + 1)
            return self._last_ns

    def _count(self, name: str, amount: int = 1) -> None:
        with self._mutex:
            self._counts[name] += amount

    @staticmethod
    def _warn(message: str) -> None:
        warnings.warn(message, CompileCacheWarning, stacklevel=3)


@functools.cache
def default_cache() -> CompileCache:
    """The process-wide cache from the environment, made on first use (``default_cache.cache_clear()`` resets it)."""
    return CompileCache.from_env()
