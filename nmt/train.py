"""`nmt train`: the training loop.

    train(cfg, resume=False, device=None, quiet=False) -> dict of final metrics

Run directory `cfg.output_dir/cfg.name/`: config.yaml (resolved), spm*.model,
cache/ (encoded corpora), checkpoints/ (latest.pt, best.pt, step_N.pt keeping
the last `keep_last`), tensorboard/ (event files), train.log.

Starting a run in a directory that already has checkpoints is an error unless
`resume=True`, which continues exactly from checkpoints/latest.pt: model,
optimizer, schedule, GradScaler, RNG states, epoch and the position inside
it, best metric and patience. The config passed in may change training
options (e.g. a larger max_steps) but not the model architecture.

One optimizer step (`nmt.step.train_step`) runs forward/backward over a list of
micro-batches (`update_freq` of them) and normalises the summed loss by their
total target-token count, so accumulation equals one big batch. Steps whose
loss or gradient norm is not finite are skipped (not counted as steps); after
`max_nan_steps` in a row training stops with a UserError. Precision and host
syncs: nmt/step.py. Validation: nmt/validation.py. The run directory (lock,
start checks, checkpoint files): nmt/rundir.py.

Data parallel (torchrun; `nmt.distributed`, docs/distributed.md): DDP model;
rank r trains on its padded share of each epoch (`epoch_batches(rank=r,
world_size=W)`; `batch_offset` is per rank). One all-reduce per step sums the
ranks' target tokens (and carries rank 0's stop decision), so gradients are
normalised by the global count and W ranks with batch b equal one process with
W x b; loss sums are all-reduced too (global logs, one NaN-skip decision). Rank 0
alone prepares the run directory and data (the others wait, then load), logs,
validates and writes checkpoints (with every rank's RNG state).

Returns {"step", "epoch", "best", "metric", "reason", "valid" (last validation
metrics), "nan_steps", "signal" (None or the signal number), "run_dir", "elapsed"}.

SIGINT/SIGTERM: the current step finishes, latest.pt is written, and `train`
returns normally with `result["signal"]` set to the signal number (the CLI
exits with 128 + signal: 130 for Ctrl-C, 143 for SIGTERM). A second signal
raises KeyboardInterrupt at once. Previous handlers are restored on return.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from nmt import checkpoint as ckpt
from nmt import distributed as dist
from nmt import finetune, rundir
from nmt.config import Config, save_config, to_dict
from nmt.data import epoch_batches, load_data
from nmt.distributed import DistEnv
from nmt.device import resolve_torch_device
from nmt.errors import UserError
from nmt.layout import collate
from nmt.logging_utils import RunLogger, format_stats
from nmt.model import Transformer
from nmt.optim import build_optimizer, build_scheduler
from nmt.step import Meter, Precision, setup_precision, train_step
from nmt.tokenizer import Tokenizer, build_tokenizer
from nmt.validation import validate

HIGHER_IS_BETTER = {"bleu": True, "chrf": True, "loss": False, "ppl": False}


# --------------------------------------------------------------------------- state

@dataclass
class TrainState:
    """Progress counters saved in every checkpoint (`train_state`)."""

    step: int = 0  # optimizer updates done
    epoch: int = 1  # current epoch (1-based)
    batch_offset: int = 0  # this rank's batches of `epoch` already consumed
    best: float | None = None  # best validation value of cfg.train.metric
    bad_validations: int = 0  # validations since the last improvement
    nan_steps: int = 0  # skipped non-finite steps in a row
    nan_total: int = 0  # skipped non-finite steps in total
    elapsed: float = 0.0  # seconds trained, over all sessions
    last_valid_step: int = -1
    last_valid_time: float = 0.0  # `elapsed` at the last validation (train.valid_every_minutes)
    world_size: int = 1  # processes that shared the data (batch_offset is per rank)
    valid_history: list = dataclasses.field(default_factory=list)  # [step, value of train.metric] per validation


class SignalStop:
    """SIGINT/SIGTERM -> `requested` (first), KeyboardInterrupt (second); restores handlers.

    The handler only records the signal: it must not write to train.log or stderr, because
    the signal can arrive while the loop is writing to the same file (a reentrant write
    raises RuntimeError in the middle of training). The loop reports it (`announce`).
    A repeat within `repeat_window` seconds of the first counts as the same request:
    under torchrun a worker gets Ctrl-C from the terminal and again from torchrun,
    which forwards the signals it receives.
    """

    def __init__(self, repeat_window: float = 0.0):
        self.requested: int | None = None
        self.repeat_window = repeat_window
        self._old: dict[int, Any] = {}
        self._since = 0.0
        self._announced = False

    def __enter__(self) -> "SignalStop":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested is not None:
            if time.monotonic() - self._since < self.repeat_window:
                return
            raise KeyboardInterrupt
        self.requested, self._since = signum, time.monotonic()

    def announce(self, log: Callable[[str], None]) -> None:
        """Log the first signal once (called from the loop, never from the handler)."""
        if self.requested is not None and not self._announced:
            self._announced = True
            log(f"received {signal.Signals(self.requested).name}: saving checkpoints/latest.pt "
                f"(signal again to abort at once)")

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


# --------------------------------------------------------------------------- setup

def _check_same_model(saved_model: dict, cfg: Config, path: str) -> None:
    new = to_dict(cfg.model)
    diff = [k for k in new if saved_model.get(k) != new[k]]
    if diff:
        raise UserError(f"cannot resume from {path}: the model config changed ({', '.join('model.' + k for k in diff)})")


def _checkpoint_dict(model: nn.Module, cfg: Config, tokenizer: Tokenizer, optimizer, scheduler,
                     precision: Precision, state: TrainState, rngs: list[dict]) -> dict:
    """rngs: every rank's RNG states (`rng` = rank 0's; `rng_ranks` = all, when distributed)."""
    return {
        "model": ckpt.unwrap(model).state_dict(), "config": to_dict(cfg), "tokenizer": tokenizer.to_bytes(),
        "vocab": {"src": tokenizer.src_vocab_size, "tgt": tokenizer.tgt_vocab_size},
        "step": state.step, "epoch": state.epoch,
        "train_state": {
            "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
            "scaler": precision.scaler.state_dict() if precision.scaler is not None else None,
            "rng": rngs[0], **({"rng_ranks": rngs} if len(rngs) > 1 else {}), **dataclasses.asdict(state)},
    }


# --------------------------------------------------------------------------- main entry

def train(cfg: Config, *, resume: bool = False, device: str | None = None, quiet: bool = False) -> dict:
    """Train `cfg` (module docstring); returns the final metrics (the same on every torchrun rank)."""
    env = DistEnv.from_env()
    threads = torch.get_num_threads()
    try:
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        with dist.rank_errors(env), dist.process_group(env, resolve_torch_device(device or cfg.train.device)) as dev, \
                contextlib.ExitStack() as held:
            def prepare() -> str:  # rank 0: the run directory, locked for the whole run
                run_dir = rundir.create(cfg.run_dir)
                held.enter_context(rundir.RunLock(run_dir))
                rundir.check_start(run_dir, resume)
                return run_dir
            run_dir = dist.main_first(env, prepare) or cfg.run_dir
            log = RunLogger(run_dir, quiet=quiet, enabled=env.is_main)
            try:
                with SignalStop(repeat_window=3.0 if env.distributed else 0.0) as stop:
                    return _train(cfg, run_dir, resume, dev, log, stop, env)
            finally:
                log.close()
    finally:
        torch.set_num_threads(threads)


def _prepare_data(cfg: Config, run_dir: str, saved: dict | None, log: RunLogger, env: DistEnv,
                  source: dict | None = None):
    """(tokenizer, Data): rank 0 trains/loads the tokenizer and encodes the corpora (cache
    files) while the others wait; then they get the tokenizer from rank 0 and load the cache.
    The tokenizer of a resumed run is its checkpoint's, of a fine-tuning run its source's."""
    def on_main():
        if source is not None:
            tokenizer = Tokenizer.from_bytes(source["tokenizer"], threads=cfg.data.tokenizer.threads)
            tokenizer.save(run_dir)
            log.info(f"new run in {run_dir}, fine-tuning {cfg.train.init_from} (step {source.get('step')}; "
                     f"fresh: {', '.join(cfg.train.init_reset) or 'nothing'})")
        elif saved is not None:
            _check_same_model(saved["config"].get("model", {}), cfg, run_dir)
            if saved["config"].get("data") != to_dict(cfg.data) or saved["config"].get("seed") != cfg.seed:
                log.info("warning: data settings or seed changed since the checkpoint: the data order will not "
                         "continue exactly")
            tokenizer = Tokenizer.from_bytes(saved["tokenizer"], threads=cfg.data.tokenizer.threads)
            log.info(f"resuming {run_dir} from step {saved['step']}")
        else:
            log.info(f"new run in {run_dir}" + (f" ({env.world_size} processes)" if env.distributed else ""))
            tokenizer = build_tokenizer(cfg, run_dir, log.info)
        save_config(cfg, os.path.join(run_dir, "config.yaml"))
        return tokenizer, load_data(cfg, tokenizer, run_dir, log.info)

    prepared = dist.main_first(env, on_main)
    proto = env.broadcast(prepared[0].to_bytes() if env.is_main else None)
    dist.check_shared_file(env, os.path.join(run_dir, "config.yaml"))
    if env.is_main:
        return prepared
    tokenizer = Tokenizer.from_bytes(proto, threads=cfg.data.tokenizer.threads)
    return tokenizer, load_data(cfg, tokenizer, run_dir, lambda msg: None)


def _restore(saved: dict, model, optimizer, scheduler, precision: Precision, cfg: Config, env: DistEnv,
             log: RunLogger) -> TrainState:
    """Load the training state of `saved` (latest.pt) into this rank; returns the counters."""
    ts = saved["train_state"]
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(ts["optimizer"])
    scheduler.load_state_dict(ts["scheduler"])
    if precision.scaler is not None and ts.get("scaler"):
        precision.scaler.load_state_dict(ts["scaler"])
    state = TrainState(**{f.name: ts[f.name] for f in dataclasses.fields(TrainState) if f.name in ts})
    rngs = ts.get("rng_ranks") or [ts["rng"]]
    ckpt.set_rng_state(rngs[env.rank] if len(rngs) == env.world_size else ts["rng"])
    if state.world_size != env.world_size:
        log.info(f"warning: the checkpoint was trained with {state.world_size} processes, now {env.world_size}: "
                 f"the data order and dropout will not continue exactly")
        state.batch_offset = state.batch_offset * state.world_size // env.world_size
        state.world_size = env.world_size
        if env.rank:
            torch.manual_seed(cfg.seed + env.rank + state.step)
    return state


def _stop_code(t, state: TrainState, elapsed: float, stop: SignalStop) -> tuple[int, int]:
    """(code, signal number): 0 = go on, 1 = max_steps, 2 = max_time, 3 = signal."""
    if t.max_steps and state.step >= t.max_steps:
        return 1, 0
    return (2, 0) if t.max_time and elapsed >= t.max_time else (3 if stop.requested else 0, stop.requested or 0)


def _train(cfg: Config, run_dir: str, resume: bool, device: torch.device, log: RunLogger, stop: SignalStop,
           env: DistEnv = DistEnv()) -> dict:
    t, start = cfg.train, time.perf_counter()
    if t.valid_bleu:
        from nmt.evaluate import check_tokenize

        check_tokenize(t.valid_tokenize)  # a missing MeCab fails now, not at the first validation
    # every rank reads latest.pt (onto the CPU: nothing lands on rank 0's GPU) before rank 0 can write it again
    latest = os.path.join(run_dir, "checkpoints", "latest.pt")
    saved = ckpt.load_checkpoint(latest) if resume else None
    if saved is not None and "train_state" not in saved:
        raise UserError(f"cannot resume from {latest}: it has no training state (an averaged checkpoint?); "
                        "--resume needs a checkpoint written by nmt train (to start a new run from these "
                        "weights, set train.init_from)")
    source = finetune.load_source(cfg, run_dir) if t.init_from and not resume else None
    tokenizer, (train_data, valid_data, valid_lines) = _prepare_data(cfg, run_dir, saved, log, env, source)

    torch.manual_seed(cfg.seed)  # parameter init (the same on every rank); dropout continues from this generator
    model = Transformer(cfg.model, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, tokenizer.specials.pad).to(device)
    if device.type == "cpu":
        from nmt import fast

        fast.install_for_training(model)  # numpy dropout masks (nmt/fast.py)
    optimizer = build_optimizer(model, t, device)
    now = [0.0]  # rank 0's seconds trained (over all sessions; max_time's clock) at this step, shared by its collective
    clock = lambda: now[0]
    state = TrainState(world_size=env.world_size)
    scheduler = build_scheduler(optimizer, t, cfg.model.d_model, clock)
    precision = setup_precision(t.precision, device)
    if saved is not None:
        state = _restore(saved, model, optimizer, scheduler, precision, cfg, env, log)
    else:
        if source is not None:
            state.step = finetune.apply(source, cfg, model, optimizer, scheduler)
        if env.rank:
            torch.manual_seed(cfg.seed + env.rank)  # each rank its own dropout masks
    saved = source = None  # free the loaded checkpoints
    ddp = dist.wrap_model(env, model, device)
    fwd = torch.compile(ddp) if t.compile else ddp
    log.info(f"model: {model.num_parameters():,} parameters; device {device}, precision {precision.name}"
             f"{', compiled' if t.compile else ''}"
             f"{f'; DDP over {env.world_size} processes' if env.distributed else ''}")
    log.start_progress(t.max_steps or None, state.step)

    def save(improved: bool, with_step: bool) -> None:
        """Collective: every rank calls it at the same step; rank 0 writes."""
        rngs = env.gather(ckpt.rng_state())
        if env.is_main:
            payload = _checkpoint_dict(model, cfg, tokenizer, optimizer, scheduler, precision,
                                       dataclasses.replace(state, elapsed=state.elapsed + time.perf_counter() - start),
                                       rngs)
            best = rundir.best_steps(state.valid_history, t.keep_best, HIGHER_IS_BETTER[t.metric])
            rundir.save_checkpoints(run_dir, payload, state.step, improved=improved, keep_last=t.keep_last,
                                    keep_steps=best, with_step=with_step)

    last_valid: dict = {}

    def run_validation() -> bool:
        """Validate on rank 0 (the others wait), save; True when early stopping says stop."""
        shared = None
        if env.is_main:
            metrics = validate(model, cfg, tokenizer, valid_data, valid_lines, device, precision, log, state.step)
            value = metrics[t.metric]
            better = HIGHER_IS_BETTER[t.metric]
            improved = state.best is None or (value > state.best if better else value < state.best)
            if improved:
                state.best, state.bad_validations = value, 0
            else:
                state.bad_validations += 1
            state.valid_history.append([state.step, value])
            log.scalars("valid", metrics, state.step)
            log.info(f"valid step {state.step} | {format_stats(metrics)} | best {t.metric} {state.best:.4g}"
                     f"{' (new best)' if improved else f' ({state.bad_validations} without improvement)'}")
            shared = (metrics, improved, state.best, state.bad_validations, state.valid_history)
        metrics, improved, state.best, state.bad_validations, state.valid_history = env.broadcast(shared)
        last_valid.update(metrics)
        state.last_valid_step, state.last_valid_time = state.step, clock()
        save(improved, with_step=True)
        log.flush()
        return t.patience > 0 and state.bad_validations >= t.patience

    meter = Meter()
    reason = None
    while reason is None:
        if t.max_epochs and state.epoch > t.max_epochs:
            reason = f"max_epochs {t.max_epochs}"
            break
        batches = epoch_batches(train_data, cfg, state.epoch, rank=env.rank, world_size=env.world_size,
                                offset=state.batch_offset)
        for i in range(0, len(batches), t.update_freq):
            dist.simulate_failure(env, state.step)
            group = [collate(train_data, b, tokenizer.specials, pin_memory=device.type == "cuda").to(device)
                     for b in batches[i:i + t.update_freq]]
            # one collective: the step's global token count, rank 0's stop decision and clock (milliseconds)
            elapsed = state.elapsed + time.perf_counter() - start
            local = (*_stop_code(t, state, elapsed, stop), round(elapsed * 1000)) if env.is_main else (0, 0, 0)
            n_tokens, code, signum, ms = env.sum_values([sum(b.n_tgt_tokens for b in group), *local], device)
            now[0] = ms / 1000
            if code:
                stop.announce(log.info)
                reason = {1: f"max_steps {t.max_steps}", 2: f"max_time {t.max_time:g}s",
                          3: f"signal {signal.Signals(signum).name}" if signum else "signal"}[code]
                break
            sync = dict(grad_denominator=n_tokens / env.world_size, reduce=env.all_reduce_sum) if env.distributed else {}
            res = train_step(fwd, group, optimizer, scheduler, precision,
                             label_smoothing=t.label_smoothing, clip_norm=t.clip_norm, pad_id=tokenizer.specials.pad,
                             **sync)
            state.batch_offset += len(group)
            meter.add(res, group, n_tokens)
            if not res.updated:
                if res.nonfinite_loss or precision.scaler is None:
                    state.nan_steps, state.nan_total = state.nan_steps + 1, state.nan_total + 1
                    log.info(f"warning: non-finite loss/gradient at step {state.step + 1}: update skipped "
                             f"({state.nan_steps} in a row, {state.nan_total} in total)")
                    if state.nan_steps >= t.max_nan_steps:
                        save(False, with_step=False)
                        raise dist.all_ranks_error(env, UserError(
                            f"{state.nan_steps} non-finite losses in a row (train.max_nan_steps={t.max_nan_steps}); "
                            f"lower train.lr, raise warmup_steps or set clip_norm"))
                continue
            state.step, state.nan_steps = state.step + 1, 0
            log.progress(1)
            if state.step % t.log_every == 0:
                meter.report(log, state, scheduler.get_last_lr()[0])
            due = t.valid_every_minutes and clock() - state.last_valid_time >= 60 * t.valid_every_minutes
            if (t.valid_every and state.step % t.valid_every == 0) or due:
                t_valid = time.perf_counter()
                stop_early = run_validation()
                meter.t0 += time.perf_counter() - t_valid  # tokens/s counts training time only
                if stop_early:
                    reason = f"early stopping: no {t.metric} improvement in {t.patience} validations"
                    break
            elif t.save_every and state.step % t.save_every == 0:
                save(False, with_step=False)
        else:  # the epoch is exhausted
            state.epoch, state.batch_offset = state.epoch + 1, 0
    signalled = env.broadcast(stop.requested)  # rank 0's view, so that every rank takes the same branch
    if signalled is not None:
        stop.announce(log.info)
        save(False, with_step=False)  # no validation: the user wants out
    elif state.last_valid_step != state.step:
        run_validation()
    log.info(f"stopped at step {state.step}, epoch {state.epoch}: {reason}; best {t.metric} "
             f"{state.best if state.best is not None else float('nan'):.4g}")
    return {"step": state.step, "epoch": state.epoch, "best": state.best, "metric": t.metric, "reason": reason,
            "valid": last_valid,
            "nan_steps": state.nan_total, "signal": signalled, "run_dir": run_dir,
            "elapsed": state.elapsed + time.perf_counter() - start}


