"""Shape buckets: which padded sequence lengths a compiled model is allowed to see.

The Trainium compiler (and our emulation of it) compiles one graph per input shape. A model fed
sequences of every length from 1 to 2048 would compile up to 2048 graphs; padding each batch up to
a *bucket*, the smallest allowed length that fits it, bounds that number by the number of buckets.

Vocabulary used throughout neuron-compile:

- *length*: the real sequence length of a batch (its size along the sequence dimension).
- *bucket*: an allowed padded length; ``policy.bucket_for(length)`` is the smallest bucket
  ``>= length``.
- *policy*: the set of buckets, ``policy.buckets()``, ending at ``policy.max_length``.
  ``len(policy.buckets())`` is the most graphs one input signature family can compile.

Three policies, each a frozen dataclass:

====================================  ==============================  ==============================
policy                                buckets                         spec string
====================================  ==============================  ==============================
``MultipleOfBuckets(128, 2048)``      128, 256, ..., 2048 (16)        ``"multiple:128:2048"``
``PowerOfTwoBuckets(128, 2048)``      128, 256, 512, 1024, 2048 (5)   ``"pow2:128:2048"``
``ExplicitBuckets((128, 512, 2048))`` 128, 512, 2048 (3)              ``"list:128,512,2048"``
====================================  ==============================  ==============================

Spec strings (for an environment variable or a command-line flag) are parsed by
``BucketPolicy.parse`` and produced by ``str(policy)``, so ``BucketPolicy.parse(str(p)) == p``:

- ``multiple[:N[:MAX]]``: multiples of ``N`` (default 128) up to ``MAX`` (default 2048). ``MAX``
  must be a multiple of ``N`` so that the maximum itself is a bucket.
- ``pow2[:MIN[:MAX]]``: powers of two from ``MIN`` (default 128) to ``MAX`` (default 2048), both
  powers of two.
- ``list:L1,L2,...``: exactly these lengths, strictly increasing and positive; the last is the
  maximum.

Whitespace around fields is ignored; the kind is case-insensitive.
"""

from __future__ import annotations

import abc
import bisect
import operator
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

__all__ = [
    "BucketPolicy",
    "ExplicitBuckets",
    "MultipleOfBuckets",
    "PowerOfTwoBuckets",
]

_DEFAULT_MULTIPLE = 128
_DEFAULT_MAX_LENGTH = 2048
_DEFAULT_POW2_MIN = 128


def _positive_int(value: object, what: str) -> int:
    """``value`` as an int, or a ValueError/TypeError naming ``what``."""
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an integer, got {value!r}")
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{what} must be an integer, got {value!r}") from None
    if number <= 0:
        raise ValueError(f"{what} must be a positive integer, got {number}")
    return number


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


class BucketPolicy(abc.ABC):
    """The allowed padded sequence lengths; see the module docstring for the vocabulary."""

    kind: ClassVar[str]

    @property
    @abc.abstractmethod
    def max_length(self) -> int:
        """The largest bucket: lengths above it cannot be padded to any bucket."""

    @abc.abstractmethod
    def buckets(self) -> list[int]:
        """Every bucket, increasing, ending at ``max_length``."""

    @abc.abstractmethod
    def _smallest_fitting(self, length: int) -> int:
        """The smallest bucket ``>= length``, for ``1 <= length <= max_length``."""

    def bucket_for(self, length: int) -> int:
        """The smallest bucket ``>= length``.

        Raises ValueError if ``length`` is not positive or exceeds ``max_length``.
        """
        length = _positive_int(length, "sequence length")
        if length > self.max_length:
            raise ValueError(
                f"sequence length {length} exceeds the maximum length {self.max_length} of "
                f"bucket policy {str(self)!r}: raise the policy's maximum length (for example "
                f"{self._suggest_max(length)!r}) or truncate inputs to {self.max_length} tokens"
            )
        return self._smallest_fitting(length)

    @abc.abstractmethod
    def _suggest_max(self, length: int) -> str:
        """A spec string for a policy of the same kind whose maximum fits ``length``."""

    @staticmethod
    def parse(spec: str) -> BucketPolicy:
        """Build a policy from a spec string such as ``"multiple:128:2048"``, ``"pow2:16:2048"``
        or ``"list:128,256,512"`` (grammar in the module docstring)."""
        if not isinstance(spec, str):
            raise TypeError(f"a bucket policy spec must be a string, got {type(spec).__name__}")
        kind, _, rest = spec.strip().partition(":")
        kind = kind.strip().lower()
        fields = [f.strip() for f in rest.split(":")] if rest.strip() else []
        try:
            if kind == MultipleOfBuckets.kind:
                return MultipleOfBuckets(*_int_fields(fields, 2))
            if kind == PowerOfTwoBuckets.kind:
                return PowerOfTwoBuckets(*_int_fields(fields, 2))
            if kind == ExplicitBuckets.kind:
                if len(fields) != 1 or not fields[0]:
                    raise ValueError("expected 'list:L1,L2,...'")
                return ExplicitBuckets(_int_fields(fields[0].split(","), None))
        except (TypeError, ValueError) as e:
            raise ValueError(f"invalid bucket policy spec {spec!r}: {e}") from None
        raise ValueError(
            f"invalid bucket policy spec {spec!r}: unknown kind {kind!r}; expected one of "
            "'multiple[:N[:MAX]]', 'pow2[:MIN[:MAX]]' or 'list:L1,L2,...'"
        )


def _int_fields(fields: list[str], at_most: int | None) -> list[int]:
    """The integers in ``fields``, at most ``at_most`` of them."""
    if at_most is not None and len(fields) > at_most:
        raise ValueError(f"expected at most {at_most} ':'-separated numbers after the kind")
    values = []
    for field in fields:
        try:
            values.append(int(field))
        except ValueError:
            raise ValueError(f"{field!r} is not an integer") from None
    return values


@dataclass(frozen=True)
class MultipleOfBuckets(BucketPolicy):
    """Buckets at every multiple of ``multiple`` up to ``max_length`` (itself a multiple)."""

    multiple: int = _DEFAULT_MULTIPLE
    max_length: int = _DEFAULT_MAX_LENGTH  # type: ignore[assignment]

    kind: ClassVar[str] = "multiple"

    def __post_init__(self) -> None:
        multiple = _positive_int(self.multiple, "bucket multiple N")
        max_length = _positive_int(self.max_length, "bucket max_length")
        if max_length % multiple:
            lower = max(multiple, max_length // multiple * multiple)
            raise ValueError(
                f"bucket max_length {max_length} is not a multiple of {multiple}, so it would "
                f"not be a bucket itself; use {lower} or {lower + multiple}"
            )
        object.__setattr__(self, "multiple", multiple)
        object.__setattr__(self, "max_length", max_length)

    def buckets(self) -> list[int]:
        return list(range(self.multiple, self.max_length + 1, self.multiple))

    def _smallest_fitting(self, length: int) -> int:
        return -(-length // self.multiple) * self.multiple

    def _suggest_max(self, length: int) -> str:
        return f"{self.kind}:{self.multiple}:{self._smallest_fitting(length)}"

    def __str__(self) -> str:
        return f"{self.kind}:{self.multiple}:{self.max_length}"


@dataclass(frozen=True)
class PowerOfTwoBuckets(BucketPolicy):
    """Buckets at every power of two from ``min_length`` to ``max_length`` (both powers of two)."""

    min_length: int = _DEFAULT_POW2_MIN
    max_length: int = _DEFAULT_MAX_LENGTH  # type: ignore[assignment]

    kind: ClassVar[str] = "pow2"

    def __post_init__(self) -> None:
        min_length = _positive_int(self.min_length, "bucket min_length")
        max_length = _positive_int(self.max_length, "bucket max_length")
        for name, value in (("min_length", min_length), ("max_length", max_length)):
            if not _is_power_of_two(value):
                raise ValueError(
                    f"power-of-two bucket {name} must be a power of two, got {value}; use "
                    f"{1 << (value.bit_length() - 1)} or {1 << value.bit_length()}"
                )
        if min_length > max_length:
            raise ValueError(
                f"bucket min_length {min_length} is greater than max_length {max_length}"
            )
        object.__setattr__(self, "min_length", min_length)
        object.__setattr__(self, "max_length", max_length)

    def buckets(self) -> list[int]:
        out, b = [], self.min_length
        while b <= self.max_length:
            out.append(b)
            b *= 2
        return out

    def _smallest_fitting(self, length: int) -> int:
        return max(self.min_length, 1 << (length - 1).bit_length())

    def _suggest_max(self, length: int) -> str:
        return f"{self.kind}:{self.min_length}:{1 << (length - 1).bit_length()}"

    def __str__(self) -> str:
        return f"{self.kind}:{self.min_length}:{self.max_length}"


@dataclass(frozen=True)
class ExplicitBuckets(BucketPolicy):
    """Exactly the given lengths, strictly increasing; the last one is the maximum."""

    lengths: tuple[int, ...]

    kind: ClassVar[str] = "list"

    def __init__(self, lengths: Iterable[int]) -> None:
        if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Iterable):
            raise TypeError(f"bucket lengths must be a sequence of integers, got {lengths!r}")
        values = tuple(_positive_int(v, "bucket length") for v in lengths)
        if not values:
            raise ValueError("an explicit bucket policy needs at least one length")
        for a, b in zip(values, values[1:]):
            if b <= a:
                raise ValueError(
                    f"bucket lengths must be strictly increasing, got {b} after {a} in "
                    f"{list(values)}"
                )
        object.__setattr__(self, "lengths", values)

    @property
    def max_length(self) -> int:
        return self.lengths[-1]

    def buckets(self) -> list[int]:
        return list(self.lengths)

    def _smallest_fitting(self, length: int) -> int:
        return self.lengths[bisect.bisect_left(self.lengths, length)]

    def _suggest_max(self, length: int) -> str:
        return f"{self.kind}:{','.join(map(str, (*self.lengths, length)))}"

    def __str__(self) -> str:
        return f"{self.kind}:{','.join(map(str, self.lengths))}"
