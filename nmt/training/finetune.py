"""Starting a new run from another run's checkpoint: `train.init_from` (fine-tuning).

A fine-tuning run is a NEW run (its own run directory, config, checkpoints) whose model
starts from the source checkpoint's weights and whose tokenizer IS the source's (the
vocabulary is part of the model). By default everything else starts fresh: optimizer
moments, learning-rate schedule, step counter, epoch and data order, best score.
`train.init_reset` lists what starts fresh; leave an item out to carry it over:

- `optimizer`: Adam's moment estimates (the new config's lr, betas, eps and weight decay
  apply all the same);
- `schedule`: the learning-rate schedule's position (it continues from the source's step,
  with the new config's schedule settings);
- `counters`: the step count (max_steps, valid_every, log_every count on from the source's
  step; epochs, the data order and the best score start fresh).

Carrying any of them over needs a training checkpoint (with `train_state`); an averaged
checkpoint (`nmt average`) holds weights only, which is all the default needs.

Rules (one-line UserErrors): the source must exist and be an nmt checkpoint file (a CTranslate2
export or another directory is named as such); its architecture keys must equal the new
config's (dropout rates may differ), and so must `data.tokenizer` (except `threads` and `add_pieces`; for a checkpoint
written by `nmt import`, whose tokenizer is used as it is: data.tokenizer left at its defaults, `joint`
as the checkpoint's); the new
run directory must not contain the source (a fine-tuning run never writes into its source's run
directory); carrying the counters over, max_steps must lie beyond the source's step.

Languages the source does not know (`data.add_languages`) and new pieces (`data.tokenizer.add_pieces`)
grow the source's tokenizer and weights before the run starts (nmt/training/grow/; its rules for corpus
languages apply to every fine-tuning run).

An imported M2M100/NLLB model puts a source-language token before every source: each corpus's src_lang
picks it (nmt/data/batches.py), and data.src_lang becomes the model's default one (what `nmt translate` uses
without --src-lang, and the exported tokenizer's `src_lang`), a language it knows or learns
(`_check_default_source_language`).

Resuming a fine-tuning run (`--resume`) continues from its own latest.pt: train.init_from is
ignored then (not read, not checked), so the source may be gone.
"""

from __future__ import annotations

import os
from typing import Callable

from nmt.model import checkpoint as ckpt
from nmt.training import grow
from nmt.config import Config, ConfigError, init_from_problem, to_dict
from nmt.errors import UserError
from nmt.text.tokens import TokenizerLike

MAY_DIFFER = frozenset({"dropout", "attention_dropout", "activation_dropout"})  # model keys fine-tuning may change
RESETS = ("optimizer", "schedule", "counters")
TOKENIZER_MAY_DIFFER = ("threads", "add_pieces")  # data.tokenizer keys a fine-tuning run may set (add_pieces: nmt/training/grow/)


def load_source(cfg: Config, run_dir: str, log: Callable[[str], None] = print) -> ckpt.ModelRecord:
    """The checkpoint of train.init_from, checked against `cfg` (module docstring), with the languages
    and pieces of data.add_languages / data.tokenizer.add_pieces added (nmt/training/grow/)."""
    path = cfg.train.init_from
    problem = init_from_problem(path)
    if problem:
        raise UserError(f"train.init_from: {problem}")
    src_dir = os.path.realpath(os.path.dirname(path))
    here = os.path.realpath(run_dir)
    if src_dir == here or src_dir.startswith(here + os.sep):
        raise UserError(f"train.init_from {path} lies inside this run's directory {run_dir}: a fine-tuning run needs "
                        "its own run directory (choose another name or output_dir)")
    record = ckpt.load_record(path)
    try:
        saved = record.load_config()
    except ConfigError as e:
        raise UserError(f"train.init_from {path}: its config does not load ({e.errors[0]})") from None
    tokenizer = record.load_tokenizer(cfg.data.tokenizer.threads)
    _check_same_settings(cfg, path, saved, tokenizer)
    kept = [r for r in RESETS if r not in cfg.train.init_reset]
    if kept and record.train_state is None:
        raise UserError(f"train.init_from {path} has no training state (an averaged checkpoint?): it cannot carry "
                        f"over {', '.join(kept)}; set train.init_reset: [optimizer, schedule, counters]")
    _check_steps_left(cfg, path, int(record.step or 0))
    if "optimizer" not in cfg.train.init_reset and (grow.check_languages(cfg, tokenizer, saved).tokens
                                                     or cfg.data.tokenizer.add_pieces):
        raise UserError(f"train.init_reset: the optimizer state of train.init_from {path} cannot be carried over "
                        "when data.add_languages / data.tokenizer.add_pieces grow the vocabulary (its moments have the "
                        "old embeddings' shape): add optimizer to train.init_reset")
    _check_default_source_language(cfg, path, tokenizer)
    record = grow.grow_source(cfg, record, log)
    if tokenizer.source_languages:  # data.src_lang is its default source language (checked above)
        record = record.with_tokenizer(record.load_tokenizer(tokenizer.threads).with_source_language(cfg.data.src_lang))
    return record


def _check_same_settings(cfg: Config, path: str, saved: Config, tokenizer: TokenizerLike) -> None:
    """The architecture (but dropout rates) and data.tokenizer (but `TOKENIZER_MAY_DIFFER`) of the source's
    config `saved` are the new config's. An imported tokenizer (nmt import) is used as it is, so
    data.tokenizer must say nothing else than the checkpoint's (its defaults, with `joint` telling whether
    source and target share one vocabulary)."""
    new, theirs = to_dict(cfg.model), to_dict(saved.model)
    diff = [f"model.{k}: {theirs.get(k)!r} in the checkpoint, {v!r} in the config" for k, v in new.items()
            if k not in MAY_DIFFER and theirs.get(k) != v]
    if diff:
        raise UserError(f"train.init_from {path}: the architecture differs from the checkpoint's "
                        f"({', '.join(diff)}); a fine-tuning run keeps the source's architecture "
                        "(only dropout rates may change)")
    mine, theirs = to_dict(cfg.data.tokenizer), to_dict(saved.data.tokenizer)
    diff = [f"data.tokenizer.{k}" for k in mine if k not in TOKENIZER_MAY_DIFFER and theirs.get(k) != mine[k]]
    if diff and tokenizer.kind != "spm":
        separate = "" if saved.data.tokenizer.joint else "; joint: false, its vocabularies are separate"
        raise UserError(f"train.init_from {path}: its tokenizer was imported from Hugging Face ({tokenizer.kind}) and "
                        f"is used as it is (nothing is trained): leave {', '.join(diff)} out of data.tokenizer (only "
                        f"threads and add_pieces may be set{separate})")
    if diff:
        raise UserError(f"train.init_from {path}: {', '.join(diff)} differ from the checkpoint's; a fine-tuning "
                        "run uses its source's tokenizer: copy the source's data.tokenizer section")


def _check_default_source_language(cfg: Config, path: str, tokenizer: TokenizerLike) -> None:
    """data.src_lang becomes an imported M2M100/NLLB tokenizer's default source language (its `src_lang`
    setting; module docstring): one-line UserErrors, before anything is grown, for a language the model
    neither knows nor learns (data.add_languages), and for M2M100 one outside transformers' fixed list
    of codes (a language nmt added, now or in an earlier run), which M2M100Tokenizer cannot take as
    src_lang."""
    code = cfg.data.src_lang
    if not tokenizer.source_languages or tokenizer.default_src_lang == code:
        return
    if code not in tokenizer.languages and code not in cfg.data.add_languages:
        raise UserError(f"data.src_lang: {code!r} is not a language of the {tokenizer.kind} model in train.init_from "
                        f"{path}: choose one of its codes, or list it in data.add_languages with a corpus in it")
    if tokenizer.kind == "m2m100" and code not in tokenizer.fixed_codes:
        raise UserError(f"data.src_lang: {code!r} is a new language, which transformers' M2M100Tokenizer cannot take as "
                        f"its src_lang (a fixed list of codes): keep data.src_lang {tokenizer.default_src_lang!r} (or "
                        f"another code the model knew) and set src_lang: {code} on the corpora in it")


def _check_steps_left(cfg: Config, path: str, source_step: int) -> None:
    """Carrying the step counter over, max_steps counts on from the source's step: at or below it,
    the run would train 0 steps (and exit 0)."""
    t = cfg.train
    if "counters" not in t.init_reset and t.max_steps and t.max_steps <= source_step:
        raise UserError(f"train.init_from {path} is at step {source_step} and train.init_reset carries the step counter "
                        f"over, so train.max_steps={t.max_steps} leaves no step to train: set max_steps to "
                        f"{source_step} + the steps to train, or reset the counters (init_reset: [..., counters])")


def apply(start: ckpt.ModelRecord, cfg: Config, model, optimizer, scheduler) -> int:
    """Load the source's weights (and what init_reset leaves out) into the fresh run's objects;
    returns the step count to start from (0 unless counters are carried over)."""
    model.load_state_dict(start.model)
    reset, ts = cfg.train.init_reset, start.train_state or {}
    if "optimizer" not in reset:
        fresh = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
        optimizer.load_state_dict(ts["optimizer"])
        for group, settings in zip(optimizer.param_groups, fresh):  # the new config's hyper-parameters
            group.update(settings)
    if "schedule" not in reset:  # the source's position, with the new config's lr and schedule
        base_lrs = list(scheduler.base_lrs)
        scheduler.load_state_dict(ts["scheduler"])
        scheduler.base_lrs = base_lrs
        for group, base, fn in zip(optimizer.param_groups, base_lrs, scheduler.lr_lambdas):
            group["lr"] = base * fn(scheduler.last_epoch)
        scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
    return int(start.step or 0) if "counters" not in reset else 0
