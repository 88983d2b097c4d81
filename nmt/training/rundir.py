"""The run directory of `nmt train`: exclusive use, start checks, checkpoint files.

    with RunLock(run_dir):           # one nmt train per run directory (flock; freed by the OS on a crash)
        check_start(run_dir, resume)  # stale temporaries removed; checkpoints present iff resuming
        ...
        save_checkpoints(run_dir, payload, step, ...)   # latest.pt, step_N.pt, best.pt

Files being written have a temporary name (nmt.model.checkpoint.TEMP_PREFIX) and never count; only
the lock's holder writes, so temporaries found at start are a killed run's and are deleted.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
from typing import Any

from nmt.model import checkpoint as ckpt
from nmt.errors import UserError

LOCK_FILE = ".lock"
STEP_FILE = re.compile(r"^step_(\d+)\.pt$")


def create(run_dir: str, *, resume: bool = False) -> str:
    """Make `run_dir` and its checkpoints/ directory; UserError when a path on the way is a file, or when resuming
    a run whose directory does not exist (a mistyped name leaves no directory behind)."""
    if resume and not os.path.isdir(run_dir):
        raise UserError(f"cannot resume: {run_dir} does not exist (check output_dir and name, or start without "
                        "--resume)")
    try:
        os.makedirs(os.path.join(run_dir, "checkpoints"), exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocker = run_dir  # (the nearest path on the way that exists and is not a directory)
        while not (os.path.lexists(blocker) and not os.path.isdir(blocker)) and os.path.dirname(blocker) != blocker:
            blocker = os.path.dirname(blocker)
        what = "a file" if os.path.isfile(blocker) else "not a directory"
        raise UserError(f"cannot create the run directory {run_dir}: {blocker} is {what} (check output_dir and "
                        "name)") from None
    except OSError as e:
        raise UserError(f"cannot create the run directory {run_dir}: {e.strerror} (check output_dir and "
                        "name)") from None
    return run_dir


class RunLock:
    """An exclusive lock on a run directory (flock on `run_dir/.lock`, which holds the holder's PID).

    A second `nmt train` on the same directory fails at once with a one-line UserError naming
    the holder's PID. The lock is released on exit, and by the OS if the process dies.
    """

    def __init__(self, run_dir: str):
        self.path = os.path.join(run_dir, LOCK_FILE)
        self.fd: int | None = None

    def __enter__(self) -> "RunLock":
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EACCES):
                raise UserError(f"{os.path.dirname(self.path)} is in use by another nmt train (PID {holder}); "
                                "wait for it to finish, or choose another name or output_dir") from None
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor releases the flock
            self.fd = None


def checkpoint_files(run_dir: str) -> list[str]:
    """Names of the checkpoints in run_dir/checkpoints (latest.pt, best.pt, step_N.pt)."""
    d = os.path.join(run_dir, "checkpoints")
    if not os.path.isdir(d):
        return []
    return sorted(f for f in os.listdir(d) if f in ("latest.pt", "best.pt") or STEP_FILE.match(f))


def check_start(run_dir: str, resume: bool) -> None:
    """Remove stale temporaries; resuming needs latest.pt, a fresh start needs no checkpoint."""
    d = os.path.join(run_dir, "checkpoints")
    ckpt.remove_temporaries(d)
    latest = os.path.join(d, "latest.pt")
    found = checkpoint_files(run_dir)
    if resume and not os.path.isfile(latest):
        extra = f" (it has {', '.join(found)}: copy one of them to latest.pt to resume from it)" if found else \
            " (start without --resume)"
        raise UserError(f"cannot resume: {latest} does not exist{extra}")
    if not resume and found:
        if "latest.pt" in found:
            raise UserError(f"{run_dir} already holds checkpoints: pass --resume to continue that run, "
                            f"or choose another name or output_dir")
        raise UserError(f"{run_dir} holds checkpoints ({', '.join(found)}) but no latest.pt: choose another "
                        f"name or output_dir (or copy one of them to latest.pt and pass --resume)")


def best_steps(history: list, k: int, higher_is_better: bool) -> set[int]:
    """The steps of the k best validations in history [[step, value], ...] (earlier first on ties)."""
    if k <= 0:
        return set()
    ranked = sorted(history, key=lambda sv: (-sv[1] if higher_is_better else sv[1], sv[0]))
    return {int(step) for step, _ in ranked[:k]}


def save_checkpoints(run_dir: str, payload: ckpt.ModelRecord, step: int, *, improved: bool, keep_last: int,
                     with_step: bool, keep_steps: set[int] = frozenset()) -> None:
    """latest.pt always (the record `payload`); step_N.pt and best.pt as hard links of it. Step files are kept for the
    last `keep_last` steps and for `keep_steps` (the best validations, train.keep_best)."""
    d = os.path.join(run_dir, "checkpoints")
    latest = os.path.join(d, "latest.pt")
    ckpt.save_checkpoint(payload, latest)
    if with_step and (keep_last > 0 or step in keep_steps):
        ckpt.link_checkpoint(latest, os.path.join(d, f"step_{step}.pt"))
        steps = sorted(int(m.group(1)) for f in os.listdir(d) if (m := STEP_FILE.match(f)))
        last = set(steps[-keep_last:]) if keep_last > 0 else set()
        for n in steps:
            if n not in last and n not in keep_steps:
                os.unlink(os.path.join(d, f"step_{n}.pt"))
    if improved:
        ckpt.link_checkpoint(latest, os.path.join(d, "best.pt"))
