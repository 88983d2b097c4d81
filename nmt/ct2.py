"""The CTranslate2 engine: a model exported by `nmt export`, behind nmt/engine.py's protocol.

The text pipeline is nmt/translate.py's, the same as for PyTorch models (batches, workers,
empty lines, truncation, order). This module only searches and scores batches of ids.
Search settings follow nmt.search exactly where CTranslate2 allows it:

- Maximum output length per sentence: `nmt.search.max_output_lengths` (EOS counted, as
  CTranslate2's `max_decoding_length` does). CTranslate2 takes one limit per call: a batch
  is searched under its largest limit, and the sentences whose own smaller limit a
  hypothesis reaches are searched again with their exact limit.
- `min_len` -> `min_decoding_length` (EOS forbidden for the first min_len steps in both;
  CTranslate2 masks before its softmax, so those steps' log-probabilities are renormalised).
- PAD and BOS are never generated. nmt masks them after its log-softmax (not renormalised);
  CTranslate2 can only mask before (`suppress_sequences`, renormalised). So sentences are
  first translated unmasked (CTranslate2's log-probabilities are then ours to float precision)
  and only the rare ones whose result contains PAD or BOS again with both suppressed.
- Length penalty: CTranslate2 divides by `length ** alpha` only at the end of the search. We ask
  it for all finished hypotheses with their ends (`return_end_token`, so a length counts EOS as
  ours does), recover each raw log-probability and rank them with our formula (gnmt, average
  or none): `score` and `log_prob` mean what they mean in nmt.search.Hypothesis.
- Stopping: with a penalty CTranslate2 ends a sentence once `beam_size * patience` hypotheses
  are finished; nmt's beam search goes on until no live beam can still win. With patience 1,
  CTranslate2 often settles for short, poor hypotheses (4% of sentences differed on a small
  post-norm model); patience 2 (`DEFAULT_PATIENCE`) gave the same outputs. Without a penalty
  both stop when the best beam ends. Both refill a beam slot whose candidate ended from
  the top 2K candidates. Greedy search is the same search in both.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator, Sequence

from nmt.config import ConfigError, DecodeConfig, decode_config
from nmt.device import parse_device, resolve_workers
from nmt.errors import UserError
from nmt.export import read_metadata, require_ctranslate2, vocabularies
from nmt.languages import free_prefix
from nmt.precision import CT2_COMPUTE_TYPES
from nmt.search import Hypothesis, length_penalty_factor, max_output_lengths
from nmt.tokenizer import Tokenizer

DEFAULT_PATIENCE = 2.0  # finished hypotheses per beam slot before CTranslate2 stops (see above)


def _unpenalised(decode: DecodeConfig) -> bool:
    """Searches without a length penalty: greedy search and sampling."""
    return decode.beam_size == 1 or decode.sampling != "none"


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

    model_dir: a directory written by `nmt export`. compute_type: CTranslate2's ("default" keeps
    the exported weights' type; "int8", "float32", ...). intra_threads: threads per translation
    (0 = CTranslate2's default, or cores / workers with workers > 1). workers: batches translated
    at once (CTranslate2's inter_threads; None = the exported decode.workers; 0 = auto, see
    `resolve_workers`). patience: with a length penalty, CTranslate2 ends a sentence once
    `beam_size * patience` hypotheses are finished (see the module docstring). precision: a
    decode.precision, mapped onto compute_type (nmt/precision.py; None: the export's decode.precision,
    whose default `auto` keeps compute_type).
    """

    name = "ctranslate2"
    torch_device = None

    def __init__(self, model_dir: str, device: str | None = "auto", *, compute_type: str = "default",
                 intra_threads: int = 0, patience: float = DEFAULT_PATIENCE, workers: int | None = None,
                 precision: str | None = None):
        ctranslate2 = self.ctranslate2 = require_ctranslate2()
        meta = read_metadata(model_dir)
        tokenizer = Tokenizer.load(model_dir)
        if tokenizer is None:
            raise UserError(f"{model_dir} has no SentencePiece model (spm.model or spm.src.model + spm.tgt.model)")
        if meta.get("languages"):  # a multilingual model's target-language tokens (nmt/languages.py)
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
        self.patience = patience

    def check_precision(self, precision: str) -> None:
        """UserError unless `precision` is the one this engine was loaded with (compute_type is fixed)."""
        if precision != self.precision:
            raise UserError(f"--precision {precision}: the model was loaded with precision {self.precision} "
                            f"(precision is chosen when the model loads: pass it to the command or to Translator())")

    # ------------------------------------------------------------------ search

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        yield

    def search_batch(self, src_ids: Sequence[list[int]], decode: DecodeConfig, keys: Sequence[int] | None = None,
                     prefixes: Sequence[list[int]] | None = None) -> list[list[Hypothesis]]:
        """Per source (ids without EOS) up to `decode.nbest` hypotheses, best first; greedy when
        beam_size == 1. CTranslate2 takes one output limit per call: the batch's largest. Sentences
        whose own (smaller) limit a hypothesis reaches are searched again with their exact limit,
        grouped by limit, so no output exceeds its sentence's maximum length. With sampling,
        `keys` are not used: CTranslate2 seeds each of its threads' generator once, from
        decode.seed (`set_random_seed` stores the seed; a thread seeds its own generator on first
        use), so a line's samples depend on the batches its thread sampled before: reproducible
        with workers 1 and the same input, not across batchings (the PyTorch engine's are)."""
        batch = list(range(len(src_ids)))
        limits = max_output_lengths([len(ids) + 1 for ids in src_ids], decode.max_len_a, decode.max_len_b,
                                    self.max_positions, prefixes)
        limit = max(limits)
        found = self._search_safe(src_ids, batch, limit, decode, prefixes)
        again: dict[int, list[int]] = {}
        for i, h in enumerate(found):
            if limits[i] < limit and any(len(x.tokens) >= limits[i] for x in h):
                again.setdefault(limits[i], []).append(i)
        for own, members in again.items():
            for i, h in zip(members, self._search_safe(src_ids, members, own, decode, prefixes)):
                found[i] = h
        return found

    def _search_safe(self, src_ids: Sequence[list[int]], idx: list[int], limit: int, decode: DecodeConfig,
                     prefixes: Sequence[list[int]] | None) -> list[list[Hypothesis]]:
        """Search sources `idx` under one output limit; redo those that produced PAD or BOS
        (CTranslate2's log-softmax is then ours exactly; see the module docstring)."""
        pieces = [[self.src_pieces[t] for t in src_ids[i]] for i in idx]
        prefix = [[self.tgt_pieces[t] for t in prefixes[i]] for i in idx] if prefixes is not None else None
        hyps = self._search_batch(pieces, prefix, limit, decode, suppress=False)
        never = self.specials.never_generated
        redo = [j for j, h in enumerate(hyps) if any(t in never for x in h for t in x.tokens)]
        if redo:
            again = self._search_batch([pieces[j] for j in redo], [prefix[j] for j in redo] if prefix else None,
                                       limit, decode, suppress=True)
            for j, h in zip(redo, again):
                hyps[j] = h
        return hyps

    def _search_batch(self, pieces: list[list[str]], prefix: list[list[str]] | None, limit: int,
                      decode: DecodeConfig, suppress: bool) -> list[list[Hypothesis]]:
        """One `translate_batch` call (one batch): sources (pieces, no EOS) sharing the output limit."""
        sampling = decode.sampling != "none"
        K = 1 if sampling else decode.beam_size
        alpha, kind = decode.length_penalty, decode.length_penalty_type
        ct2_alpha = 0.0 if K == 1 or kind == "none" or alpha == 0 else alpha
        patience = self.patience if ct2_alpha else 1.0
        options = {}
        if sampling:
            self.ctranslate2.set_random_seed(decode.seed)
            options = dict(sampling_topk=decode.topk if decode.sampling == "topk" else 0,
                           sampling_topp=decode.topp if decode.sampling == "topp" else 1.0,
                           sampling_temperature=decode.temperature)
        results = self.translator.translate_batch(
            pieces, prefix, max_batch_size=0, beam_size=K, patience=patience,
            num_hypotheses=round(K * patience) if ct2_alpha else decode.nbest,
            length_penalty=ct2_alpha, return_scores=True, return_end_token=True,
            max_decoding_length=limit, min_decoding_length=min(decode.min_len, limit),  # CTranslate2 wants min <= max
            max_input_length=0, suppress_sequences=self.suppress if suppress else None,
            no_repeat_ngram_size=decode.no_repeat_ngram, **options)
        rescore = sampling or prefix is not None  # their scores are not the model's plain log-probabilities
        free = free_prefix(self.tokenizer, prefix)
        return [self._rank(r, decode, ct2_alpha, src if rescore else None, free) for r, src in zip(results, pieces)]

    def _rank(self, result, decode: DecodeConfig, ct2_alpha: float, rescore: list[str] | None,
              free: int = 0) -> list[Hypothesis]:
        """CTranslate2's finished hypotheses -> ours, ranked by nmt's length penalty. rescore: the
        source pieces, when log_prob must be computed again by forced decoding (sampling, prefixes);
        free: leading prefix tokens whose log-probability counts 0 (nmt.languages.free_prefix)."""
        hyps = []
        EOS = self.specials.eos
        tokens = [[self.tgt_ids.get(p, self.specials.unk) for p in pieces] for pieces in result.hypotheses]
        if rescore is not None:
            forced = self.translator.score_batch([rescore] * len(tokens),
                                                 [[self.tgt_pieces[t] for t in ids if t != EOS] for ids in tokens],
                                                 max_batch_size=0, max_input_length=0)
        for k, (ids, ct2_score) in enumerate(zip(tokens, result.scores)):
            length = len(ids)  # generated tokens, EOS included when it ended with one
            log_prob = ct2_score * length ** ct2_alpha if ct2_alpha else ct2_score  # undo CTranslate2's len ** alpha
            finished = bool(ids) and ids[-1] == EOS
            if finished:
                ids.pop()
            if rescore is not None:
                log_probs = list(forced[k].log_probs)  # the target tokens, then EOS
                log_prob = sum(log_probs[free:] if finished else log_probs[free:-1])
            if _unpenalised(decode):
                score = log_prob  # greedy and sampling: no length penalty, as nmt.search
            else:
                score = log_prob / length_penalty_factor(length, decode.length_penalty, decode.length_penalty_type)
            hyps.append(Hypothesis(ids, float(score), float(log_prob), finished))
        hyps.sort(key=lambda h: -h.score)
        return hyps[: decode.nbest]

    def align_batch(self, src_ids, tgt_ids):
        raise UserError("--alignment is not supported by the ctranslate2 engine (use the checkpoint: --engine torch)")

    # ------------------------------------------------------------------ scoring

    def score_batch(self, src_ids: Sequence[list[int]], tgt_ids: Sequence[list[int]]) -> list[list[float]]:
        """Per pair the log-probability of each target token and of EOS (CTranslate2's score_batch)."""
        src = [[self.src_pieces[t] for t in ids] for ids in src_ids]
        tgt = [[self.tgt_pieces[t] for t in ids] for ids in tgt_ids]
        results = self.translator.score_batch(src, tgt, max_batch_size=0, max_input_length=0)
        return [list(r.log_probs) for r in results]
