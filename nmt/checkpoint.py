"""Self-contained checkpoints: atomic save, safe load, inference loading, averaging.

A checkpoint is `torch.save` of one dict (loaded with `weights_only=True`, so a
file cannot run code):

    format: "nmt-checkpoint", version: 1
    model       state_dict of the unwrapped model (no DDP `module.` / compile `_orig_mod.` prefixes)
    config      `nmt.config.to_dict(cfg)`, the resolved config
    tokenizer   `Tokenizer.to_bytes()` (the SentencePiece model(s))
    vocab       {"src": V_src, "tgt": V_tgt}
    step, epoch
    langid      (optional) the run's language identifier, `nmt.langid.LanguageIdentifier.to_dict()`
    train_state (training checkpoints only; absent in averaged ones):
        optimizer, scheduler, scaler (or None), rng (python, numpy, torch, cuda),
        batch_offset (batches of `epoch` already consumed), best, bad_validations,
        nan_steps, elapsed (seconds trained)

Writes go to a temporary file in the same directory, are fsync'ed and renamed
over the target (`os.replace`), so a crash or `kill -9` at any moment leaves
either the old or the new file, never a truncated one.
"""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import torch
from torch import nn

from nmt.errors import UserError
from nmt.textio import atomic_file, link_file

FORMAT = "nmt-checkpoint"
VERSION = 1
ZIP_MAGIC = b"PK\x03\x04"  # torch.save's zip format
TEMP_PREFIX = ".tmp-"  # files being written; never checkpoints (`remove_temporaries` deletes stale ones)


# --------------------------------------------------------------------------- files

def save_checkpoint(state: dict, path: str) -> None:
    """Write `state` to `path` through `textio.atomic_file` (temporary file `.tmp-*.pt.tmp` in the same
    directory, fsync, rename; a device such as /dev/null is written directly). An OSError names `path`."""
    with atomic_file(path, fsync=True, prefix=TEMP_PREFIX, suffix=".pt.tmp") as f:
        try:
            torch.save({"format": FORMAT, "version": VERSION, **state}, f)
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
    missing = [k for k in ("model", "config", "tokenizer", "vocab") if k not in state]
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

def build_model_from_checkpoint(state: dict, path: str) -> tuple[nn.Module, Any, Any]:
    """(model in train mode on CPU, tokenizer, Config) from a loaded checkpoint dict."""
    from nmt.config import ConfigError, config_from_dict
    from nmt.model import Transformer
    from nmt.tokenizer import Tokenizer

    try:
        cfg = config_from_dict(state["config"], check_files=False, training=False)
        tokenizer = Tokenizer.from_bytes(state["tokenizer"])
        model = Transformer(cfg.model, state["vocab"]["src"], state["vocab"]["tgt"], tokenizer.specials.pad)
        model.load_state_dict(state["model"])
    except (KeyError, ConfigError, RuntimeError, ValueError) as e:
        raise UserError(f"checkpoint {path} is incomplete or does not match its config: "
                        f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    return model, tokenizer, cfg


def load_for_inference(path: str, device: str | torch.device = "cpu") -> tuple[nn.Module, Any, Any]:
    """(model.eval() on `device`, Tokenizer, Config): everything needed to translate."""
    state = load_checkpoint(path, "cpu", mmap=True)  # the optimizer state is never read
    model, tokenizer, cfg = build_model_from_checkpoint(state, path)
    return model.to(device).eval(), tokenizer, cfg


# --------------------------------------------------------------------------- averaging

def average_checkpoints(paths: list[str], out_path: str) -> dict:
    """Average the model parameters of `paths` (fairseq/Marian) into an inference checkpoint.

    Floating-point tensors are summed in float64 and divided by N; the config,
    tokenizer and vocab of the first file are kept (all files must have the same
    architecture, vocabulary and tokenizer, else UserError). Optimizer state is
    dropped: the output translates but cannot resume training. Returns the
    written dict (without the model weights).
    """
    if not paths:
        raise UserError("average: no checkpoints given")
    first = load_checkpoint(paths[0], mmap=True)  # only the model weights are read
    sums = {k: v.double() if v.is_floating_point() else v.clone() for k, v in first["model"].items()}
    for path in paths[1:]:
        state = load_checkpoint(path, mmap=True)
        _check_same_architecture(first, paths[0], state, path)
        for k, v in state["model"].items():
            if v.is_floating_point():
                sums[k] += v.double()
        del state
    n, model, done = len(paths), {}, {}
    for k, s in sums.items():  # tied weights (one storage, several keys) stay one tensor
        ptr = first["model"][k].data_ptr()
        if ptr not in done:
            done[ptr] = (s / n).to(first["model"][k].dtype) if s.is_floating_point() else s
        model[k] = done[ptr]
    meta = {k: first[k] for k in ("config", "tokenizer", "vocab", "step", "epoch", "langid") if k in first}
    meta["averaged_from"] = [os.path.abspath(p) for p in paths]
    save_checkpoint({**meta, "model": model}, out_path)
    return meta


def _check_same_architecture(a: dict, path_a: str, b: dict, path_b: str) -> None:
    where = f"{path_b} differs from {path_a}"
    if a["config"].get("model") != b["config"].get("model") or a.get("vocab") != b.get("vocab"):
        raise UserError(f"cannot average: {where} in architecture (model config or vocabulary sizes)")
    if a["model"].keys() != b["model"].keys():
        raise UserError(f"cannot average: {where} in parameter names")
    for k, v in a["model"].items():
        if v.shape != b["model"][k].shape:
            raise UserError(f"cannot average: {where} in the shape of {k}")
    if a.get("tokenizer") != b.get("tokenizer"):
        raise UserError(f"cannot average: {where} in the tokenizer (SentencePiece model)")
