"""Self-contained checkpoints: the record, atomic save, safe load, inference loading, averaging.

A checkpoint is `torch.save` of one dict (loaded with `weights_only=True`, so a file cannot run
code). This module is the one that builds it (`record`, `ModelRecord.with_tokenizer`) and reads it
(`read_record`, `load_record`: a typed `ModelRecord`, whose `load_config` / `load_tokenizer` give a
Config and a tokenizer); every other module calls them. Its keys, in
the order written (`KEYS`; tests/test_checkpoint.py compares this list with the keys that
`nmt train`, `nmt import`, `nmt tune` and `nmt average` write):

    format         "nmt-checkpoint"
    version        1
    model          state_dict of the unwrapped model (no DDP `module.` / compile `_orig_mod.` prefixes;
                   with train.ema_decay, the moving average)
    config         `nmt.config.to_dict(cfg)`, the resolved config
    tokenizer      `to_bytes()` of the tokenizer: nmt's SentencePiece model(s), or an imported one's
                   {kind, files, settings, languages, default_tgt_lang}
    vocab          {"src": V_src, "tgt": V_tgt}, the tokenizer's vocabulary sizes
    step           optimizer updates done (0 for an imported model)
    epoch          the epoch trained (0 for an imported model)
    langid         (optional) the run's language identifier, `nmt.text.langid.LanguageIdentifier.to_dict()`
    train_state    (training checkpoints only; not in averaged or imported ones): optimizer, scheduler,
                   scaler (or None), rng (rank 0's python, numpy, torch, cuda states), rng_ranks (every
                   rank's, when distributed), raw_model and ema {updates} (train.ema_decay), and the
                   fields of `nmt.training.trainer.TrainState` (batch_offset, best, bad_validations, nan_steps,
                   elapsed, valid_history, ...)
    imported_from  (nmt import) {"source", "family", "tokenizer"}
    averaged_from  (nmt average) the absolute paths of the averaged checkpoints
    tuned          (nmt tune, train.tune_decode) the decode settings chosen: {"settings", "metric",
                   "score", "dev", "lines", "seconds", "tgt_lang", "table"}

Writes go through `nmt.textio.atomic_file` (a temporary file in the same directory, fsync'ed and
renamed over the target), so a crash or `kill -9` at any moment leaves either the old or the new
file, never a truncated one.
"""

from __future__ import annotations

import dataclasses
import os
import random
from typing import Any

import numpy as np
import torch
from torch import nn

from nmt.config import Config, config_from_dict, to_dict
from nmt.errors import UserError
from nmt.text.languages import TargetLanguages, stored_target_languages
from nmt.text.tokenizer import Tokenizer
from nmt.text.tokens import TokenizerLike
from nmt.textio import atomic_file, link_file

FORMAT = "nmt-checkpoint"
VERSION = 1
ZIP_MAGIC = b"PK\x03\x04"  # torch.save's zip format
TEMP_PREFIX = ".tmp-"  # files being written; never checkpoints (`remove_temporaries` deletes stale ones)


# --------------------------------------------------------------------------- the record

@dataclasses.dataclass(frozen=True)
class ModelRecord:
    """A checkpoint's entries, typed (the module docstring says what each holds): what `read_record`
    gives every reader and `record` every writer; `save_checkpoint` writes `to_dict()`. An absent
    optional entry is None; `others` keeps entries this version does not know, written back as read."""

    model: dict
    config: dict
    tokenizer: dict
    vocab: dict
    step: int | None = None
    epoch: int | None = None
    langid: dict | None = None
    train_state: dict | None = None
    imported_from: dict | None = None
    averaged_from: list | None = None
    tuned: dict | None = None
    others: dict = dataclasses.field(default_factory=dict)

    @property
    def languages(self) -> TargetLanguages:
        """What the model translates into (nmt/text/languages.py)."""
        return stored_target_languages(self.tokenizer, self.config)

    def load_config(self) -> Config:
        """The stored config, checked as a trained model's (ConfigError when it breaks today's rules)."""
        return config_from_dict(self.config, check_files=False, training=False)

    def load_tokenizer(self, threads: int = 1) -> TokenizerLike:
        """The stored tokenizer: nmt's SentencePiece models or an imported one (`Tokenizer.from_bytes`)."""
        return Tokenizer.from_bytes(self.tokenizer, threads=threads)

    def with_tokenizer(self, tokenizer: TokenizerLike, model: dict | None = None) -> ModelRecord:
        """This record with another tokenizer (its `tokenizer` and `vocab` entries) and, given, other weights."""
        return dataclasses.replace(self, model=self.model if model is None else model, **tokenizer_entries(tokenizer))

    def to_dict(self) -> dict:
        """The entries to save, in the order of `KEYS` (None ones left out), then `others`."""
        entries = {k: getattr(self, k) for k in ENTRIES if getattr(self, k) is not None}
        return {**entries, **self.others}


ENTRIES = tuple(f.name for f in dataclasses.fields(ModelRecord) if f.name != "others")
KEYS = ("format", "version") + ENTRIES  # every key nmt writes, in order (the module docstring lists them)
REQUIRED = tuple(f.name for f in dataclasses.fields(ModelRecord) if f.default is dataclasses.MISSING
                 and f.default_factory is dataclasses.MISSING)  # model, config, tokenizer, vocab


def tokenizer_entries(tokenizer) -> dict:
    """The record's `tokenizer` and `vocab` entries for a tokenizer (nmt's or an imported one)."""
    return {"tokenizer": tokenizer.to_bytes(), "vocab": {"src": tokenizer.src_vocab_size,
                                                         "tgt": tokenizer.tgt_vocab_size}}


def record(model_state: dict, tokenizer, cfg, *, step: int = 0, epoch: int = 0, langid: dict | None = None,
           **extra: Any) -> ModelRecord:
    """The record of a model: its weights (a state dict), its resolved Config, its tokenizer
    (`tokenizer_entries`), the counters, its language identifier (`to_dict()`, or None) and `extra`
    entries (train_state, imported_from, ...: another name is a TypeError)."""
    return ModelRecord(model=model_state, config=to_dict(cfg), **tokenizer_entries(tokenizer), step=step,
                       epoch=epoch, langid=langid, **extra)


def read_record(state: dict) -> ModelRecord:
    """The typed view of a checkpoint dict (as `load_checkpoint` returns it; no tensor is copied)."""
    known = {k: state[k] for k in ENTRIES if k in state}
    return ModelRecord(**known, others={k: v for k, v in state.items() if k not in KEYS})


def load_record(path: str, *, mmap: bool = True) -> ModelRecord:
    """`read_record` of the checkpoint at `path` (`load_checkpoint`'s checks; mapped by default: a
    tensor is read from disk only when used)."""
    return read_record(load_checkpoint(path, mmap=mmap))


# --------------------------------------------------------------------------- files

def save_checkpoint(state: ModelRecord | dict, path: str) -> None:
    """Write a record (or a dict, as it is) to `path` through `textio.atomic_file` (temporary file
    `.tmp-*.pt.tmp` in the same directory, fsync, rename; a device such as /dev/null is written
    directly). An OSError names `path`."""
    entries = state.to_dict() if isinstance(state, ModelRecord) else state
    with atomic_file(path, fsync=True, prefix=TEMP_PREFIX, suffix=".pt.tmp") as f:
        try:
            torch.save({"format": FORMAT, "version": VERSION, **entries}, f)
        except RuntimeError as e:  # torch's zip writer reports a failed write (disk full) as RuntimeError
            cause = _os_error_in(e)
            if cause is None:
                raise
            raise cause from None


def _os_error_in(e: BaseException) -> OSError | None:
    """The OSError among an exception's causes and contexts, if any."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, OSError):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def link_checkpoint(src: str, dst: str) -> None:
    """Make `dst` hold the same content as the finished file `src`, atomically (`textio.link_file`:
    a hard link where the file system allows it, else a copy; either way via a temporary name)."""
    link_file(src, dst, temp=f"{TEMP_PREFIX}link-{os.getpid()}-{os.path.basename(dst)}.tmp")


def remove_temporaries(directory: str) -> int:
    """Delete the temporary files a killed writer left in `directory`; returns how many.
    Call only while no other process writes there (nmt train holds the run directory's lock)."""
    n = 0
    if os.path.isdir(directory):
        for name in os.listdir(directory):
            if name.startswith(TEMP_PREFIX):
                os.unlink(os.path.join(directory, name))
                n += 1
    return n



def load_checkpoint(path: str, map_location: str | torch.device = "cpu", mmap: bool = False) -> dict:
    """Read a checkpoint written by `save_checkpoint`; UserError naming `path` otherwise.
    mmap: map the file instead of reading it, so tensors that are never used (the optimizer
    state, for inference) are never read from disk."""
    if os.path.isdir(path):
        raise UserError(f"{path} is a directory, not a checkpoint file")
    if not os.path.isfile(path):
        raise UserError(f"checkpoint not found: {path}")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != ZIP_MAGIC:  # torch.save writes a zip archive; anything else is not ours
        what = "an empty file" if not magic else "not a PyTorch checkpoint file"
        raise UserError(f"cannot read checkpoint {path}: {what} (nmt checkpoints are written by nmt train or nmt average)")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as e:  # torch raises RuntimeError, pickle errors, EOFError, KeyError...
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"cannot read checkpoint {path}: not an nmt checkpoint or corrupt ({reason})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise UserError(f"{path} is not an nmt checkpoint")
    if state.get("version", 0) > VERSION:
        raise UserError(f"{path} was written by a newer nmt (checkpoint version {state['version']} > {VERSION})")
    missing = [k for k in REQUIRED if k not in state]
    if missing:
        raise UserError(f"{path} is an incomplete nmt checkpoint (no {', '.join(missing)})")
    return state


def unwrap(model: nn.Module) -> nn.Module:
    """The plain model inside DDP (`.module`) and torch.compile (`._orig_mod`) wrappers."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        else:
            return model


# --------------------------------------------------------------------------- RNG

def rng_state() -> dict:
    """The process-wide RNG states (python, numpy, torch CPU, every CUDA device)."""
    np_state = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": (np_state[0], np_state[1].tolist(), *np_state[2:]),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict) -> None:
    """Restore what `rng_state` returned (CUDA states only where devices exist)."""
    random.setstate(_as_tuple(state["python"]))
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), *rest))
    torch.set_rng_state(state["torch"].cpu())
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]][: torch.cuda.device_count()])


def _as_tuple(x: Any) -> Any:
    return tuple(_as_tuple(v) for v in x) if isinstance(x, (list, tuple)) else x


# --------------------------------------------------------------------------- inference

def build_model_from_checkpoint(rec: ModelRecord, path: str) -> tuple[nn.Module, Any, Any]:
    """(model in train mode on CPU, tokenizer, Config) from a checkpoint's record."""
    from nmt.config import ConfigError
    from nmt.model.transformer import Transformer

    try:
        cfg, tokenizer = rec.load_config(), rec.load_tokenizer()
        model = Transformer(cfg.model, rec.vocab["src"], rec.vocab["tgt"], tokenizer.specials.pad)
        model.load_state_dict(rec.model)
    except (KeyError, ConfigError, RuntimeError, ValueError) as e:
        detail = _shortened(str(e).removeprefix(f"Error(s) in loading state_dict for {Transformer.__name__}:"))
        raise UserError(f"checkpoint {path} is incomplete or does not match its config: "
                        f"{detail or type(e).__name__}") from None
    return model, tokenizer, cfg


def _shortened(text: str, limit: int = 300) -> str:
    """`text` on one line, cut to `limit` characters (load_state_dict lists every key it misses)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def load_for_inference(path: str, device: str | torch.device = "cpu") -> tuple[nn.Module, Any, Any]:
    """(model.eval() on `device`, Tokenizer, Config): everything needed to translate. UserError for weights
    that are not finite (`check_weights`)."""
    record = load_record(path)  # mapped: the optimizer state is never read
    check_weights(record, path)
    model, tokenizer, cfg = build_model_from_checkpoint(record, path)
    return model.to(device).eval(), tokenizer, cfg


def check_weights(rec: ModelRecord, path: str) -> None:
    """UserError naming the checkpoint and its tensors that hold NaN or infinite values (what import and export
    refuse: `check_finite`): such weights translate to garbage or crash the search."""
    check_finite(rec.model, f"checkpoint {path}")


# --------------------------------------------------------------------------- averaging

def check_finite(state: dict, what: str) -> None:
    """UserError (one line, starting with `what`) naming the tensors of a state dict that hold NaN or
    infinite values: such weights give no translation, and an export or import would hide the fault."""
    bad = [name for name, t in state.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise UserError(f"{what}: weights that are not finite (NaN or infinite) in {shown}: refusing them (a training "
                        "run that diverged? take an earlier checkpoint)")



def average_checkpoints(paths: list[str], out_path: str) -> ModelRecord:
    """Average the model parameters of `paths` (fairseq/Marian) into an inference checkpoint.

    Floating-point tensors are summed in float64 and divided by N; the config,
    tokenizer, vocab, counters and language identifier of the first file are kept (all
    files must have the same architecture, vocabulary and tokenizer, else UserError).
    Optimizer state is dropped: the output translates but cannot resume training. Weights that
    are not finite are refused (`check_weights`).
    Returns the written record (without the model weights).
    """
    if not paths:
        raise UserError("average: no checkpoints given")
    first = load_record(paths[0])  # only the model weights are read
    check_weights(first, paths[0])
    sums = {k: v.double() if v.is_floating_point() else v.clone() for k, v in first.model.items()}
    for path in paths[1:]:
        other = load_record(path)
        _check_same_architecture(first, paths[0], other, path)
        check_weights(other, path)
        for k, v in other.model.items():
            if v.is_floating_point():
                sums[k] += v.double()
        del other
    n, model, done = len(paths), {}, {}
    for k, s in sums.items():  # tied weights (one storage, several keys) stay one tensor
        ptr = first.model[k].data_ptr()
        if ptr not in done:
            done[ptr] = (s / n).to(first.model[k].dtype) if s.is_floating_point() else s
        model[k] = done[ptr]
    averaged = ModelRecord(model, first.config, first.tokenizer, first.vocab, step=first.step, epoch=first.epoch,
                           langid=first.langid, averaged_from=[os.path.abspath(p) for p in paths])
    save_checkpoint(averaged, out_path)
    return dataclasses.replace(averaged, model={})


def _check_same_architecture(a: ModelRecord, path_a: str, b: ModelRecord, path_b: str) -> None:
    where = f"{path_b} differs from {path_a}"
    if a.config.get("model") != b.config.get("model") or a.vocab != b.vocab:
        raise UserError(f"cannot average: {where} in architecture (model config or vocabulary sizes)")
    if a.model.keys() != b.model.keys():
        raise UserError(f"cannot average: {where} in parameter names")
    for k, v in a.model.items():
        if v.shape != b.model[k].shape:
            raise UserError(f"cannot average: {where} in the shape of {k}")
    if a.tokenizer != b.tokenizer:
        raise UserError(f"cannot average: {where} in the tokenizer (SentencePiece model)")
