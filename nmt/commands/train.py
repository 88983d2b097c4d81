"""`nmt train`: load and check the config, then train (`nmt.train.train`), or with --check print it resolved."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from nmt.config import dump_config, load_config


@dataclass(frozen=True)
class TrainOptions:
    """`nmt train`'s flags."""

    config: str  # the YAML file
    overrides: tuple[str, ...] = ()  # --set KEY=VALUE, in order
    resume: bool = False
    device: str | None = None  # over train.device
    quiet: bool = False
    check: bool = False  # print the resolved config and exit


def train_command(opts: TrainOptions) -> int:
    """`nmt train --config YAML [--set KEY=VALUE ...]`. Returns 0, or 128 + the signal that stopped the run
    (SIGINT / SIGTERM, after latest.pt was saved: the shell's convention)."""
    cfg = load_config(opts.config, list(opts.overrides), resume=opts.resume)  # --resume ignores train.init_from
    if opts.check:
        sys.stdout.write(dump_config(cfg))
        return 0
    from nmt.train import train  # torch loads here, not for --check

    result = train(cfg, resume=opts.resume, device=opts.device, quiet=opts.quiet)
    return 128 + result["signal"] if result.get("signal") else 0
