"""Bucket policies: buckets, bucket_for, spec strings, and the errors for bad policies and lengths."""

from __future__ import annotations

import pytest

from neuron_compile.buckets import (
    BucketPolicy,
    ExplicitBuckets,
    MultipleOfBuckets,
    PowerOfTwoBuckets,
)


def test_multiple_of_defaults_are_128_up_to_2048():
    policy = MultipleOfBuckets()
    assert policy.buckets() == list(range(128, 2049, 128))
    assert len(policy.buckets()) == 16
    assert policy.max_length == 2048


@pytest.mark.parametrize(
    ("length", "bucket"), [(1, 128), (127, 128), (128, 128), (129, 256), (2047, 2048), (2048, 2048)]
)
def test_multiple_of_bucket_for(length, bucket):
    assert MultipleOfBuckets().bucket_for(length) == bucket


def test_power_of_two():
    policy = PowerOfTwoBuckets(16, 256)
    assert policy.buckets() == [16, 32, 64, 128, 256]
    assert [policy.bucket_for(n) for n in (1, 16, 17, 33, 64, 65, 256)] == [16, 16, 32, 64, 64, 128, 256]
    assert PowerOfTwoBuckets().buckets() == [128, 256, 512, 1024, 2048]


def test_explicit_list():
    policy = ExplicitBuckets([100, 300, 1000])
    assert policy.buckets() == [100, 300, 1000]
    assert policy.max_length == 1000
    assert [policy.bucket_for(n) for n in (1, 100, 101, 300, 301, 1000)] == [100, 100, 300, 300, 1000, 1000]


@pytest.mark.parametrize(
    "policy", [MultipleOfBuckets(16, 64), PowerOfTwoBuckets(4, 64), ExplicitBuckets((3, 10, 64))]
)
def test_bucket_for_is_the_smallest_bucket_that_fits(policy):
    buckets = policy.buckets()
    assert buckets == sorted(set(buckets)) and buckets[-1] == policy.max_length
    for length in range(1, policy.max_length + 1):
        assert policy.bucket_for(length) == min(b for b in buckets if b >= length)


@pytest.mark.parametrize(
    ("policy", "suggestion"),
    [
        (MultipleOfBuckets(), "multiple:128:3072"),
        (PowerOfTwoBuckets(), "pow2:128:4096"),
        (ExplicitBuckets([128, 512]), "list:128,512,3000"),
    ],
)
def test_length_above_maximum_names_length_maximum_and_remedy(policy, suggestion):
    with pytest.raises(ValueError) as info:
        policy.bucket_for(3000)
    message = str(info.value)
    assert "3000" in message and str(policy.max_length) in message
    assert suggestion in message and "truncate" in message


@pytest.mark.parametrize("length", [0, -5])
def test_non_positive_length_is_refused(length):
    with pytest.raises(ValueError, match="positive"):
        MultipleOfBuckets().bucket_for(length)


@pytest.mark.parametrize("length", [1.5, "12", True])
def test_non_integer_length_is_refused(length):
    with pytest.raises(TypeError, match="integer"):
        MultipleOfBuckets().bucket_for(length)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: MultipleOfBuckets(0), "positive"),
        (lambda: MultipleOfBuckets(-128), "positive"),
        (lambda: MultipleOfBuckets(128, 0), "positive"),
        (lambda: MultipleOfBuckets(128, 2000), "not a multiple of 128.*1920 or 2048"),
        (lambda: MultipleOfBuckets(128, 64), "not a multiple"),
        (lambda: PowerOfTwoBuckets(100, 2048), "power of two.*64 or 128"),
        (lambda: PowerOfTwoBuckets(128, 3000), "power of two"),
        (lambda: PowerOfTwoBuckets(256, 128), "greater than"),
        (lambda: ExplicitBuckets([]), "at least one"),
        (lambda: ExplicitBuckets([128, 128]), "strictly increasing"),
        (lambda: ExplicitBuckets([512, 128]), "strictly increasing"),
        (lambda: ExplicitBuckets([0, 128]), "positive"),
    ],
)
def test_invalid_policies_raise_value_error(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize(
    "make", [lambda: MultipleOfBuckets(12.5), lambda: ExplicitBuckets("128"), lambda: ExplicitBuckets(128)]
)
def test_non_integer_policies_raise_type_error(make):
    with pytest.raises(TypeError):
        make()


def test_policies_are_frozen_and_hashable():
    policy = MultipleOfBuckets(64, 512)
    with pytest.raises(AttributeError):
        policy.multiple = 32
    assert hash(policy) == hash(MultipleOfBuckets(64, 512))
    assert ExplicitBuckets([1, 2]) == ExplicitBuckets((1, 2))


@pytest.mark.parametrize(
    ("spec", "policy"),
    [
        ("multiple", MultipleOfBuckets(128, 2048)),
        ("multiple:64", MultipleOfBuckets(64, 2048)),
        ("multiple:128:2048", MultipleOfBuckets(128, 2048)),
        (" Multiple : 16 : 64 ", MultipleOfBuckets(16, 64)),
        ("pow2", PowerOfTwoBuckets(128, 2048)),
        ("pow2:16:2048", PowerOfTwoBuckets(16, 2048)),
        ("list:128,256,512", ExplicitBuckets([128, 256, 512])),
        ("list: 128, 512 ", ExplicitBuckets([128, 512])),
    ],
)
def test_parse(spec, policy):
    assert BucketPolicy.parse(spec) == policy
    assert BucketPolicy.parse(str(policy)) == policy


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("", "unknown kind"),
        ("buckets:128", "unknown kind"),
        ("multiple:abc", "'abc' is not an integer"),
        ("multiple:128:2048:4096", "at most 2"),
        ("multiple:128:2000", "not a multiple"),
        ("pow2:100:2048", "power of two"),
        ("list", "list:L1,L2"),
        ("list:", "list:L1,L2"),
        ("list:512,128", "strictly increasing"),
        ("list:128,,512", "'' is not an integer"),
    ],
)
def test_parse_errors_name_the_spec(spec, match):
    with pytest.raises(ValueError, match=match) as info:
        BucketPolicy.parse(spec)
    assert repr(spec) in str(info.value)


def test_parse_refuses_non_strings():
    with pytest.raises(TypeError):
        BucketPolicy.parse(128)
