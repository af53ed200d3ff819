"""The ``neuron-compile-cache`` command: look after the persistent compile cache.

    neuron-compile-cache [--cache-dir DIR] list [--json]
    neuron-compile-cache [--cache-dir DIR] inspect KEY_PREFIX
    neuron-compile-cache [--cache-dir DIR] prune [--max-size-mb N] [--max-entries N] [--older-than-days D]
    neuron-compile-cache [--cache-dir DIR] clear [--yes]
    neuron-compile-cache [--cache-dir DIR] info

The directory is ``--cache-dir``, else ``TORCH_NEURONX_NEFF_CACHE_DIR``, else the default (see
`neuron_compile.cache`); the command works on it even when ``TORCH_NEURONX_NEFF_DISABLE_CACHE``
is set. An entry is named by any unambiguous prefix of its key. ``list`` describes an entry by
its metadata's ``description``, ``graph_name`` or ``name``, whichever comes first.

Exit status: 0 on success; 1 when no entry (or more than one) matches a key prefix, when
``inspect`` finds the entry corrupt, or when the directory cannot be used; 2 for bad arguments
or an invalid environment variable.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
import warnings
from pathlib import Path

from neuron_compile._cache_files import FORMAT_VERSION, format_size
from neuron_compile.cache import (
    ENV_CACHE_DIR,
    ENV_DISABLE_CACHE,
    ENV_MAX_ENTRIES,
    ENV_MAX_SIZE_MB,
    CacheConfig,
    CompileCache,
    CompileCacheWarning,
    EntryInfo,
)

__all__ = ["main"]

_PROG = "neuron-compile-cache"
_KEY_COLUMN = 12  # characters of a key shown by `list` (more when needed to tell keys apart)


class _Failure(Exception):
    """Ends the command with a message on stderr and an exit status."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


# ---------------------------------------------------------------------------------------------
# Argument parsing.


def _positive_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _positive_integer(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return value


def _days(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"expected a number of days >= 0, got {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    # --cache-dir is accepted before or after the command; SUPPRESS keeps one from erasing the other.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--cache-dir", metavar="DIR", default=argparse.SUPPRESS,
                        help=f"the cache directory (default: ${ENV_CACHE_DIR}, or ~/.cache/torch-neuronx/neff)")
    parser = argparse.ArgumentParser(prog=_PROG, parents=[common],
                                     description="List, inspect, prune and clear the torch-neuronx compile cache.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    listing = commands.add_parser("list", parents=[common], help="the entries, most recently used first")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")

    inspect = commands.add_parser("inspect", parents=[common], help="one entry: metadata and checksum status")
    inspect.add_argument("key_prefix", metavar="KEY_PREFIX", help="the entry's key or an unambiguous prefix")

    prune = commands.add_parser("prune", parents=[common],
                                help="remove old and least recently used entries (default: the configured limits)")
    prune.add_argument("--max-size-mb", type=_positive_number, metavar="N", help="keep at most N MiB")
    prune.add_argument("--max-entries", type=_positive_integer, metavar="N", help="keep at most N entries")
    prune.add_argument("--older-than-days", type=_days, metavar="D", help="remove entries unused for D days")

    clear = commands.add_parser("clear", parents=[common], help="remove every entry")
    clear.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")

    commands.add_parser("info", parents=[common], help="the directory, its limits, size and entry count")
    return parser


# ---------------------------------------------------------------------------------------------
# Helpers.


def _open_cache(cache_dir: str | None) -> tuple[CompileCache, CacheConfig]:
    """The cache to work on, and the configuration the environment gives (for `info`)."""
    try:
        configured = CacheConfig.from_env()
    except ValueError as error:
        raise _Failure(str(error), status=2) from None
    config = dataclasses.replace(configured, disabled=False)
    if cache_dir is not None:
        config = dataclasses.replace(config, directory=Path(cache_dir))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CompileCacheWarning)  # reported below as an error instead
        cache = CompileCache(config)
    if cache.fallback_reason is not None:
        raise _Failure(f"cannot use the cache directory {config.directory}: {cache.fallback_reason}")
    return cache, configured


def _when(seconds: float | None) -> str:
    return "-" if seconds is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def _description(entry: EntryInfo) -> str:
    if entry.problem is not None:
        return f"CORRUPT: {entry.problem}"
    for name in ("description", "graph_name", "name"):
        if isinstance(entry.metadata.get(name), str):
            return entry.metadata[name]
    text = json.dumps(entry.metadata, sort_keys=True) if entry.metadata else ""
    return text if len(text) <= 60 else text[:57] + "..."


def _resolve(cache: CompileCache, prefix: str) -> EntryInfo:
    """The one entry whose key is ``prefix`` or starts with it."""
    entries = cache.entries()
    exact = [entry for entry in entries if entry.key == prefix]
    matches = exact or [entry for entry in entries if entry.key.startswith(prefix)]
    if not matches:
        raise _Failure(f"no cache entry matches {prefix!r} in {cache.location} ({len(entries)} entries; "
                       f"see `{_PROG} list`)")
    if len(matches) > 1:
        shown = ", ".join(sorted(entry.key for entry in matches)[:5])
        raise _Failure(f"key prefix {prefix!r} is ambiguous: it matches {len(matches)} entries ({shown}"
                       f"{', ...' if len(matches) > 5 else ''}); give more characters")
    return matches[0]


def _summary(entries: list[EntryInfo]) -> str:
    count = len(entries)
    return f"{count} {'entry' if count == 1 else 'entries'}, {format_size(sum(e.size for e in entries))}"


# ---------------------------------------------------------------------------------------------
# Commands.


def _list(cache: CompileCache, args: argparse.Namespace) -> int:
    entries = cache.entries()
    if args.json:
        rows = [{**dataclasses.asdict(entry), "path": str(entry.path)} for entry in entries]
        print(json.dumps(rows, indent=2, sort_keys=True))
        return 0
    if not entries:
        print(f"no entries in {cache.location}")
        return 0
    width = _KEY_COLUMN
    while len({entry.key[:width] for entry in entries}) < len(entries):
        width += 1
    width = min(width, max(len(entry.key) for entry in entries))
    print(f"{'KEY':<{width}}  {'SIZE':>10}  {'CREATED':<19}  {'LAST USED':<19}  DESCRIPTION")
    for entry in entries:
        print(f"{entry.key[:width]:<{width}}  {format_size(entry.size):>10}  {_when(entry.created):<19}  "
              f"{_when(entry.last_used):<19}  {_description(entry)}")
    print(f"{_summary(entries)} in {cache.location}")
    return 0


def _inspect(cache: CompileCache, args: argparse.Namespace) -> int:
    entry = _resolve(cache, args.key_prefix)
    try:
        problem = cache.verify(entry.key)
    except KeyError:
        raise _Failure(f"entry {entry.key} was removed while being inspected") from None
    payload = "-" if entry.payload_size is None else format_size(entry.payload_size)
    print(f"key:        {entry.key}")
    print(f"file:       {entry.path}")
    print(f"size:       {format_size(entry.size)} (payload {payload})")
    print(f"created:    {_when(entry.created)}")
    print(f"last used:  {_when(entry.last_used)}")
    print(f"checksum:   {'ok (sha256 verified)' if problem is None else 'CORRUPT: ' + problem}")
    print("metadata:")
    print(json.dumps(entry.metadata, indent=2, sort_keys=True))
    return 0 if problem is None else 1


def _prune(cache: CompileCache, args: argparse.Namespace) -> int:
    criteria = {"max_size_mb": args.max_size_mb, "max_entries": args.max_entries,
                "older_than_days": args.older_than_days}
    if all(value is None for value in criteria.values()) and cache.config.max_size_mb is None \
            and cache.config.max_entries is None:
        raise _Failure(f"nothing to prune by: give --max-size-mb, --max-entries or --older-than-days, or set "
                       f"{ENV_MAX_SIZE_MB} / {ENV_MAX_ENTRIES}", status=2)
    before = {entry.key: entry.size for entry in cache.entries()}
    removed = cache.prune(**criteria)
    freed = sum(before.get(key, 0) for key in removed)
    print(f"removed {len(removed)} {'entry' if len(removed) == 1 else 'entries'} ({format_size(freed)}); "
          f"{_summary(cache.entries())} remain in {cache.location}")
    return 0


def _clear(cache: CompileCache, args: argparse.Namespace) -> int:
    entries = cache.entries()
    if not entries:
        print(f"no entries in {cache.location}")
        return 0
    if not args.yes:
        if not sys.stdin.isatty():
            raise _Failure(f"refusing to remove {_summary(entries)} from {cache.location} without --yes", status=2)
        answer = input(f"Remove {_summary(entries)} from {cache.location}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing removed")
            return 0
    removed = cache.clear()
    print(f"removed {removed} {'entry' if removed == 1 else 'entries'} from {cache.location}")
    return 0


def _info(cache: CompileCache, configured: CacheConfig) -> int:
    entries = cache.entries()
    size_limit = "unlimited" if configured.max_size_mb is None else f"{configured.max_size_mb:g} MiB"
    entry_limit = "unlimited" if configured.max_entries is None else str(configured.max_entries)
    print(f"directory:       {cache.location}")
    print(f"compile cache:   {'disabled by ' + ENV_DISABLE_CACHE if configured.disabled else 'enabled'}")
    print(f"max size:        {size_limit} ({ENV_MAX_SIZE_MB})")
    print(f"max entries:     {entry_limit} ({ENV_MAX_ENTRIES})")
    print(f"entries:         {len(entries)}")
    print(f"total size:      {format_size(sum(entry.size for entry in entries))}")
    print(f"format version:  {FORMAT_VERSION}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Runs the command; returns its exit status."""
    args = _parser().parse_args(argv)
    try:
        cache, configured = _open_cache(getattr(args, "cache_dir", None))
        if args.command == "info":
            return _info(cache, configured)
        command = {"list": _list, "inspect": _inspect, "prune": _prune, "clear": _clear}[args.command]
        return command(cache, args)
    except _Failure as failure:
        print(f"{_PROG}: error: {failure}", file=sys.stderr)
        return failure.status
    except OSError as error:
        print(f"{_PROG}: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
