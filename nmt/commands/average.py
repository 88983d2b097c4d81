"""`nmt average`: the parameter average of several checkpoints of one run (`checkpoint.average_checkpoints`)."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from nmt import textio
from nmt.model.checkpoint import average_checkpoints
from nmt.errors import UserError


@dataclass(frozen=True)
class AverageOptions:
    """`nmt average`'s arguments."""

    checkpoints: tuple[str, ...]
    output: str
    quiet: bool = False


def average_command(opts: AverageOptions) -> int:
    """`nmt average`: write the parameter average of the checkpoints to `output`. Returns 0."""
    checkpoints, output = opts.checkpoints, opts.output
    if not checkpoints:
        raise UserError("average needs at least one checkpoint")
    textio.check_paths({f"checkpoint {i + 1}": p for i, p in enumerate(checkpoints)}, {"--output": output})
    average_checkpoints(list(checkpoints), output)
    if not opts.quiet:
        print(f"averaged {len(checkpoints)} checkpoint{'s' if len(checkpoints) > 1 else ''} into {output}", file=sys.stderr)
    return 0
