"""`nmt train`: load and check the config, then train (`nmt.train.train`), or with --check print it resolved."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from nmt.config import dump_config, load_config, same_settings
from nmt.errors import UserError


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
    own = os.path.join(cfg.run_dir, "config.yaml")  # (the run writes its settings there: nmt/train.py)
    if os.path.isfile(own) and os.path.samefile(opts.config, own) and not same_settings(own, cfg):
        raise UserError(f"--config {opts.config} is the run's own config.yaml, which the run would rewrite with the "
                        "--set values: copy it out of the run directory and train from the copy")
    if opts.check:
        sys.stdout.write(dump_config(cfg))
        return 0
    from nmt.train import train  # torch loads here, not for --check

    result = train(cfg, resume=opts.resume, device=opts.device, quiet=opts.quiet)
    return 128 + result["signal"] if result.get("signal") else 0
