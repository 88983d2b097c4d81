"""The training loop as a small object (JoeyNMT's TrainManager is the model): `Trainer`.

    trainer = Trainer(build_training(cfg, run_dir, device, log), stop)   # nmt/train.py
    result = trainer.run()

`Trainer.run` reads as a list of steps: for each group of `update_freq` batches, ask whether to stop
(`stop_reason`; under torchrun rank 0 decides, in the all-reduce that opens each step), take an
optimizer step (`step`), log, and validate and save when due (`validate`, `save`). What the loop
changes lives in `TrainState` (saved in every checkpoint) and the shared `Clock`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import os
import signal
import threading
import time
from typing import Any, Callable

import torch

from nmt.model import checkpoint as ckpt
from nmt.training import distributed as dist
from nmt.training import rundir
from nmt.data.batches import epoch_batches, training_batch
from nmt.errors import UserError
from nmt.layout import Batch, PackedBatch
from nmt.data.prefetch import Prefetcher
from nmt.training.logging_utils import format_stats
from nmt.training.optim import rewind
from nmt.training.step import Meter, train_step
from nmt.training.validation import validate

HIGHER_IS_BETTER = {"bleu": True, "chrf": True, "loss": False, "ppl": False}


@dataclasses.dataclass
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


class StopReason(enum.IntEnum):
    """Why training stops; an int, so that rank 0's decision travels through the step's all-reduce."""

    CONTINUE = 0
    MAX_STEPS = 1
    MAX_TIME = 2
    SIGNAL = 3


class Clock:
    """Seconds trained over all sessions (train.max_time's clock, and the time-keyed schedules').

    `local()` is this process's reading; `now` is rank 0's reading as shared by the last step's
    collective (what every rank's schedule and validation timer follow)."""

    def __init__(self):
        self.before = 0.0  # seconds trained in earlier sessions (set when a run resumes)
        self.start, self.now = time.perf_counter(), 0.0

    def local(self) -> float:
        return self.before + time.perf_counter() - self.start

    def __call__(self) -> float:
        return self.now


class SignalStop:
    """SIGINT/SIGTERM -> `requested` (first), KeyboardInterrupt (second); restores handlers. The handler
    only records the signal (a write to train.log or stderr could re-enter a write in progress); the loop
    reports it (`announce`). A repeat within `repeat_window` seconds counts as the same request (under
    torchrun a worker gets Ctrl-C from the terminal and again from torchrun)."""

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

    def announce(self, log: Callable[[str], None], doing: str = "saving checkpoints/latest.pt") -> None:
        """Log the first signal once, with what training does about it (called from the loop, never
        from the handler)."""
        if self.requested is not None and not self._announced:
            self._announced = True
            log(f"received {signal.Signals(self.requested).name}: {doing} (signal again to abort at once)")

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


class Trainer:
    """Runs one training session over a prepared `Training` (nmt/train.py `build_training`)."""

    def __init__(self, training, stop: SignalStop):
        self.tr, self.stop = training, stop
        self.cfg, self.t, self.env, self.log = training.cfg, training.cfg.train, training.env, training.log
        self.state: TrainState = training.state
        self.clock: Clock = training.clock
        self.meter = Meter()
        self.pending: list[tuple] = []  # the outcomes (ok, loss_ok: device flags) of the steps not read yet
        self.applied = True  # whether the last step read applied
        self.last_valid: dict = {}
        self.langid = training.langid.to_dict() if training.langid is not None else None  # for every checkpoint

    # ------------------------------------------------------------------ the loop

    def run(self) -> dict:
        """Train until a budget, early stopping or a signal ends it; returns the final metrics."""
        state, t = self.state, self.t
        reason = None
        while reason is None:
            if t.max_epochs and state.epoch > t.max_epochs:
                reason = f"max_epochs {t.max_epochs}"
                break
            reason = self._epoch()
            if reason is None:  # the epoch is exhausted
                state.epoch, state.batch_offset = state.epoch + 1, 0
        self._flush()
        signalled = self.env.broadcast(self.stop.requested)  # rank 0's view: every rank takes the same branch
        if signalled is not None:
            self.stop.announce(self.log.info)
            self.save(improved=False, with_step=False)  # no validation: the user wants out
        elif state.last_valid_step != state.step:
            self.validate()
        if signalled is None and t.tune_decode:
            signalled = self.tune_decode()
        elif signalled is None:  # a signal during the final validation: it had saved, the exit code says so
            signalled = self.env.broadcast(self.stop.requested)
            self.stop.announce(self.log.info, "stopping (the final validation had ended and saved)")
        best = f"{state.best:.4g}" if state.best is not None else "none (not validated)"
        self.log.info(f"stopped at step {state.step}, epoch {state.epoch}: {reason}; best {t.metric} {best}")
        return {"step": state.step, "epoch": state.epoch, "best": state.best, "metric": t.metric, "reason": reason,
                "valid": self.last_valid, "nan_steps": state.nan_total, "signal": signalled,
                "run_dir": self.tr.run_dir, "elapsed": self.clock.local()}

    def _epoch(self) -> str | None:
        """The rest of the current epoch; the stop reason, or None when the epoch is exhausted."""
        state, t, tr = self.state, self.t, self.tr
        batches = epoch_batches(tr.train_data, self.cfg, state.epoch, rank=self.env.rank,
                                world_size=self.env.world_size, offset=state.batch_offset)
        pin = tr.device.type == "cuda"
        steps = (batches[i:i + t.update_freq] for i in range(0, len(batches), t.update_freq))

        def prepare(step_batches: list) -> list[Batch | PackedBatch]:  # in nmt/data/prefetch.py's thread
            return [training_batch(tr.train_data, b, self.cfg.data, tr.tokenizer.specials, pin_memory=pin)
                    for b in step_batches]

        with Prefetcher(prepare, steps, self.cfg.data.prefetch) as prepared:
            return self._steps(prepared)

    def _steps(self, prepared) -> str | None:
        """The training steps of one epoch over its prepared micro-batch groups (`_epoch`). A step's outcome
        stays on the device (nmt/training/step.py); the loop reads the pending ones (`_flush`) only where the
        step count decides something: a log line, a validation, a checkpoint, the step budget."""
        state, t, tr = self.state, self.t, self.tr
        for host_group in prepared:
            dist.simulate_failure(self.env, state.step)
            group = [b.to(tr.device) for b in host_group]  # asynchronous from pinned memory on a GPU
            n_tokens, why, signum = self._sync(group)
            if why is not StopReason.CONTINUE:
                self.stop.announce(self.log.info)
                return self._describe(why, signum)
            self.step(group, n_tokens)
            if not self._settled():
                continue
            if state.step % t.log_every == 0:
                self.meter.report(self.log, state, tr.scheduler.get_last_lr()[0])
            if self._validation_due():
                t_valid = time.perf_counter()
                stop_early = self.validate()
                self.meter.t0 += time.perf_counter() - t_valid  # tokens/s counts training time only
                if stop_early:
                    return f"early stopping: no {t.metric} improvement in {t.patience} validations"
            elif t.save_every and state.step % t.save_every == 0:
                self.save(improved=False, with_step=False)
        return None

    def _settled(self) -> bool:
        """Whether the step just taken counts and the step count decides something now (then the pending
        steps are read: `_flush`): a log line, a validation, a checkpoint or the step budget is due."""
        t, step = self.t, self.state.step
        due = step % t.log_every == 0 or (t.valid_every and step % t.valid_every == 0) or \
            (t.save_every and step % t.save_every == 0) or (t.max_steps and step >= t.max_steps) or \
            (t.valid_every_minutes and self.clock() - self.state.last_valid_time >= 60 * t.valid_every_minutes)
        if not due:
            return False
        if self.pending:  # (with EMA the step read its own outcome)
            self.applied = self._flush()[-1]
        return self.applied

    def _flush(self) -> list[bool]:
        """Read the pending steps' outcomes (one host read): the skipped ones leave the step count and the
        schedule, count towards train.max_nan_steps (a UserError after that many in a row) and are logged.
        Returns per pending step whether it applied."""
        if not self.pending:
            return []
        state, t, tr = self.state, self.t, self.tr
        flags = torch.stack([torch.stack(p) for p in self.pending]).tolist()  # [[ok, loss_ok], ...]
        first = state.step - len(flags) + 1  # the step number the first pending one took
        self.pending, skipped = [], 0
        for k, (ok, loss_ok) in enumerate(flags):
            if ok:
                state.nan_steps = 0
                continue
            skipped += 1
            if not loss_ok or tr.precision.scaler is None:  # (an fp16 overflow is the scaler's business)
                state.nan_steps, state.nan_total = state.nan_steps + 1, state.nan_total + 1
                self.log.info(f"warning: non-finite loss/gradient at step {first + k - skipped + 1}: update "
                              f"skipped ({state.nan_steps} in a row, {state.nan_total} in total)")
        state.step -= skipped
        rewind(tr.scheduler, skipped)
        if state.nan_steps >= t.max_nan_steps:
            self.save(improved=False, with_step=False)
            raise dist.all_ranks_error(self.env, UserError(
                f"{state.nan_steps} non-finite losses in a row (train.max_nan_steps={t.max_nan_steps}); "
                f"lower train.lr, raise warmup_steps or set clip_norm"))
        return [bool(ok) for ok, _ in flags]

    def _sync(self, group: list[Batch]) -> tuple[int, StopReason, int]:
        """The all-reduce that opens each step: the global target-token count, rank 0's stop decision and its
        clock (milliseconds). Returns (tokens, StopReason, signal number)."""
        local = (0, 0, 0)
        if self.env.is_main:
            elapsed = self.clock.local()
            local = (int(self.stop_reason(elapsed)), self.stop.requested or 0, round(elapsed * 1000))
        n_tokens, why, signum, ms = self.env.sum_values([sum(b.n_tgt_tokens for b in group), *local],
                                                        self.tr.device)
        self.clock.now = ms / 1000
        return n_tokens, StopReason(why), signum

    def stop_reason(self, elapsed: float) -> StopReason:
        """Rank 0's decision before a step: a budget reached, a signal received, or go on."""
        t = self.t
        if t.max_steps and self.state.step >= t.max_steps:
            return StopReason.MAX_STEPS
        if t.max_time and elapsed >= t.max_time:
            return StopReason.MAX_TIME
        return StopReason.SIGNAL if self.stop.requested else StopReason.CONTINUE

    def _describe(self, why: StopReason, signum: int) -> str:
        t = self.t
        if why is StopReason.MAX_STEPS:
            return f"max_steps {t.max_steps}"
        if why is StopReason.MAX_TIME:
            return f"max_time {t.max_time:g}s"
        return f"signal {signal.Signals(signum).name}" if signum else "signal"

    def _validation_due(self) -> bool:
        t, state = self.t, self.state
        due = t.valid_every_minutes and self.clock() - state.last_valid_time >= 60 * t.valid_every_minutes
        return bool((t.valid_every and state.step % t.valid_every == 0) or due)

    # ------------------------------------------------------------------ one step

    def step(self, group: list[Batch], n_tokens: int) -> None:
        """One optimizer update over `group`, counted at once (`_flush` takes back a skipped one: a
        non-finite loss or gradient). With EMA the outcome is read at once: the average follows only
        the applied updates."""
        state, t, tr, env = self.state, self.t, self.tr, self.env
        sync = dict(grad_denominator=n_tokens / env.world_size, reduce=env.all_reduce_sum) if env.distributed else {}
        res = train_step(tr.forward, group, tr.optimizer, tr.scheduler, tr.precision, label_smoothing=t.label_smoothing,
                         clip_norm=t.clip_norm, pad_id=tr.tokenizer.specials.pad, loss_fn=tr.loss_fn, **sync)
        state.batch_offset += len(group)
        state.step += 1
        self.meter.add(res, group, n_tokens)
        self.pending.append((res.ok, res.loss_ok))
        self.log.progress(1)
        if tr.ema is not None:
            self.applied = self._flush()[-1]
            if self.applied:
                tr.ema.update(ckpt.unwrap(tr.model))

    # ------------------------------------------------------------------ validation and checkpoints

    def validate(self) -> bool:
        """Validate on rank 0 (the others wait), then save; True when early stopping says stop."""
        self._flush()
        state, t, tr, env = self.state, self.t, self.tr, self.env
        shared = None
        if env.is_main:
            model = ckpt.unwrap(tr.model)
            with tr.ema.applied(model) if tr.ema is not None else contextlib.nullcontext():  # validate the average
                metrics = validate(model, self.cfg, tr.tokenizer, tr.valid_data, tr.valid_sets,
                                   tr.device, tr.precision, self.log, state.step, tr.langid)
            value = metrics[t.metric]
            improved = state.best is None or (value > state.best if HIGHER_IS_BETTER[t.metric] else value < state.best)
            if improved:
                state.best, state.bad_validations = value, 0
            else:
                state.bad_validations += 1
            state.valid_history.append([state.step, value])
            self.log.scalars("valid", metrics, state.step)
            summary = {k: v for k, v in metrics.items() if "/" not in k}  # (several sets: their means)
            self.log.info(f"valid step {state.step} | {format_stats(summary)} | best {t.metric} {state.best:.4g}"
                          f"{' (new best)' if improved else f' ({state.bad_validations} without improvement)'}")
            shared = (metrics, improved, state.best, state.bad_validations, state.valid_history)
        metrics, improved, state.best, state.bad_validations, state.valid_history = env.broadcast(shared)
        self.last_valid.update(metrics)
        state.last_valid_step, state.last_valid_time = state.step, self.clock()
        self.save(improved, with_step=True)
        self.log.flush()
        return t.patience > 0 and state.bad_validations >= t.patience

    def tune_decode(self) -> int | None:
        """train.tune_decode: `nmt tune` of best.pt on the validation set, written into best.pt (rank 0;
        the others wait). A signal stops the tuning between two batches and best.pt stays as trained
        (it is only ever replaced whole, atomically). Returns rank 0's signal number, or None."""
        if self.env.is_main:
            from nmt.translation.torch_engine import TorchEngine
            from nmt.translation.tune import Stopped, apply_to_checkpoint, format_result, tune

            best = os.path.join(self.tr.run_dir, "checkpoints", "best.pt")
            if os.path.exists(best):
                metric = "chrf" if self.t.metric == "chrf" else "bleu"
                vs = self.tr.valid_sets[0]
                src, ref = vs.lines
                self.log.info(f"tuning the decode settings of best.pt on the validation set ({len(src)} lines, "
                              f"at most {self.t.tune_max_time:g} s)")
                try:
                    result = tune(TorchEngine.load(best, str(self.tr.device)), src, ref, metric=metric,
                                  max_time=self.t.tune_max_time, log=lambda m: None,
                                  stop=lambda: self.stop.requested is not None,
                                  src_lang=vs.src_lang)
                except Stopped:
                    self.stop.announce(self.log.info, "tuning stopped, best.pt keeps the decode settings it was "
                                                      "trained with")
                else:
                    if result.within_limit:
                        self.log.info(format_result(result, metric))
                        apply_to_checkpoint(best, best, result, metric, "the validation set")
                    else:
                        self.log.info(f"warning: tune: {result.over_limit()}: best.pt keeps its decode settings")
                    self.stop.announce(self.log.info, "stopping (the tuning had ended)")
        return self.env.broadcast(self.stop.requested)

    def save(self, improved: bool, with_step: bool) -> None:
        """Collective: every rank calls it at the same step (their RNG states are gathered); rank 0 writes."""
        self._flush()
        rngs = self.env.gather(ckpt.rng_state())
        if self.env.is_main:
            state = dataclasses.replace(self.state, elapsed=self.clock.local())
            best = rundir.best_steps(state.valid_history, self.t.keep_best, HIGHER_IS_BETTER[self.t.metric])
            rundir.save_checkpoints(self.tr.run_dir, self._payload(state, rngs), state.step, improved=improved,
                                    keep_last=self.t.keep_last, keep_steps=best, with_step=with_step)

    def _payload(self, state: TrainState, rngs: list[dict]) -> ckpt.ModelRecord:
        """The checkpoint's record (`checkpoint.record`). rngs: every rank's RNG states (`rng` = rank 0's;
        `rng_ranks` = all, when distributed)."""
        tr = self.tr
        scaler = tr.precision.scaler
        model = ckpt.unwrap(tr.model)
        ema = {} if tr.ema is None else {"raw_model": model.state_dict(), "ema": {"updates": tr.ema.updates}}
        train_state = {
            "optimizer": tr.optimizer.state_dict(), "scheduler": tr.scheduler.state_dict(),
            "scaler": scaler.state_dict() if scaler is not None else None,
            "rng": rngs[0], **({"rng_ranks": rngs} if len(rngs) > 1 else {}), **ema, **dataclasses.asdict(state)}
        weights = tr.precision.state_dict(model) if tr.ema is None else tr.ema.state_dict(model)
        return ckpt.record(weights, tr.tokenizer, self.cfg, step=state.step, epoch=state.epoch, langid=self.langid,
                           train_state=train_state)
