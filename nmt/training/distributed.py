"""Data-parallel training under torchrun: process group, DDP, rank-aware helpers.

`torchrun --nproc_per_node N -m nmt train --config X.yaml` starts N processes with
WORLD_SIZE/RANK/LOCAL_RANK in their environment; `DistEnv.from_env()` reads them. Without
WORLD_SIZE (or with 1) training is the plain single process and every helper is a no-op.

    env = DistEnv.from_env()
    with process_group(env, resolve_torch_device("auto")) as device:   # NCCL on cuda:LOCAL_RANK, else gloo
        ...  env.broadcast(obj), env.all_reduce_sum(tensor), env.gather(obj), main_first(env, fn)

Failures (docs/distributed.md): an error on one rank is reported by that rank (`rank_errors`) and
the process exits non-zero; torchrun stops the others. A rank blocked in a collective gets an error
after at most `NMT_DIST_TIMEOUT` seconds (default 1800). Errors every rank would hit (bad run
directory, data, NaN steps) are decided on rank 0 and printed once (`all_ranks_error`).

Test hook: `NMT_TEST_FAIL_RANK=r` (with `NMT_TEST_FAIL_STEP=k`) makes rank r raise before training
step k+1 (`simulate_failure`).
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import inspect
import os
import socket
import sys
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterator, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from nmt.errors import UserError

T = TypeVar("T")
DEFAULT_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class DistEnv:
    """This process's place in the job: global rank, rank on its node, number of processes."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @classmethod
    def from_env(cls, environ: dict | None = None) -> "DistEnv":
        """Read torchrun's WORLD_SIZE / RANK / LOCAL_RANK; absent = single process."""
        env = os.environ if environ is None else environ
        try:
            world = int(env.get("WORLD_SIZE", "1"))
            rank, local = int(env.get("RANK", "0")), int(env.get("LOCAL_RANK", "0"))
        except ValueError:
            raise UserError("WORLD_SIZE, RANK and LOCAL_RANK must be integers (they are set by torchrun)") from None
        if world <= 1:
            return cls()
        if not 0 <= rank < world:
            raise UserError(f"RANK={rank} is outside 0..WORLD_SIZE-1={world - 1}")
        return cls(rank, local, world)

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the only one that logs, writes TensorBoard events and checkpoints."""
        return self.rank == 0

    # ------------------------------------------------------------------ collectives (no-ops alone)

    def broadcast(self, obj: T) -> T:
        """Rank 0's `obj` on every rank (pickled; for small objects)."""
        if not self.distributed:
            return obj
        box = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj: Any) -> list:
        """Every rank's `obj`, in rank order, on every rank (pickled; for small objects)."""
        if not self.distributed:
            return [obj]
        out: list = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum `tensor` over ranks in place (on the process group's device) and return it."""
        if self.distributed:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def sum_values(self, values: list[int], device: torch.device) -> list[int]:
        """Element-wise sums of small integers over ranks (one collective)."""
        if not self.distributed:
            return list(values)
        return self.all_reduce_sum(torch.tensor(values, dtype=torch.int64, device=device)).tolist()


# --------------------------------------------------------------------------- process group

def timeout_seconds(environ: dict | None = None) -> float:
    """The process-group timeout: NMT_DIST_TIMEOUT seconds, default 1800 (30 minutes)."""
    raw = (os.environ if environ is None else environ).get("NMT_DIST_TIMEOUT", "")
    try:
        value = float(raw) if raw.strip() else DEFAULT_TIMEOUT_S
    except ValueError:
        raise UserError(f"NMT_DIST_TIMEOUT must be a number of seconds, got {raw!r}") from None
    if value <= 0:
        raise UserError(f"NMT_DIST_TIMEOUT must be positive, got {raw!r}")
    return value


def rank_device(env: DistEnv, device: torch.device) -> torch.device:
    """Under torchrun each rank uses cuda:LOCAL_RANK (any index asked for is replaced); CPU stays CPU."""
    if not env.distributed or device.type != "cuda":
        return device
    if env.local_rank >= torch.cuda.device_count():
        raise UserError(f"LOCAL_RANK {env.local_rank} needs GPU {env.local_rank}, but this node has "
                        f"{torch.cuda.device_count()}: lower --nproc_per_node")
    return torch.device("cuda", env.local_rank)


@contextlib.contextmanager
def process_group(env: DistEnv, device: torch.device) -> Iterator[torch.device]:
    """Join the job's process group (NCCL for CUDA, gloo for CPU); yield this rank's device. The group is
    destroyed on the way out, also on errors, and after a barrier on a normal end (so that no rank tears
    down its connections while a peer still works); the run's garbage is collected first: DDP's objects
    left to the interpreter's exit could abort a rank ("terminate called without an active exception"). A group already initialised is used and left alone."""
    device = rank_device(env, device)
    if not env.distributed:
        yield device
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if dist.is_initialized():
        yield device
        return
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            timeout=datetime.timedelta(seconds=timeout_seconds()),
                            device_id=device if device.type == "cuda" else None)
    try:
        yield device
        gc.collect()  # the run's DDP objects (in reference cycles) go while the group is whole, not at exit
        with contextlib.suppress(Exception):  # a normal end: every rank done before any tears its group down
            dist.barrier()
    finally:
        with contextlib.suppress(Exception):  # peers may be gone already
            dist.destroy_process_group()


def wrap_model(env: DistEnv, model: nn.Module, device: torch.device) -> nn.Module:
    """DistributedDataParallel around `model` when distributed, else `model` itself. DDP broadcasts rank 0's
    parameters at construction and averages gradients in the backward of a step's last micro-batch; the
    buffers (constants such as sinusoidal positions) are not re-broadcast."""
    if not env.distributed:
        return model
    ddp = nn.parallel.DistributedDataParallel
    ids = [device.index] if device.type == "cuda" else None
    # constant buffers need no sync at every forward (the keyword was renamed in newer torch)
    quiet = "forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(ddp).parameters else "broadcast_buffers"
    return ddp(model, device_ids=ids, **{quiet: False})


# --------------------------------------------------------------------------- errors

def all_ranks_error(env: DistEnv, error: UserError) -> BaseException:
    """The exception to raise for an error every rank hits at the same point.

    Rank 0 raises `error` (the CLI prints it once, exit code 2); the others
    exit quietly with code 2 (`SystemExit`), so the message is not repeated N times.
    """
    return error if env.is_main else SystemExit(2)


def main_first(env: DistEnv, fn: Callable[[], T]) -> T | None:
    """Run `fn` on rank 0 while the other ranks wait; None on the others. For work that must not race (run
    directory, tokenizer training, corpus cache). If `fn` raises on rank 0, rank 0 re-raises it and the
    others exit quietly with code 2 (UserError) or 1 (anything else)."""
    if not env.distributed:
        return fn()
    result, code = None, 0
    if env.is_main:
        try:
            result = fn()
        except BaseException as e:
            env.broadcast(2 if isinstance(e, UserError) else 1)
            raise
    code = env.broadcast(code)
    if code:
        raise SystemExit(code)
    return result


def check_shared_file(env: DistEnv, path: str) -> None:
    """UserError on a rank that does not see rank 0's `path` (same size and mtime): on several nodes
    `output_dir` must be on a shared file system."""
    if not env.distributed:
        return
    def stat(p: str):
        return (os.stat(p).st_size, os.stat(p).st_mtime_ns) if os.path.isfile(p) else None
    expected = env.broadcast(stat(path) if env.is_main else None)
    if not env.is_main and stat(path) != expected:
        raise UserError(f"this rank does not see the run directory rank 0 wrote ({path} missing or different): "
                        f"on several nodes, output_dir must be on a file system shared by all of them")


@contextlib.contextmanager
def rank_errors(env: DistEnv) -> Iterator[None]:
    """Make a failure on one rank visible as that rank's: a UserError on a rank other than 0 gets a `rank R
    (host): ` prefix (exit code 2); any other exception prints its traceback and one line `nmt train: error
    on rank R (host): Type: message`, then exits with code 1. A single process is unchanged."""
    if not env.distributed:
        yield
        return
    where = f"rank {env.rank} ({socket.gethostname()})"
    try:
        yield
    except UserError as e:
        if env.is_main:
            raise
        raise UserError(f"{where}: {e}") from None
    except Exception as e:  # KeyboardInterrupt and SystemExit pass through
        traceback.print_exc(file=sys.stderr)
        if isinstance(e, dist.DistError):
            hint = " (another rank probably failed first: see its error above)"
        else:
            hint = ""
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(f"nmt train: error on {where}: {type(e).__name__}: {first}{hint}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


def simulate_failure(env: DistEnv, step: int, environ: dict | None = None) -> None:
    """Test hook: raise on rank NMT_TEST_FAIL_RANK before training step NMT_TEST_FAIL_STEP + 1."""
    e = os.environ if environ is None else environ
    if e.get("NMT_TEST_FAIL_RANK", "") == str(env.rank) and step == int(e.get("NMT_TEST_FAIL_STEP", "0") or 0):
        raise RuntimeError(f"NMT_TEST_FAIL_RANK={env.rank}: simulated failure on rank {env.rank} before step {step + 1}")
