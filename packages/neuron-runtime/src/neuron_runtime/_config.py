"""The emulated instance, read once from the environment into one frozen object.

Vocabulary: a *chip* is one Trainium device; a *physical core* is a NeuronCore on it; a
*logical core* (what PyTorch calls a device, ``neuron:i``) is one physical core, or on trn2
with ``NEURON_LOGICAL_NC_CONFIG=2`` (the default) two physical cores fused into one. The
*visible* cores are the logical cores this process may use, selected with
``NEURON_RT_VISIBLE_CORES`` or ``NEURON_RT_NUM_CORES``.

Environment variables (the hardware runtime's own, plus emulator-only ``NEURON_EMU_*``):

==================================  ===========================================================
``NEURON_EMU_INSTANCE``             ``trn2`` (default) or ``trn1``: the instance profile.
``NEURON_EMU_CHIPS``                chips in the instance (default 1).
``NEURON_EMU_HBM_GIB``              override the HBM per logical core, in GiB (tests, small hosts).
``NEURON_EMU_FLOAT64``              ``warn`` (default), ``error`` or ``allow``: float64 policy.
``NEURON_LOGICAL_NC_CONFIG``        ``2`` (trn2 default) or ``1``; trn1 supports only ``1``.
``NEURON_RT_VISIBLE_CORES``         ``3``, ``0,1`` or ``0-3`` (and mixes like ``0-1,3``).
``NEURON_RT_NUM_CORES``             number of cores to use, counted from core 0.
``NEURON_LAUNCH_BLOCKING``          ``0``/``1``; the emulator always executes synchronously.
``NEURON_RT_STOCHASTIC_ROUNDING_EN`` ``0``/``1``; accepted, not emulated.
``TORCH_NEURONX_METRICS_ENABLED``   ``0``/``1``: count every op run on the device.
``TORCH_NEURONX_AUTOGRAD_DEVICE_THREADS`` ``1``: keep PyTorch's per-device autograd threads (by
                                    default the thread that initialises the device runs
                                    neuron backward work itself).
``LOCAL_RANK``                      under torchrun, the initial current device (a rank past
                                    several visible cores gets core 0, with a warning).
==================================  ===========================================================
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["InstanceProfile", "RuntimeConfig", "INSTANCE_PROFILES", "load_config"]

_GIB = 1 << 30


@dataclass(frozen=True)
class InstanceProfile:
    """Hardware facts of one Trainium chip generation (from AWS's public documentation)."""

    name: str
    core_name: str
    physical_cores_per_chip: int
    hbm_bytes_per_chip: int
    default_lnc: int
    supported_lnc: tuple[int, ...]
    capability: tuple[int, int]


INSTANCE_PROFILES: dict[str, InstanceProfile] = {
    "trn1": InstanceProfile("trn1", "NeuronCore-v2", 2, 32 * _GIB, 1, (1,), (2, 0)),
    "trn2": InstanceProfile("trn2", "NeuronCore-v3", 8, 96 * _GIB, 2, (1, 2), (3, 0)),
}

_FLOAT64_POLICIES = {"allow": 0, "warn": 1, "error": 2}


@dataclass(frozen=True)
class RuntimeConfig:
    """What the emulated runtime exposes to this process."""

    profile: InstanceProfile
    chips: int
    lnc: int
    visible_cores: tuple[int, ...]  # logical core ids, in device-index order
    capacity_bytes: int  # HBM per logical core
    initial_device: int
    float64_policy: str
    metrics_enabled: bool
    autograd_device_threads: bool = False  # backward of neuron tensors on the engine's device threads
    error: str = ""  # non-empty: the environment is invalid and the device is unusable
    warning: str = ""  # non-empty: the device works, but not as it would on the hardware

    @property
    def device_count(self) -> int:
        return 0 if self.error else len(self.visible_cores)


class _ConfigError(ValueError):
    pass


def _flag(env: Mapping[str, str], name: str, default: bool = False) -> bool:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    if raw.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if raw.strip().lower() in ("0", "false", "no", "off"):
        return False
    raise _ConfigError(f"{name}={raw!r} is not valid: use 0 or 1.")


def _int(env: Mapping[str, str], name: str, default: int, minimum: int = 0) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise _ConfigError(f"{name}={raw!r} is not valid: expected an integer.") from None
    if value < minimum:
        raise _ConfigError(f"{name}={raw!r} is not valid: expected an integer >= {minimum}.")
    return value


def _parse_core_list(raw: str, total: int) -> tuple[int, ...]:
    """Parses NEURON_RT_VISIBLE_CORES: '3', '0,1', '0-3', '0-1,3'."""
    cores: list[int] = []
    usage = (
        f"NEURON_RT_VISIBLE_CORES={raw!r} is not valid: expected a core index ('3'), a list "
        f"('0,1') or a range ('0-3'), with indices below {total} (the logical cores of this instance)."
    )
    for part in raw.split(","):
        part = part.strip()
        if not part:
            raise _ConfigError(usage)
        try:
            if "-" in part:
                first, last = (int(x) for x in part.split("-", 1))
                if last < first:
                    raise _ConfigError(usage)
                cores.extend(range(first, last + 1))
            else:
                cores.append(int(part))
        except ValueError:
            raise _ConfigError(usage) from None
    if any(c < 0 or c >= total for c in cores) or len(set(cores)) != len(cores):
        raise _ConfigError(usage)
    return tuple(cores)


def _parse(env: Mapping[str, str]) -> RuntimeConfig:
    instance = env.get("NEURON_EMU_INSTANCE", "trn2").strip().lower() or "trn2"
    if instance not in INSTANCE_PROFILES:
        raise _ConfigError(
            f"NEURON_EMU_INSTANCE={instance!r} is not valid: choose one of {sorted(INSTANCE_PROFILES)}."
        )
    profile = INSTANCE_PROFILES[instance]
    chips = _int(env, "NEURON_EMU_CHIPS", 1, minimum=1)
    lnc = _int(env, "NEURON_LOGICAL_NC_CONFIG", profile.default_lnc, minimum=1)
    if lnc not in profile.supported_lnc:
        raise _ConfigError(
            f"NEURON_LOGICAL_NC_CONFIG={lnc} is not valid on {instance}: supported values are "
            f"{', '.join(map(str, profile.supported_lnc))}."
        )
    logical = chips * profile.physical_cores_per_chip // lnc
    capacity = profile.hbm_bytes_per_chip * lnc // profile.physical_cores_per_chip
    hbm_override = env.get("NEURON_EMU_HBM_GIB", "").strip()
    if hbm_override:
        try:
            capacity = int(float(hbm_override) * _GIB)
        except ValueError:
            raise _ConfigError(f"NEURON_EMU_HBM_GIB={hbm_override!r} is not valid: expected GiB as a number.") from None
        if capacity <= 0:
            raise _ConfigError(f"NEURON_EMU_HBM_GIB={hbm_override!r} is not valid: it must be positive.")

    visible_raw = env.get("NEURON_RT_VISIBLE_CORES", "").strip()
    num_raw = env.get("NEURON_RT_NUM_CORES", "").strip()
    if visible_raw and num_raw:
        raise _ConfigError(
            "NEURON_RT_VISIBLE_CORES and NEURON_RT_NUM_CORES are both set: set only one of them."
        )
    if visible_raw:
        visible = _parse_core_list(visible_raw, logical)
    elif num_raw:
        count = _int(env, "NEURON_RT_NUM_CORES", logical, minimum=1)
        if count > logical:
            raise _ConfigError(
                f"NEURON_RT_NUM_CORES={count} is not valid: this emulated {instance} instance "
                f"({chips} chip(s), LNC={lnc}) has {logical} logical cores."
            )
        visible = tuple(range(count))
    else:
        visible = tuple(range(logical))

    policy = env.get("NEURON_EMU_FLOAT64", "warn").strip().lower() or "warn"
    if policy not in _FLOAT64_POLICIES:
        raise _ConfigError(f"NEURON_EMU_FLOAT64={policy!r} is not valid: use warn, error or allow.")
    _flag(env, "NEURON_LAUNCH_BLOCKING")
    _flag(env, "NEURON_RT_STOCHASTIC_ROUNDING_EN")
    metrics = _flag(env, "TORCH_NEURONX_METRICS_ENABLED")
    device_threads = _flag(env, "TORCH_NEURONX_AUTOGRAD_DEVICE_THREADS")
    local_rank = _int(env, "LOCAL_RANK", 0)
    initial = local_rank if local_rank < len(visible) else 0
    return RuntimeConfig(profile, chips, lnc, visible, capacity, initial, policy, metrics, device_threads,
                         warning=_local_rank_warning(local_rank, len(visible), instance))


def _local_rank_warning(local_rank: int, visible: int, instance: str) -> str:
    # A process that sees one core (NEURON_RT_VISIBLE_CORES per rank) uses it whatever its rank;
    # a rank past several visible cores has no core of its own, and would get none on Trainium.
    if local_rank < visible or visible <= 1:
        return ""
    return (
        f"LOCAL_RANK={local_rank} is past the {visible} NeuronCores this process sees (emulated "
        f"{instance}), so its current core is neuron:0, which local rank 0 also uses. On Trainium "
        f"each process needs a core of its own: start at most {visible} processes per node "
        f"(torchrun --nproc-per-node {visible}), or emulate more cores (NEURON_EMU_CHIPS, "
        f"NEURON_LOGICAL_NC_CONFIG=1)."
    )


def load_config(env: Mapping[str, str] | None = None) -> RuntimeConfig:
    """Reads the configuration; an invalid environment yields a config carrying the error."""
    env = os.environ if env is None else env
    try:
        return _parse(env)
    except _ConfigError as error:
        profile = INSTANCE_PROFILES["trn2"]
        return RuntimeConfig(profile, 1, 2, (), 0, 0, "warn", False, error=str(error))
