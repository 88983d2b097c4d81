"""`nmt train`: a training run (`train(cfg)`): its data, model, optimizer and run directory set up, then
`Trainer` runs the loop (nmt/training/trainer.py).

    train(cfg, resume=False, device=None, quiet=False) -> dict of final metrics

Run directory `cfg.output_dir/cfg.name/`: config.yaml (resolved), spm*.model, cache/ (encoded
corpora), checkpoints/ (latest.pt, best.pt, the last `keep_last` step_N.pt), tensorboard/, train.log
(nmt/training/rundir.py). Starting in a directory that has checkpoints is an error unless
`resume=True`, which continues exactly from checkpoints/latest.pt (model, optimizer, schedule,
scaler, RNG states, position in the epoch, best metric and patience); the config may change
training options but not the architecture.

`build_training` prepares the objects the loop runs over (scripts/bench_train.py and
scripts/bench_data.py time exactly those). One optimizer step (nmt/training/step.py) sums the loss
over `update_freq` micro-batches and normalises it by their target tokens; non-finite steps are
skipped, `max_nan_steps` in a row stop with a UserError. Validation: nmt/training/validation.py.

Data parallel (torchrun; nmt/training/distributed.py, docs/distributed.md): each rank trains on its
padded share of each epoch; one all-reduce per step sums the target tokens (and carries rank 0's stop
decision), so W ranks with batch b equal one process with W x b. Rank 0 alone prepares the run
directory and data, logs, validates and writes checkpoints (with every rank's RNG state).

Returns {"step", "epoch", "best", "metric", "reason", "valid", "nan_steps", "signal", "run_dir",
"elapsed"}. SIGINT/SIGTERM: the current step finishes, latest.pt is written and `result["signal"]`
is set (the CLI exits with 128 + signal); during `train.tune_decode` the tuning stops and best.pt
keeps its trained settings. A second signal raises KeyboardInterrupt at once.
"""

from __future__ import annotations

import functools

import contextlib
import dataclasses
import os
import time
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from nmt.model import checkpoint as ckpt
from nmt.training import distributed as dist
from nmt.training import finetune, rundir, validation
from nmt.text import langid
from nmt.config import Config, save_config, to_dict
from nmt.data.corpus import EncodedCorpus
from nmt.data.batches import load_data
from nmt.device import resolve_torch_device
from nmt.training.distributed import DistEnv
from nmt.training.ema import EMA
from nmt.errors import UserError
from nmt.text.langid import LanguageIdentifier
from nmt.training.logging_utils import RunLogger
from nmt.training.loss import compiled_smoothed_nll, label_smoothed_nll
from nmt.model.transformer import Transformer
from nmt.training.optim import build_optimizer, build_scheduler
from nmt.training.step import MasterWeights, Precision, setup_precision
from nmt.text.tokenizer import Tokenizer, build_tokenizer
from nmt.text.tokens import TokenizerLike
from nmt.training.trainer import Clock, SignalStop, Trainer, TrainState

__all__ = ["SignalStop", "TrainState", "Training", "build_training", "train"]


@dataclass
class Training:
    """Everything a training session works on (`build_training`); `Trainer` runs it."""

    cfg: Config
    run_dir: str
    device: torch.device
    env: DistEnv
    log: RunLogger
    tokenizer: TokenizerLike
    train_data: EncodedCorpus
    valid_data: EncodedCorpus
    model: nn.Module  # the plain Transformer (checkpoints, validation)
    forward: nn.Module  # what the step calls: the model, or DDP around it
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    precision: Precision
    state: TrainState
    clock: Clock
    valid_sets: tuple = ()  # nmt.data.batches.ValidSet per validation corpus
    langid: LanguageIdentifier | None = None  # rank 0's (validation, checkpoints); nmt/text/langid.py
    ema: EMA | None = None  # train.ema_decay: the moving average of the weights (nmt/training/ema.py)
    loss_fn: Callable | None = None  # train_step's: None = nmt.training.loss.label_smoothed_nll; train.compile: compiled_smoothed_nll


# --------------------------------------------------------------------------- main entry

def train(cfg: Config, *, resume: bool = False, device: str | None = None, quiet: bool = False) -> dict:
    """Train `cfg` (module docstring); returns the final metrics (the same on every torchrun rank).
    The process-wide settings it changes (torch's intra-op threads, TF32 and cuDNN attention on CUDA)
    are restored on return, except torch.fx's duck sizing, which `train.compile` turns off for the
    process (nmt/model/transformer.py `compile_layers`)."""
    env = DistEnv.from_env()
    threads = torch.get_num_threads()
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    cudnn_sdp = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        with dist.rank_errors(env), dist.process_group(env, resolve_torch_device(device or cfg.train.device)) as dev, \
                contextlib.ExitStack() as held:
            def prepare() -> str:  # rank 0: the run directory, locked for the whole run
                run_dir = rundir.create(cfg.run_dir, resume=resume)
                held.enter_context(rundir.RunLock(run_dir))
                rundir.check_start(run_dir, resume)
                return run_dir
            run_dir = dist.main_first(env, prepare) or cfg.run_dir
            log = RunLogger(run_dir, quiet=quiet, enabled=env.is_main)
            try:
                with SignalStop(repeat_window=3.0 if env.distributed else 0.0) as stop:
                    return Trainer(build_training(cfg, run_dir, dev, log, env, resume=resume), stop).run()
            finally:
                log.close()
    finally:
        torch.set_num_threads(threads)
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cuda.enable_cudnn_sdp(cudnn_sdp)


def build_training(cfg: Config, run_dir: str, device: torch.device, log: RunLogger, env: DistEnv = DistEnv(), *,
                   resume: bool = False) -> Training:
    """Prepare a training session in `run_dir`: tokenizer and data (rank 0 first), the model (seeded
    init), optimizer, schedule and precision, restored from checkpoints/latest.pt with `resume`, or
    started from `train.init_from` (fine-tuning). The clock starts here: data preparation counts
    toward train.max_time."""
    clock = Clock()
    validation.check_tokenize(cfg, log.info)  # a missing MeCab fails now, not at the first validation
    # every rank reads latest.pt (onto the CPU: nothing lands on rank 0's GPU) before rank 0 can write it again
    saved = _load_latest(run_dir) if resume else None
    source = finetune.load_source(cfg, run_dir, log.info) if cfg.train.init_from and not resume else None
    tokenizer, data, identifier = _prepare_data(cfg, run_dir, saved, log, env, source)
    model = _build_model(cfg, tokenizer, device)
    optimizer = build_optimizer(model, cfg.train, device)
    scheduler = build_scheduler(optimizer, cfg.train, cfg.model.d_model, clock)
    precision = setup_precision(cfg.train.precision, device)
    state = TrainState(world_size=env.world_size)
    if saved is not None:
        state = _restore(saved, model, optimizer, scheduler, precision, cfg, env, log)
    else:
        if source is not None:
            state.step = finetune.apply(source, cfg, model, optimizer, scheduler)
        if env.rank:
            torch.manual_seed(cfg.seed + env.rank)  # each rank its own dropout masks
    clock.before = state.elapsed
    ema = _build_ema(cfg, model, saved)
    if cfg.train.master_weights:  # after the fp32 weights are loaded: they become the masters
        precision.master = _master_weights(cfg, model, optimizer, precision)
    if cfg.train.compile:  # regional compilation, before DDP wraps it (nmt/model/transformer.py)
        model.compile_layers(shapes=len(cfg.data.length_buckets))
    ddp = dist.wrap_model(env, model, device)
    log.info(f"model: {model.num_parameters():,} parameters; device {device}, precision {precision.name}"
             f"{', compiled' if cfg.train.compile else ''}"
             f"{f'; DDP over {env.world_size} processes' if env.distributed else ''}")
    log.start_progress(cfg.train.max_steps or None, state.step)
    return Training(cfg, run_dir, device, env, log, tokenizer, data.train, data.valid, model, ddp,
                    optimizer, scheduler, precision, state, clock, data.valid_sets, identifier, ema,
                    _loss_fn(cfg))


def _build_ema(cfg: Config, model, saved: ckpt.ModelRecord | None) -> EMA | None:
    """train.ema_decay's average: from the model's weights, or (resuming a run that kept one) from latest.pt."""
    if not cfg.train.ema_decay:
        return None
    ema = EMA(model, cfg.train.ema_decay)
    ts = saved.train_state if saved is not None else {}
    if "ema" in ts:
        ema.load(saved.model, int(ts["ema"]["updates"]))
    return ema


def _master_weights(cfg: Config, model, optimizer, precision: Precision) -> MasterWeights:
    """train.master_weights: the model in the compute precision, the optimizer's fp32 parameters its masters."""
    if precision.dtype is None:
        raise UserError(f"train.master_weights needs bf16 or fp16 (train.precision {cfg.train.precision} "
                        f"trains in fp32 here)")
    if cfg.train.ema_decay:
        raise UserError("train.master_weights does not work with train.ema_decay yet: leave one of them out")
    return MasterWeights(model, optimizer, precision.dtype)


def _load_latest(run_dir: str) -> ckpt.ModelRecord:
    latest = os.path.join(run_dir, "checkpoints", "latest.pt")
    saved = ckpt.load_record(latest, mmap=False)
    if saved.train_state is None:
        raise UserError(f"cannot resume from {latest}: it has no training state (an averaged checkpoint?); "
                        "--resume needs a checkpoint written by nmt train (to start a new run from these "
                        "weights, set train.init_from)")
    return saved


def _build_model(cfg: Config, tokenizer: TokenizerLike, device: torch.device) -> Transformer:
    """The Transformer, initialised from `cfg.seed` (the same on every rank); dropout continues from
    this generator. On CPU with nmt/model/fast.py's numpy dropout (not with train.compile, whose graphs draw
    their own masks)."""
    torch.manual_seed(cfg.seed)
    model = Transformer(cfg.model, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, tokenizer.specials.pad)
    model = model.to(device)
    if device.type == "cpu" and not cfg.train.compile:
        from nmt.model import fast

        fast.install_for_training(model)
    return model


def _check_same_model(saved_model: dict, cfg: Config, path: str, saved_data: dict | None = None) -> None:
    """UserError when `cfg`'s model or tokenizer settings (`saved_data`: the checkpoint's data section) are
    not the checkpoint's: a resumed run keeps both."""
    new = to_dict(cfg.model)
    diff = [k for k in new if saved_model.get(k) != new[k]]
    if diff:  # values shown: a default that changed since the run started (model.positions) is set back by hand
        shown = ", ".join(f"model.{k}: {saved_model.get(k)!r} in the checkpoint, {new[k]!r} now" for k in diff)
        raise UserError(f"cannot resume from {path}: the model config changed ({shown})")
    saved_tok, new_tok = (saved_data or {}).get("tokenizer") or {}, to_dict(cfg.data.tokenizer)
    diff = [k for k in new_tok if k != "threads" and k in saved_tok and saved_tok[k] != new_tok[k]]
    if diff:  # (the run goes on with its checkpoint's tokenizer, which these settings would no longer describe)
        shown = ", ".join(f"data.tokenizer.{k}: {saved_tok[k]!r} in the checkpoint, {new_tok[k]!r} now" for k in diff)
        raise UserError(f"cannot resume from {path}: the tokenizer config changed ({shown})")


def _prepare_data(cfg: Config, run_dir: str, saved: ckpt.ModelRecord | None, log: RunLogger, env: DistEnv,
                  source: ckpt.ModelRecord | None = None):
    """(tokenizer, Data, language identifier or None): rank 0 trains/loads the tokenizer and encodes
    the corpora (cache files) while the others wait; then they get the tokenizer from rank 0 and
    load the cache. The tokenizer of a resumed run is its checkpoint's, of a fine-tuning run its
    source's. Rank 0 also gets the language identifier (`_langid`); the other ranks None."""
    def on_main():
        if source is not None:
            tokenizer = source.load_tokenizer(cfg.data.tokenizer.threads)
            tokenizer.save(run_dir)
            log.info(f"new run in {run_dir}, fine-tuning {cfg.train.init_from} (step {source.step}; "
                     f"fresh: {', '.join(cfg.train.init_reset) or 'nothing'})")
        elif saved is not None:
            _check_same_model(saved.config.get("model", {}), cfg, run_dir, saved.config.get("data"))
            if saved.config.get("data") != to_dict(cfg.data) or saved.config.get("seed") != cfg.seed:
                log.info("warning: data settings or seed changed since the checkpoint: the data order will not "
                         "continue exactly")
            tokenizer = saved.load_tokenizer(cfg.data.tokenizer.threads)
            log.info(f"resuming {run_dir} from step {saved.step}")
        else:
            log.info(f"new run in {run_dir}" + (f" ({env.world_size} processes)" if env.distributed else ""))
            tokenizer = build_tokenizer(cfg, run_dir, log.info)
        save_config(cfg, os.path.join(run_dir, "config.yaml"))
        data = load_data(cfg, tokenizer, run_dir, log.info)
        return tokenizer, data, _langid(cfg, tokenizer, saved, log)

    prepared = dist.main_first(env, on_main)
    proto = env.broadcast(prepared[0].to_bytes() if env.is_main else None)
    dist.check_shared_file(env, os.path.join(run_dir, "config.yaml"))
    if env.is_main:
        return prepared
    tokenizer = Tokenizer.from_bytes(proto, threads=cfg.data.tokenizer.threads)
    return tokenizer, load_data(cfg, tokenizer, run_dir, lambda msg: None), None


def _langid(cfg: Config, tokenizer: TokenizerLike, saved: ckpt.ModelRecord | None, log: RunLogger) -> LanguageIdentifier | None:
    """The run's language identifier when it wants one (`nmt.text.langid.wanted`): a resumed run's from its
    checkpoint, else trained on the training corpora (and logged)."""
    if not langid.wanted(cfg, tokenizer):
        return None
    if saved is not None and saved.langid is not None:
        return LanguageIdentifier.from_dict(saved.langid)
    t0 = time.perf_counter()
    ident = langid.for_run(cfg)
    log.info(f"language identifier: {', '.join(ident.langs)} ({len(ident.index):,} character n-grams, trained in "
             f"{time.perf_counter() - t0:.1f} s on the training corpora)")
    return ident


def _loss_fn(cfg: Config) -> Callable | None:
    """train_step's loss: the compiled formula with train.compile (static shapes with data.length_buckets),
    chunked with train.loss_chunk, else None (label_smoothed_nll)."""
    t = cfg.train
    if t.compile:
        return compiled_smoothed_nll(shapes=len(cfg.data.length_buckets))
    return functools.partial(label_smoothed_nll, chunk=t.loss_chunk) if t.loss_chunk else None


def _restore(saved: ckpt.ModelRecord, model, optimizer, scheduler, precision: Precision, cfg: Config, env: DistEnv,
             log: RunLogger) -> TrainState:
    """Load the training state of `saved` (latest.pt) into this rank; returns the counters."""
    ts = saved.train_state
    model.load_state_dict(ts.get("raw_model", saved.model))  # with train.ema_decay, `model` is the average
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
