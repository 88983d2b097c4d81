"""Inference engines: the small interface between the text pipeline and a model, and `load_engine`.

The text pipeline (nmt/translation/translate.py, batching in nmt/translation/batching.py) talks to a
model only through this protocol, which `TorchEngine` (nmt/translation/torch_engine.py) and
`Ct2Engine` (nmt/translation/ct2.py) implement; `load_engine(path)` picks one by what `path` is.

    class Engine(Protocol):
        name: str                       "torch" or "ctranslate2"
        tokenizer: Tokenizer
        decode: DecodeConfig            the model's default search settings
        max_positions: int              longest sequence the model accepts
        torch_device: torch.device | None   a PyTorch model's device (None: the engine runs its own threads)
        workers: int | None             batches searched at once (None: decided per call, `resolve_workers`)
        precision: str                  decode.precision it was loaded with (nmt/model/precision.py)
        supports: frozenset[str]        the nmt.search.options.FEATURES it searches as nmt.search does
        def check_precision(p)           UserError unless decode.precision p can run (fixed at load)
        def running() -> ContextManager  around a run of calls: the model in eval mode
        def search_batch(src_ids, options, inputs=NO_INPUTS, cancel=None, on_final=None) -> list[list[Hypothesis]]
        def score_batch(src_ids, tgt_ids) -> list[list[float]]
        def align_batch(src_ids, tgt_ids) -> list[list[tuple[int, int]]]   (UserError where unsupported)
        def joined() -> Engine | None   the engine whose searches join the steps of those running at once in
                                        other threads (nmt/search/joining.py); None where it cannot

`src_ids` are subword ids without EOS (the engine appends it; at most max_positions - 1 each).
`search_batch` searches with the one `SearchOptions` the caller built from the decode settings and
returns per source up to `options.nbest` hypotheses, best first; `inputs` (`SearchInputs`) carry the
per-source sampling keys, prefixes and constraints (only where it `supports` "terms"). `cancel()` is
checked at every step (CTranslate2: before each call) and True raises nmt.errors.Cancelled.
`on_final(i, hypotheses)` gets each source's result once, as soon as it is final (PyTorch: when its
sentence leaves the search; CTranslate2: when the batch is done).
`score_batch`: per pair the log-probability of each target token and of EOS (teacher forcing).
`align_batch`: per pair the (source index, target index) of each target token.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, ContextManager, Protocol, Sequence

from nmt.config import DecodeConfig
from nmt.errors import UserError

ENGINES = ("auto", "torch", "ctranslate2")  # `load_engine`'s kinds: auto picks torch or ctranslate2 by the path

if TYPE_CHECKING:  # (no torch at import)
    from nmt.search.options import Cancel, Final, SearchInputs, SearchOptions


class Engine(Protocol):
    name: str
    tokenizer: object
    decode: DecodeConfig
    max_positions: int
    torch_device: object
    workers: int | None
    precision: str
    supports: frozenset[str]

    def check_precision(self, precision: str) -> None: ...

    def running(self) -> ContextManager: ...

    def search_batch(self, src_ids: Sequence[list[int]], options: SearchOptions, inputs: SearchInputs = ...,
                     cancel: Cancel | None = None, on_final: Final | None = None) -> list[list]: ...

    def score_batch(self, src_ids: Sequence[list[int]], tgt_ids: Sequence[list[int]]) -> list[list[float]]: ...

    def align_batch(self, src_ids: Sequence[list[int]], tgt_ids: Sequence[list[int]]) -> list[list[tuple[int, int]]]: ...

    def joined(self) -> Engine | None: ...


def check_decode(engine: Engine, decode: DecodeConfig) -> None:
    """UserError naming the first setting of `decode` that `engine` does not search (its `supports`)."""
    from nmt.search.options import FEATURES, features

    used = features(beam_size=decode.beam_size, length_penalty=decode.length_penalty, sampling=decode.sampling.method,
                    length_penalty_type=decode.length_penalty_type, stopping=decode.stopping, patience=decode.patience,
                    contrast=bool(decode.contrast.lang)) | ({"alignment"} if decode.alignment else set())
    refused = [f for f in FEATURES if f in used and f not in engine.supports]
    if refused:
        raise UserError(f"{FEATURES[refused[0]]} is not supported by the {engine.name} engine (translate with the "
                        "checkpoint and --engine torch)")


def load_engine(path: str, kind: str = "auto", device: str = "auto", *, workers: int | None = None,
                precision: str | None = None) -> Engine:
    """An engine for `path`: a checkpoint file (torch) or a directory written by `nmt export`
    (ctranslate2). kind "auto" picks by what `path` is. `workers` (CTranslate2: replicas,
    fixed when the model is loaded; None = the export's decode.workers). `precision`: decode.precision,
    fixed when the model loads (None = the model's own decode.precision)."""
    if kind not in ENGINES:
        raise UserError(f"engine must be one of {', '.join(ENGINES)}, got {kind!r}")
    export = os.path.isdir(path) and os.path.isfile(os.path.join(path, "model.bin"))
    if kind == "auto":
        kind = "ctranslate2" if export else "torch"
    if kind == "ctranslate2":
        from nmt.translation.ct2 import Ct2Engine  # the optional package is needed only here

        return Ct2Engine(path, device, workers=workers, precision=precision)
    if export:
        raise UserError(f"{path} is a CTranslate2 export, which the {kind} engine does not load (engine ctranslate2 "
                        "or auto does)")
    if os.path.isdir(path):
        raise UserError(f"{path} is a directory, neither a checkpoint file nor a CTranslate2 export (no model.bin)")
    if not os.path.exists(path):
        raise UserError(f"checkpoint not found: {path}")
    from nmt.translation.torch_engine import TorchEngine

    return TorchEngine.load(path, device, precision=precision)
