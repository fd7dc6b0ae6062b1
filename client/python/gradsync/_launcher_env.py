"""The variables torchrun (and ``gradsync.run``) give each trainer: LOCAL_RANK,
RANK, WORLD_SIZE, LOCAL_WORLD_SIZE.

gradsync takes the trainer's local rank from LOCAL_RANK (the C client reads
it) and forms its own world from the daemons' --local-size/--num-nodes. The
two worlds must agree: if the launcher started more trainers than gradsync
averages over (say ``torchrun --nnodes 2`` against daemons that were not
joined into one job), every step would silently average over a part of the
job. Ranks may legitimately differ (torchrun may renumber nodes), sizes not.
"""
from __future__ import annotations

import os

from .errors import InvalidArgumentError


def check_world_size(world_size: int) -> None:
    """Raises InvalidArgumentError when $WORLD_SIZE disagrees with gradsync's."""
    value = os.environ.get("WORLD_SIZE")
    if value is None or value.strip() == "":
        return
    try:
        launcher_world = int(value)
    except ValueError:
        raise InvalidArgumentError(f"$WORLD_SIZE is {value!r}, not an integer",
                                   operation="gs_register") from None
    if launcher_world != world_size:
        raise InvalidArgumentError(
            f"$WORLD_SIZE is {launcher_world} (set by the launcher, e.g. torchrun) but the "
            f"gradsync job has {world_size} trainers: start the gradsyncd of every node with "
            "--local-size = trainers per node and --num-nodes = nodes, joined into one job",
            operation="gs_register")
