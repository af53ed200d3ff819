"""Ranks started with different neuron-dist settings: creating the group raises on every rank.

argv[2] names the variable to set differently on the last rank; it is set before torch (which
loads neuron_dist, whose settings are read once at import) is imported.
"""

from __future__ import annotations

import os
import sys

VARIABLE = sys.argv[2]
if os.environ["LOCAL_RANK"] == str(int(os.environ["LOCAL_WORLD_SIZE"]) - 1):
    os.environ[VARIABLE] = {"NEURON_DIST_SPECULATE": "0", "NEURON_DIST_INLINE_BYTES": "4096",
                            "NEURON_DIST_CHECK_SIGNATURES": "0"}[VARIABLE]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from _cases import Cases  # noqa: E402

cases = Cases()


@cases.case
def different_settings_raise_when_the_group_is_created() -> str:
    try:
        dist.init_process_group("neuron")
        tensor = torch.ones(1 << 20, device=torch.device("neuron", torch.neuron.current_device()))
        dist.all_reduce(tensor)
    except ValueError as error:
        return str(error)
    raise AssertionError("ranks with different settings created a group and ran a collective")


if __name__ == "__main__":
    cases.run()
