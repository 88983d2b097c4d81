"""Inference engines: the small interface between the text pipeline and a model, and `load_engine`.

nmt/translation/translate.py owns the one text pipeline (protect, encode, truncate, detokenize, restore
order; batching and workers: nmt/translation/batching.py; files are read and written by the commands) for `nmt translate`, `nmt evaluate`,
validation during training and `nmt.Translator`; `nmt score` (nmt/translation/score.py) batches through
nmt/translation/batching.py too. They talk to a model only through this protocol, which two engines implement: `TorchEngine` (nmt/translation/torch_engine.py:
a Transformer and nmt/search/__init__.py) and `Ct2Engine` (nmt/translation/ct2.py: a model exported with
`nmt export`). `load_engine(path)` picks one by what `path` is.

    class Engine(Protocol):
        name: str                       "torch" or "ctranslate2"
        tokenizer: Tokenizer
        decode: DecodeConfig            the model's default search settings (its config's `decode`)
        max_positions: int              longest sequence the model accepts
        torch_device: torch.device | None   a PyTorch model's device (None: the engine runs its own threads)
        workers: int | None             batches the engine searches at once (None: decided per call, `resolve_workers`)
        precision: str                  decode.precision it was loaded with (nmt/model/precision.py)
        supports: frozenset[str]        the nmt.search.options.FEATURES it searches as nmt.search does
                                        (`check_decode` refuses the others; "terms": glossary terms)
        def check_precision(p)           UserError unless calls with decode.precision p can run (fixed at load)
        def running() -> ContextManager  around a run of calls: the model in eval mode
        def search_batch(src_ids, options, inputs=NO_INPUTS, cancel=None) -> list[list[Hypothesis]]
        def score_batch(src_ids, tgt_ids) -> list[list[float]]
        def align_batch(src_ids, tgt_ids) -> list[list[tuple[int, int]]]   (UserError where unsupported)

`src_ids` are subword ids without EOS (at most max_positions - 1 each; at least one for
search_batch, possibly none for score_batch);
the engine appends EOS. `search_batch` searches with `options`, one
nmt.search.options.SearchOptions that the caller builds once from the decode settings
(`SearchOptions.from_decode(decode, engine.tokenizer)`) and both engines consume as it is (the PyTorch
engine hands it to nmt.search; CTranslate2's maps it onto `translate_batch`'s arguments), and returns
per source up to `options.nbest` hypotheses, best first (Hypothesis: tokens without BOS/EOS, score,
log_prob, finished). `inputs` (nmt.search.options.SearchInputs) carry the per-source data: `keys`
(one integer per source, the input line number) fix the (PyTorch engine's) samples with
`options.sampling`; `prefixes` (target ids per source) are forced; `constraints` (glossary terms,
only where it `supports` "terms") must appear in every output. `cancel()` (or None)
is checked at every decoding step (CTranslate2: before each of its calls, which it cannot stop) and
True raises nmt.errors.Cancelled.
`score_batch` returns per pair the log-probability of each target token and of the
final EOS under the model (teacher forcing). `align_batch` gives per pair the
(source index, target index) alignment of each target token (nmt.model.transformer.Transformer.alignment).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, ContextManager, Protocol, Sequence

from nmt.config import DecodeConfig
from nmt.errors import UserError

if TYPE_CHECKING:  # (no torch at import)
    from nmt.search.options import Cancel, SearchInputs, SearchOptions


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
                     cancel: Cancel | None = None) -> list[list]: ...

    def score_batch(self, src_ids: Sequence[list[int]], tgt_ids: Sequence[list[int]]) -> list[list[float]]: ...

    def align_batch(self, src_ids: Sequence[list[int]], tgt_ids: Sequence[list[int]]) -> list[list[tuple[int, int]]]: ...


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
    if kind == "auto":
        kind = "ctranslate2" if os.path.isdir(path) and os.path.isfile(os.path.join(path, "model.bin")) else "torch"
    if kind == "ctranslate2":
        from nmt.translation.ct2 import Ct2Engine  # the optional package is needed only here

        return Ct2Engine(path, device, workers=workers, precision=precision)
    if os.path.isdir(path):
        raise UserError(f"{path} is a directory, not a checkpoint file (a CTranslate2 export needs --engine ctranslate2)")
    if not os.path.exists(path):
        raise UserError(f"checkpoint not found: {path}")
    from nmt.translation.torch_engine import TorchEngine

    return TorchEngine.load(path, device, precision=precision)
