"""Storage under the compile cache: the entry format and the stores entries live in.

`encode_entry` / `decode_entry` implement the entry layout, `DirectoryStore` the directory
layout, both described in `neuron_compile.cache`; `MemoryStore` holds the same entry bytes in
a dict when no directory can be used. The stores only move bytes: every policy (checksums,
warnings, limits, eviction) is `CompileCache`'s.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import struct
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from filelock import FileLock

__all__ = [
    "DIGEST_SIZE",
    "ENTRY_SUFFIX",
    "FORMAT_VERSION",
    "MAGIC",
    "PREAMBLE_SIZE",
    "Buffer",
    "CorruptEntry",
    "DirectoryStore",
    "MemoryStore",
    "Store",
    "StoredFile",
    "decode_entry",
    "decode_header",
    "encode_entry",
    "format_size",
    "header_end",
]

MAGIC = b"TNXCACHE"
FORMAT_VERSION = 1
ENTRY_SUFFIX = ".neff"
_PREAMBLE = struct.Struct(">8sHI")  # magic, format version, header length
PREAMBLE_SIZE = _PREAMBLE.size
DIGEST_SIZE = hashlib.sha256().digest_size
_MAX_HEADER = 64 * 1024 * 1024  # a larger header length can only come from a damaged preamble

Buffer = bytes | bytearray | memoryview


class CorruptEntry(Exception):
    """An entry's bytes fail a check; the message says which, in words a user can act on."""


@dataclass(frozen=True)
class StoredFile:
    """What a store knows about an entry without reading it: its size and last use."""

    key: str
    size: int
    last_used_ns: int


# ---------------------------------------------------------------------------------------------
# The entry format.


def encode_entry(key: str, payload: Buffer, metadata: Mapping[str, Any], created: float) -> list[Buffer]:
    """Returns an entry's bytes as chunks (the payload is not copied); raises TypeError for bad metadata."""
    payload = memoryview(payload).cast("B")
    try:
        header = json.dumps(
            {"key": key, "created": created, "payload_size": payload.nbytes, "metadata": dict(metadata)},
            sort_keys=True, allow_nan=False,
        ).encode()
    except (TypeError, ValueError) as error:
        raise TypeError(f"compile cache metadata for {key!r} must be JSON-serialisable: {error}") from None
    chunks: list[Buffer] = [_PREAMBLE.pack(MAGIC, FORMAT_VERSION, len(header)), header, payload]
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk)
    chunks.append(digest.digest())
    return chunks


def header_end(head: Buffer, total_size: int) -> int:
    """Checks an entry's preamble (its first PREAMBLE_SIZE bytes); returns where its header ends."""
    if len(head) < PREAMBLE_SIZE:
        raise CorruptEntry(f"truncated: {total_size} bytes, shorter than the {PREAMBLE_SIZE}-byte preamble")
    magic, version, header_len = _PREAMBLE.unpack_from(head)
    if magic != MAGIC:
        raise CorruptEntry(f"not a compile cache entry (starts with {bytes(magic)!r}, expected {MAGIC!r})")
    if version != FORMAT_VERSION:
        raise CorruptEntry(f"format version {version}, but this neuron-compile reads version {FORMAT_VERSION}")
    if header_len > _MAX_HEADER:
        raise CorruptEntry(f"damaged preamble (header length {header_len})")
    return PREAMBLE_SIZE + header_len


def decode_header(head: Buffer, total_size: int) -> dict[str, Any]:
    """Parses the header from an entry's first bytes (at least up to `header_end`); no checksum."""
    end = header_end(head, total_size)
    if len(head) < end:
        raise CorruptEntry(f"truncated: {total_size} bytes, the header alone needs {end}")
    try:
        header = json.loads(bytes(head[PREAMBLE_SIZE:end]))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CorruptEntry(f"unreadable header ({error})") from None
    if not (isinstance(header, dict) and isinstance(header.get("payload_size"), int)
            and isinstance(header.get("key"), str) and isinstance(header.get("metadata"), dict)):
        raise CorruptEntry("header lacks key, payload_size or metadata")
    return header


def decode_entry(data: Buffer, key: str) -> tuple[dict[str, Any], memoryview]:
    """Verifies a whole entry for ``key``; returns its header and a view of its payload, or raises CorruptEntry."""
    data = memoryview(data)
    header = decode_header(data, len(data))
    payload_start = header_end(data, len(data))
    payload_end = payload_start + header["payload_size"]
    expected = payload_end + DIGEST_SIZE
    if len(data) < expected:
        raise CorruptEntry(f"truncated: {len(data)} of {expected} bytes")
    if len(data) > expected:
        raise CorruptEntry(f"{len(data) - expected} unexpected bytes after the checksum")
    stored = bytes(data[payload_end:])
    computed = hashlib.sha256(data[:payload_end]).digest()
    if stored != computed:
        raise CorruptEntry(f"checksum mismatch (stored sha256 {stored.hex()[:16]}..., "
                           f"content hashes to {computed.hex()[:16]}...)")
    if header["key"] != key:
        raise CorruptEntry(f"holds the entry for key {header['key']!r}")
    return header, data[payload_start:payload_end]


def format_size(size: float) -> str:
    """A byte count for people: 512 B, 3.2 KiB, 1.5 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


# ---------------------------------------------------------------------------------------------
# Stores: where entry bytes live. Both are used by CompileCache, which owns every policy.


class Store(Protocol):
    """Raw entry storage; every method may raise OSError except where it says otherwise."""

    def read(self, key: str) -> tuple[bytes, object] | None:
        """Returns an entry's bytes and an identity for `remove`, or None if there is none."""

    def read_head(self, key: str, size: int) -> bytes:
        """Returns at least the first ``size`` bytes of an entry (fewer if the entry is shorter)."""

    def write(self, key: str, chunks: Sequence[Buffer], last_used_ns: int) -> None:
        """Atomically makes ``chunks`` the entry for ``key``; leaves nothing behind on failure."""

    def remove(self, key: str, identity: object | None = None) -> bool:
        """Removes an entry (only if it is still ``identity``, when given); returns whether it did."""

    def touch(self, key: str, when_ns: int) -> None:
        """Records a use of an entry; never raises."""

    def scan(self) -> list[StoredFile]:
        """Lists the entries with their sizes and last uses."""

    def key_lock(self, key: str, timeout: float | None) -> contextlib.AbstractContextManager[None]:
        """Excludes other writers of ``key`` (other processes too, for a directory)."""

    def index_lock(self) -> contextlib.AbstractContextManager[None]:
        """Excludes other evictions, prunes and clears."""

    def path(self, key: str) -> Path | None:
        """The entry's file, if entries are files."""

    def clean_up(self, older_than_s: float) -> None:
        """Removes debris (temporary files from killed writers, unused lock files); never raises."""


@contextlib.contextmanager
def _holding(path: Path, timeout: float | None) -> Iterator[None]:
    """Holds the file lock at ``path``; raises TimeoutError after ``timeout`` seconds (None: waits)."""
    # One instance per path in this process (is_singleton), so holding lock(key) while calling
    # put(key) re-enters instead of deadlocking. The timeout goes to acquire(), not to the
    # constructor: a singleton refuses to be constructed again with different options.
    lock = FileLock(path, is_singleton=True)
    lock.acquire(timeout=-1 if timeout is None else timeout)
    try:
        yield
    finally:
        lock.release()


def _write_all(fd: int, chunks: Sequence[Buffer]) -> None:
    """Writes every chunk to ``fd`` (handles short writes)."""
    for chunk in chunks:
        view = memoryview(chunk).cast("B")
        while view:
            view = view[os.write(fd, view):]


class DirectoryStore:
    """Entries as files in one directory, shared by every process that points at it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._locks = root / ".locks"

    def probe(self) -> None:
        """Creates the directory and proves it writable; raises OSError saying why not."""
        self.root.mkdir(parents=True, exist_ok=True)
        self._locks.mkdir(exist_ok=True)
        probe = self.root / f".probe-{secrets.token_hex(8)}.tmp"
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
        os.unlink(probe)

    def path(self, key: str) -> Path:
        return self.root / f"{key}{ENTRY_SUFFIX}"

    def read(self, key: str) -> tuple[bytes, object] | None:
        try:
            with open(self.path(key), "rb") as file:
                status = os.fstat(file.fileno())
                return file.read(), (status.st_dev, status.st_ino)
        except FileNotFoundError:
            return None

    def read_head(self, key: str, size: int) -> bytes:
        with open(self.path(key), "rb") as file:
            return file.read(size)

    def write(self, key: str, chunks: Sequence[Buffer], last_used_ns: int) -> None:
        temporary = self.root / f".{key}.{secrets.token_hex(8)}.tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            try:
                _write_all(fd, chunks)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.utime(temporary, ns=(last_used_ns, last_used_ns))
            os.replace(temporary, self.path(key))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        self._sync_directory()

    def _sync_directory(self) -> None:
        """Makes the rename durable; best effort (some filesystems refuse fsync on a directory)."""
        with contextlib.suppress(OSError):
            fd = os.open(self.root, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def remove(self, key: str, identity: object | None = None) -> bool:
        path = self.path(key)
        try:
            if identity is not None:
                status = os.stat(path)
                if (status.st_dev, status.st_ino) != identity:
                    return False  # a writer has replaced it since it was read
            os.unlink(path)
        except FileNotFoundError:
            return False
        return True

    def touch(self, key: str, when_ns: int) -> None:
        with contextlib.suppress(OSError):
            os.utime(self.path(key), ns=(when_ns, when_ns))

    def scan(self) -> list[StoredFile]:
        found = []
        with os.scandir(self.root) as listing:
            for item in listing:
                if item.name.startswith(".") or not item.name.endswith(ENTRY_SUFFIX):
                    continue
                try:
                    status = item.stat()
                except FileNotFoundError:
                    continue  # removed since the listing
                found.append(StoredFile(item.name[: -len(ENTRY_SUFFIX)], status.st_size, status.st_mtime_ns))
        return found

    def key_lock(self, key: str, timeout: float | None) -> contextlib.AbstractContextManager[None]:
        self._locks.mkdir(parents=True, exist_ok=True)  # in case someone removed the directory
        return _holding(self._locks / f"{key}.lock", timeout)

    def index_lock(self) -> contextlib.AbstractContextManager[None]:
        self._locks.mkdir(parents=True, exist_ok=True)
        return _holding(self._locks / ".index.lock", None)  # keys never start with "."

    def clean_up(self, older_than_s: float) -> None:
        cutoff = time.time() - older_than_s
        with contextlib.suppress(OSError), os.scandir(self.root) as listing:
            for item in listing:
                if item.name.startswith(".") and item.name.endswith(".tmp"):
                    with contextlib.suppress(OSError):
                        if item.stat().st_mtime < cutoff:
                            os.unlink(item.path)
        with contextlib.suppress(OSError), os.scandir(self._locks) as listing:
            for item in listing:
                key = item.name.removesuffix(".lock")
                if item.name.startswith(".") or self.path(key).exists():
                    continue
                # Removing a lock file nobody holds is safe: filelock notices an unlinked inode
                # and retries. One somebody holds (this process included: a separate instance
                # conflicts) is skipped.
                with contextlib.suppress(Exception), FileLock(item.path, timeout=0):
                    os.unlink(item.path)


class MemoryStore:
    """Entries in this process's memory: the fallback when no directory can be used."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[bytes, int]] = {}
        self._mutex = threading.RLock()
        self._key_locks: dict[str, threading.RLock] = {}

    def path(self, key: str) -> None:
        return None

    def read(self, key: str) -> tuple[bytes, object] | None:
        with self._mutex:
            found = self._entries.get(key)
        return None if found is None else (found[0], id(found[0]))

    def read_head(self, key: str, size: int) -> bytes:
        with self._mutex:
            if key not in self._entries:
                raise FileNotFoundError(f"no entry {key} in memory")
            return self._entries[key][0][:size]

    def write(self, key: str, chunks: Sequence[Buffer], last_used_ns: int) -> None:
        data = b"".join(chunks)
        with self._mutex:
            self._entries[key] = (data, last_used_ns)

    def remove(self, key: str, identity: object | None = None) -> bool:
        with self._mutex:
            found = self._entries.get(key)
            if found is None or (identity is not None and id(found[0]) != identity):
                return False
            del self._entries[key]
            return True

    def touch(self, key: str, when_ns: int) -> None:
        with self._mutex:
            if key in self._entries:
                self._entries[key] = (self._entries[key][0], when_ns)

    def scan(self) -> list[StoredFile]:
        with self._mutex:
            return [StoredFile(key, len(data), used) for key, (data, used) in self._entries.items()]

    def key_lock(self, key: str, timeout: float | None) -> contextlib.AbstractContextManager[None]:
        with self._mutex:
            return self._key_locks.setdefault(key, threading.RLock())

    def index_lock(self) -> contextlib.AbstractContextManager[None]:
        return self._mutex

    def clean_up(self, older_than_s: float) -> None:
        pass
