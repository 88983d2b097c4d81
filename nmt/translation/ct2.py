"""The CTranslate2 engine: a model exported by `nmt export`, behind nmt/translation/engine.py's protocol.

The text pipeline is nmt/translation/translate.py's, as for PyTorch models; this module only searches
and scores batches of ids. The one `SearchOptions` is mapped onto `translate_batch`'s arguments so
that outputs follow nmt.search exactly; what CTranslate2 cannot do the same way is refused
(`nmt.translation.engine.check_decode`, by `supports`) instead of giving other outputs:

- Length limit: `nmt.search.max_output_lengths`; one limit per call, so a batch is searched under
  its largest and the sentences that reach their own smaller limit again with it.
- `min_len`, `no_repeat_ngram`: CTranslate2's `min_decoding_length`, `no_repeat_ngram_size`.
- PAD and BOS: nmt masks them after the softmax, CTranslate2 only before; the rare sentences whose
  result holds one are translated again with both suppressed.
- Length penalty: CTranslate2 searches to the end (patience = the length limit) and returns every
  finished hypothesis; they are ranked here with nmt's formula, so the best is the same. With
  `decode.patience` > 0 both engines use CTranslate2's rule; with the gnmt penalty it is refused.
  `stopping: hf` with a length penalty is refused.
- Prefixes: CTranslate2 forces them; their own log-probability comes from `score_batch`.
- Sampling is refused (CTranslate2 draws its own random numbers).
- Protected spans: the best finished hypothesis with every placeholder exactly once is taken.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator, Sequence

from nmt.config import ConfigError, decode_config
from nmt.device import parse_device, resolve_workers
from nmt.errors import Cancelled, UserError
from nmt.interop.export_dir import read_metadata, require_ctranslate2, vocabularies
from nmt.model.precision import CT2_COMPUTE_TYPES
from nmt.text.protect import PLACEHOLDERS
from nmt.schema import max_finished
from nmt.search.options import (FEATURES, NO_INPUTS, Cancel, Final, Hypothesis, SearchInputs, SearchOptions,
                                length_penalty_factor, max_output_lengths)
from nmt.text.tokenizer import Tokenizer

NO_EARLY_EXIT = 1e-6  # a length penalty that changes no ranking but turns off CTranslate2's early exit



def resolve_ct2_device(name: str | None, ctranslate2) -> tuple[str, int]:
    """"auto"/None -> ("cuda", 0) when CTranslate2 sees a GPU, else ("cpu", 0); "cuda:N" -> ("cuda", N)."""
    kind, index = parse_device(name)
    if kind == "auto":
        return ("cuda", 0) if ctranslate2.get_cuda_device_count() > 0 else ("cpu", 0)
    if kind == "cuda" and ctranslate2.get_cuda_device_count() == 0:
        raise UserError(f"device {name!r} requested but CTranslate2 sees no CUDA device")
    return kind, index or 0


class Ct2Engine:
    """An exported model loaded in CTranslate2, with its tokenizer and decode defaults.

    model_dir: a directory written by `nmt export`. compute_type: CTranslate2's ("default": the exported
    type). intra_threads: threads per translation (0: CTranslate2's default, or cores / workers).
    workers: CTranslate2's inter_threads (None: the export's decode.workers; 0: `resolve_workers`).
    precision: a decode.precision, mapped onto compute_type (None: the export's)."""

    name = "ctranslate2"
    supports = frozenset()  # none of nmt.search.options.FEATURES (module docstring): each is refused by name
    torch_device = None

    def __init__(self, model_dir: str, device: str | None = "auto", *, compute_type: str = "default",
                 intra_threads: int = 0, workers: int | None = None, precision: str | None = None):
        ctranslate2 = self.ctranslate2 = require_ctranslate2()
        meta = read_metadata(model_dir)
        tokenizer = Tokenizer.load(model_dir)
        if tokenizer is None:
            raise UserError(f"{model_dir} has no SentencePiece model (spm.model or spm.src.model + spm.tgt.model)")
        if meta.get("languages"):  # a multilingual model's target-language tokens (nmt/text/languages.py)
            tokenizer = Tokenizer.from_bytes({**tokenizer.to_bytes(), "languages": meta["languages"],
                                              "default_tgt_lang": meta.get("default_tgt_lang")})
        self.tokenizer = tokenizer
        self.max_positions = int(meta["max_positions"])
        try:  # validated exactly like a config file's decode section
            self.decode = decode_config(meta.get("config", {}).get("decode", {}))
        except ConfigError as e:
            raise UserError(f"{model_dir}: invalid decode settings in its metadata: {'; '.join(e.errors)}") from None
        kind, index = resolve_ct2_device(device, ctranslate2)
        self.precision = precision if precision is not None else self.decode.precision
        if self.precision != "auto":
            compute_type = CT2_COMPUTE_TYPES[self.precision]
        self.workers = resolve_workers(self.decode.workers if workers is None else workers, kind, os.cpu_count() or 1)
        if self.workers > 1 and not intra_threads:
            intra_threads = max(1, (os.cpu_count() or 1) // self.workers)
        try:
            self.translator = ctranslate2.Translator(model_dir, device=kind, device_index=index, compute_type=compute_type,
                                                     intra_threads=intra_threads, inter_threads=self.workers)
        except (RuntimeError, ValueError) as e:
            raise UserError(f"CTranslate2 cannot load {model_dir}: {str(e).splitlines()[0]}") from None
        src, tgt = vocabularies(tokenizer)
        self.src_pieces, self.tgt_pieces = src, tgt
        self.tgt_ids = {piece: i for i, piece in enumerate(tgt)}
        self.specials = tokenizer.specials
        self.suppress = [[tgt[i]] for i in self.specials.never_generated]

    def check_precision(self, precision: str) -> None:
        """UserError unless `precision` is the one this engine was loaded with (compute_type is fixed)."""
        if precision != self.precision:
            raise UserError(f"--precision {precision}: the model was loaded with precision {self.precision} "
                            f"(precision is chosen when the model loads: pass it to the command or to Translator())")

    # ------------------------------------------------------------------ search

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        yield

    def search_batch(self, src_ids: Sequence[list[int]], options: SearchOptions, inputs: SearchInputs = NO_INPUTS,
                     cancel: Cancel | None = None, on_final: Final | None = None) -> list[list[Hypothesis]]:
        """Per source (ids without EOS) up to `options.nbest` hypotheses, best first, with the options mapped
        onto `translate_batch` (module docstring). A batch is searched under its largest output limit; the
        sentences whose smaller limit a hypothesis reaches are searched again with it. Of the inputs only the
        prefixes are used (placeholders are checked by `_rank`). cancel: checked before each search.
        on_final(i, hypotheses): each source's, when the batch is done (CTranslate2 returns a batch at once)."""
        prefixes = inputs.prefixes
        refused = options.features() - self.supports
        if refused:
            raise UserError(f"{FEATURES[sorted(refused)[0]]} is not supported by the ctranslate2 engine")
        _check_cancel(cancel)
        batch = list(range(len(src_ids)))
        limits = max_output_lengths([len(ids) + 1 for ids in src_ids], options.max_len_a, options.max_len_b,
                                    self.max_positions, prefixes)
        limit = max(limits)
        found = self._search_safe(src_ids, batch, limit, options, prefixes)
        again: dict[int, list[int]] = {}
        for i, h in enumerate(found):
            if limits[i] < limit and any(len(x.tokens) >= limits[i] for x in h):
                again.setdefault(limits[i], []).append(i)
        for own, members in again.items():
            _check_cancel(cancel)
            for i, h in zip(members, self._search_safe(src_ids, members, own, options, prefixes)):
                found[i] = h
        for i, h in enumerate(found if on_final is not None else ()):
            on_final(i, h)
        return found

    def _search_safe(self, src_ids: Sequence[list[int]], idx: list[int], limit: int, options: SearchOptions,
                     prefixes: Sequence[list[int]] | None) -> list[list[Hypothesis]]:
        """Search sources `idx` under one output limit; redo those that produced PAD or BOS
        (CTranslate2's log-softmax is then ours exactly; see the module docstring)."""
        pieces = [[self.src_pieces[t] for t in src_ids[i]] for i in idx]
        prefix = [[self.tgt_pieces[t] for t in prefixes[i]] for i in idx] if prefixes is not None else None
        hyps = self._search_batch(pieces, prefix, limit, options, suppress=False)
        never = self.specials.never_generated
        redo = [j for j, h in enumerate(hyps) if any(t in never for x in h for t in x.tokens)]
        if redo:
            again = self._search_batch([pieces[j] for j in redo], [prefix[j] for j in redo] if prefix else None,
                                       limit, options, suppress=True)
            for j, h in zip(redo, again):
                hyps[j] = h
        return hyps

    def _search_batch(self, pieces: list[list[str]], prefix: list[list[str]] | None, limit: int,
                      options: SearchOptions, suppress: bool) -> list[list[Hypothesis]]:
        """One `translate_batch` call (one batch): sources (pieces, no EOS) sharing the output limit."""
        K = options.beam_size
        alpha, kind = options.length_penalty, options.length_penalty_type
        ct2_alpha = 0.0 if K == 1 or kind == "none" or alpha == 0 else alpha
        if K > 1 and not ct2_alpha and (options.nbest > 1 or options.patience):  # CTranslate2 would stop when the best beam ends, nmt
            ct2_alpha = NO_EARLY_EXIT  # when the nbest-th can no longer be beaten: search to the end instead
        # with a penalty, CTranslate2 stops a sentence after beam_size * patience finished hypotheses: at
        # most K finish per step, so patience = limit never stops it early, and it returns them all;
        # decode.patience > 0 is that same rule in nmt.search (which may stop sooner, only where its
        # exact bound shows that nothing better can come)
        patience = (options.patience or float(limit)) if ct2_alpha else 1.0
        protect = options.placeholder_tokens is not None
        every = ct2_alpha or (protect and K > 1)  # all finished hypotheses, ranked here
        results = self.translator.translate_batch(
            pieces, prefix, max_batch_size=0, beam_size=K, patience=patience,
            num_hypotheses=max_finished(K, patience) if ct2_alpha else K if every else options.nbest,
            length_penalty=ct2_alpha, return_scores=True, return_end_token=True,
            max_decoding_length=limit, min_decoding_length=min(options.min_len, limit),  # CTranslate2 wants min <= max
            max_input_length=0, suppress_sequences=self.suppress if suppress else None,
            no_repeat_ngram_size=options.no_repeat_ngram)
        forced = self._prefix_log_probs(pieces, prefix, options.free_prefix) if prefix is not None else [0.0] * len(pieces)
        return [self._rank(r, options, ct2_alpha, f, src) for r, f, src in zip(results, forced, pieces)]

    def _prefix_log_probs(self, pieces: list[list[str]], prefix: list[list[str]], free: int = 0) -> list[float]:
        """The model's log-probability of each forced prefix (CTranslate2 scores only what follows it).
        free: leading prefix tokens whose log-probability counts 0 (nmt.text.languages.free_prefix)."""
        todo = [i for i, p in enumerate(prefix) if len(p) > free]
        out = [0.0] * len(pieces)
        if todo:
            scored = self.translator.score_batch([pieces[i] for i in todo], [prefix[i] for i in todo], max_batch_size=0,
                                                 max_input_length=0)
            for i, r in zip(todo, scored):
                out[i] = float(sum(list(r.log_probs)[free: len(prefix[i])]))  # the prefix tokens, not the final EOS
        return out

    def _rank(self, result, options: SearchOptions, ct2_alpha: float, prefix_log_prob: float,
              src: list[str]) -> list[Hypothesis]:
        """CTranslate2's finished hypotheses -> ours, ranked by nmt's length penalty. With --protect,
        those that copy every placeholder of the source exactly once come first (CTranslate2 cannot
        constrain its search per step, as nmt.search does: see the module docstring)."""
        hyps = []
        EOS = self.specials.eos
        tokens = [[self.tgt_ids.get(p, self.specials.unk) for p in pieces] for pieces in result.hypotheses]
        for ids, ct2_score in zip(tokens, result.scores):
            length = len(ids)  # generated tokens, EOS included when it ended with one
            log_prob = ct2_score * length ** ct2_alpha if ct2_alpha else ct2_score  # undo CTranslate2's len ** alpha
            log_prob += prefix_log_prob
            finished = bool(ids) and ids[-1] == EOS
            if finished:
                ids.pop()
            if options.beam_size == 1:
                score = log_prob  # greedy: no length penalty, as nmt.search
            else:
                score = log_prob / length_penalty_factor(length, options.length_penalty, options.length_penalty_type)
            hyps.append(Hypothesis(ids, float(score), float(log_prob), finished))
        hyps.sort(key=lambda h: -h.score)
        if options.placeholder_tokens is not None:  # decode.protect
            needed = sorted(p.lstrip("▁") for p in src if p.lstrip("▁") in PLACEHOLDERS)
            def exact(h: Hypothesis) -> bool:
                return h.finished and sorted(w for w in (self.tgt_pieces[t].lstrip("▁") for t in h.tokens)
                                             if w in PLACEHOLDERS) == needed
            hyps.sort(key=lambda h: not exact(h))  # exact ones first (stable: by score within each)
        return hyps[: options.nbest]

    def joined(self) -> None:
        """CTranslate2 runs its own batches: its calls take turns (nmt/api.py)."""
        return None

    def align_batch(self, src_ids, tgt_ids):
        raise UserError("--alignment is not supported by the ctranslate2 engine (use the checkpoint: --engine torch)")

    # ------------------------------------------------------------------ scoring

    def score_batch(self, src_ids: Sequence[list[int]], tgt_ids: Sequence[list[int]]) -> list[list[float]]:
        """Per pair the log-probability of each target token and of EOS (CTranslate2's score_batch)."""
        src = [[self.src_pieces[t] for t in ids] for ids in src_ids]
        tgt = [[self.tgt_pieces[t] for t in ids] for ids in tgt_ids]
        results = self.translator.score_batch(src, tgt, max_batch_size=0, max_input_length=0)
        return [list(r.log_probs) for r in results]


def _check_cancel(cancel: Cancel | None) -> None:
    if cancel is not None and cancel():
        raise Cancelled()
