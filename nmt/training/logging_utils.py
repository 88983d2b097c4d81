"""Run logging: train.log lines, the console, TensorBoard, and a tqdm progress bar.

One `RunLogger` per run, passed to whoever logs (no global logger). Every
message goes to `run_dir/train.log` (appended, timestamped) and to stderr;
scalars and sample translations go to TensorBoard (`run_dir/tensorboard`).
With `enabled=False` (DDP ranks other than 0) everything is a no-op.
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Any

from tqdm import tqdm


class RunLogger:
    """train.log + stderr + TensorBoard + progress bar for one run directory."""

    def __init__(self, run_dir: str, *, quiet: bool = False, enabled: bool = True):
        self.enabled, self.quiet = enabled, quiet
        self.bar: tqdm | None = None
        self._file = self._writer = None
        self._console = True  # messages also go to stderr (until it is closed)
        if not enabled:
            return
        os.makedirs(run_dir, exist_ok=True)
        self._file = open(os.path.join(run_dir, "train.log"), "a", encoding="utf-8", buffering=1)
        from torch.utils.tensorboard import SummaryWriter  # imports tensorboard: slow, so only here

        self._writer = SummaryWriter(log_dir=os.path.join(run_dir, "tensorboard"))

    def info(self, msg: str) -> None:
        """A line in train.log and on stderr (above the progress bar when one is shown)."""
        if not self.enabled:
            return
        self._file.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {msg}\n")
        if not self._console:
            return
        try:
            if self.bar is not None:
                self.bar.write(msg, file=sys.stderr)
            else:
                print(msg, file=sys.stderr, flush=True)
        except (BrokenPipeError, ValueError):  # (`... 2>&1 | head`: the run goes on, logging to train.log only)
            self._console = False
            self._file.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} stderr closed: messages go to train.log only\n")

    __call__ = info  # a RunLogger is also a `log(msg)` callable

    def scalars(self, prefix: str, values: dict[str, float], step: int) -> None:
        """TensorBoard scalars `prefix/name` at `step` (non-finite and None values skipped)."""
        if self._writer is None:
            return
        for name, value in values.items():
            if value is not None and math.isfinite(value):
                self._writer.add_scalar(f"{prefix}/{name}", value, step)

    def text(self, tag: str, text: str, step: int) -> None:
        if self._writer is not None:
            self._writer.add_text(tag, text, step)

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def start_progress(self, total: int | None, initial: int) -> None:
        """A step progress bar on stderr, only when not quiet and stderr is a terminal."""
        if self.enabled and not self.quiet and sys.stderr.isatty():
            self.bar = tqdm(total=total or None, initial=initial, unit="step", file=sys.stderr,
                            dynamic_ncols=True, leave=False)

    def progress(self, steps: int, stats: dict[str, Any] | None = None) -> None:
        """Advance the bar by `steps`; `stats` (already Python numbers) become its postfix."""
        if self.bar is None:
            return
        self.bar.update(steps)
        if stats:
            self.bar.set_postfix(stats, refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._file is not None:
            self._file.close()
            self._file = None


def format_stats(values: dict[str, Any]) -> str:
    """`key value` pairs in a compact line: floats with 4 significant digits."""
    parts = []
    for k, v in values.items():
        if isinstance(v, float):
            v = f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"
        parts.append(f"{k} {v}")
    return " | ".join(parts)
