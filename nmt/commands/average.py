"""`nmt average`: the parameter average of several checkpoints of one run (`checkpoint.average_checkpoints`)."""

from __future__ import annotations

import sys

from nmt import textio
from nmt.model.checkpoint import average_checkpoints
from nmt.errors import UserError


def average_command(checkpoints: list[str], output: str, *, quiet: bool = False) -> int:
    """`nmt average`: write the parameter average of `checkpoints` to `output`. Returns 0."""
    if not checkpoints:
        raise UserError("average needs at least one checkpoint")
    textio.check_paths({f"checkpoint {i + 1}": p for i, p in enumerate(checkpoints)}, {"--output": output})
    average_checkpoints(list(checkpoints), output)
    if not quiet:
        print(f"averaged {len(checkpoints)} checkpoints into {output}", file=sys.stderr)
    return 0
