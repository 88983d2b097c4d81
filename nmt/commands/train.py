"""`nmt train`: load and check the config, then train (`nmt.train.train`), or with --check print it resolved."""

from __future__ import annotations

import sys

from nmt.config import dump_config, load_config


def train_command(config: str, overrides: list[str] | None = None, *, resume: bool = False, device: str | None = None,
                  quiet: bool = False, check: bool = False) -> int:
    """`nmt train --config YAML [--set KEY=VALUE ...]`. Returns 0, or 128 + the signal that stopped the run
    (SIGINT / SIGTERM, after latest.pt was saved: the shell's convention)."""
    cfg = load_config(config, overrides, resume=resume)  # --resume ignores train.init_from
    if check:
        sys.stdout.write(dump_config(cfg))
        return 0
    from nmt.train import train  # torch loads here, not for --check

    result = train(cfg, resume=resume, device=device, quiet=quiet)
    return 128 + result["signal"] if result.get("signal") else 0
