"""Translate with a model exported by `nmt export` (CTranslate2), like `nmt translate` does with PyTorch.

Same input/output contract as nmt/translate.py (whose helpers are reused): one output line per
input line (or `nbest` lines `INDEX ||| TEXT ||| SCORE`) in input order, empty lines stay empty,
over-long sources are truncated to `max_positions - 1` tokens with one counted warning, the
input is streamed in chunks, and a progress bar shows on stderr when reading a file.

Search settings follow nmt.search exactly where CTranslate2 allows it:

- Maximum output length per sentence `min(floor(a * src_len + b), max_positions - 1)` (src_len
  with EOS), counting EOS, as CTranslate2's `max_decoding_length` does. CTranslate2 takes one
  limit per call, so a chunk is split into groups of equal limit (equal source length when
  a >= 1), and each group into nmt.translate's batches (`make_batches`: B * max(S) <=
  batch_tokens and B <= max_batch_size, the same budgets as the PyTorch path; CTranslate2's
  own `batch_type="tokens"` cannot also cap sentences), one `translate_batch` call each.
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
  both stop when the best beam ends. CTranslate2 also refills a beam slot whose candidate
  ended; nmt leaves it empty for that step. Greedy search is the same search in both.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from typing import IO, Callable, Sequence

from nmt.config import DecodeConfig
from nmt.errors import UserError
from nmt.export import read_metadata, require_ctranslate2, vocabularies
from nmt.search import Hypothesis, length_penalty_factor
from nmt.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer
from nmt.translate import (CHUNK_LINES, check_io_paths, decode_settings, make_batches, one_line, resolve_workers,
                           run_batches, stream_translations)

DEFAULT_PATIENCE = 2.0  # finished hypotheses per beam slot before CTranslate2 stops (see above)


def resolve_ct2_device(name: str | None, ctranslate2) -> tuple[str, int]:
    """"auto"/None -> ("cuda", 0) when CTranslate2 sees a GPU, else ("cpu", 0); "cuda:N" -> ("cuda", N)."""
    if name is None or name == "auto":
        return ("cuda", 0) if ctranslate2.get_cuda_device_count() > 0 else ("cpu", 0)
    kind, _, index = name.partition(":")
    if kind not in ("cpu", "cuda") or (index and not index.isdigit()):
        raise UserError(f"invalid device {name!r} (use auto, cpu, cuda or cuda:N)")
    if kind == "cuda" and ctranslate2.get_cuda_device_count() == 0:
        raise UserError(f"device {name!r} requested but CTranslate2 sees no CUDA device")
    return kind, int(index or 0)


class Ct2Translator:
    """An exported model loaded in CTranslate2, with its tokenizer and decode defaults.

    model_dir: a directory written by `nmt export`. compute_type: CTranslate2's ("default" keeps
    the exported weights' type; "int8", "float32", ...). intra_threads: threads per translation
    (0 = CTranslate2's default, or cores / workers with workers > 1). workers: batches translated
    at once (CTranslate2's inter_threads; None = the exported decode.workers; 0 = auto, see
    `resolve_workers`). patience: with a length penalty, CTranslate2 ends a sentence once
    `beam_size * patience` hypotheses are finished (see the module docstring).
    """

    def __init__(self, model_dir: str, device: str | None = "auto", *, compute_type: str = "default",
                 intra_threads: int = 0, patience: float = DEFAULT_PATIENCE, workers: int | None = None):
        ctranslate2 = require_ctranslate2()
        meta = read_metadata(model_dir)
        tokenizer = Tokenizer.load(model_dir)
        if tokenizer is None:
            raise UserError(f"{model_dir} has no SentencePiece model (spm.model or spm.src.model + spm.tgt.model)")
        self.tokenizer = tokenizer
        self.max_positions = int(meta["max_positions"])
        decode = meta.get("config", {}).get("decode", {})
        known = {f.name for f in dataclasses.fields(DecodeConfig)}
        self.decode = DecodeConfig(**{k: v for k, v in decode.items() if k in known})
        kind, index = resolve_ct2_device(device, ctranslate2)
        self.workers = resolve_workers(self.decode.workers if workers is None else workers, kind, os.cpu_count() or 1)
        if self.workers > 1 and not intra_threads:
            intra_threads = max(1, (os.cpu_count() or 1) // self.workers)
        try:
            self.translator = ctranslate2.Translator(model_dir, device=kind, device_index=index, compute_type=compute_type,
                                                     intra_threads=intra_threads, inter_threads=self.workers)
        except (RuntimeError, ValueError) as e:
            raise UserError(f"CTranslate2 cannot load {model_dir}: {str(e).splitlines()[0]}") from None
        src, tgt = vocabularies(tokenizer)
        self.src_pieces = src
        self.tgt_ids = {piece: i for i, piece in enumerate(tgt)}
        self.suppress = [[tgt[PAD_ID]], [tgt[BOS_ID]]]
        self.patience = patience
        self.n_retranslated = 0  # sentences translated again with PAD/BOS suppressed

    # ------------------------------------------------------------------ search

    def max_output_length(self, src_len: int, decode: DecodeConfig) -> int:
        """nmt.search's limit: tokens including EOS, for a source of src_len tokens (EOS included)."""
        limit = math.floor(decode.max_len_a * src_len + decode.max_len_b)
        return max(1, min(limit, max(self.max_positions - 1, 1)))

    def search(self, src_ids: Sequence[list[int]], decode: DecodeConfig,
               on_batch: Callable[[int], None] | None = None) -> list[list[Hypothesis]]:
        """Per source (ids without EOS, 1..max_positions-1 of them) up to `decode.nbest`
        hypotheses, best first; greedy when beam_size == 1. `on_batch(n)` after each batch.

        Sentences are translated without token suppression first (CTranslate2's log-softmax
        is then ours exactly); the rare ones whose result holds PAD or BOS are translated
        again with both suppressed."""
        out: list[list[Hypothesis]] = [[] for _ in src_ids]
        lengths = [len(ids) + 1 for ids in src_ids]  # with EOS, as the model sees them
        limits = [self.max_output_length(n, decode) for n in lengths]

        def one_batch(batch: list[int]) -> tuple[dict[int, list[Hypothesis]], int]:
            # CTranslate2 takes one output limit per call: the batch's largest. Sentences whose
            # own (smaller) limit a hypothesis reaches are decoded again with their exact limit,
            # grouped by limit, so no output exceeds its sentence's maximum length.
            limit = max(limits[i] for i in batch)
            hyps, n_redone = self._search_safe(src_ids, batch, limit, decode)
            found = dict(zip(batch, hyps))
            again: dict[int, list[int]] = {}
            for i, h in found.items():
                if limits[i] < limit and any(len(x.tokens) >= limits[i] for x in h):
                    again.setdefault(limits[i], []).append(i)
            for own, members in again.items():
                hyps, n = self._search_safe(src_ids, members, own, decode)
                found.update(zip(members, hyps))
                n_redone += n
            return found, n_redone

        batches = make_batches(lengths, decode.batch_tokens, decode.max_batch_size)
        with contextlib.closing(run_batches(one_batch, batches, self.workers)) as done:
            for batch, (found, n_redone) in done:
                for i, h in found.items():
                    out[i] = h
                self.n_retranslated += n_redone
                if on_batch is not None:
                    on_batch(len(batch))
        return out

    def _search_safe(self, src_ids: Sequence[list[int]], idx: list[int], limit: int,
                     decode: DecodeConfig) -> tuple[list[list[Hypothesis]], int]:
        """Search sources `idx` under one output limit; redo those that produced PAD or BOS.
        -> (hypotheses per source, number redone)."""
        pieces = [[self.src_pieces[t] for t in src_ids[i]] for i in idx]
        hyps = self._search_batch(pieces, limit, decode, suppress=False)
        redo = [j for j, h in enumerate(hyps) if any(t in (PAD_ID, BOS_ID) for x in h for t in x.tokens)]
        if redo:
            for j, h in zip(redo, self._search_batch([pieces[j] for j in redo], limit, decode, suppress=True)):
                hyps[j] = h
        return hyps, len(redo)

    def _search_batch(self, pieces: list[list[str]], limit: int, decode: DecodeConfig,
                      suppress: bool) -> list[list[Hypothesis]]:
        """One `translate_batch` call (one batch): sources (pieces, no EOS) sharing the output limit."""
        K = decode.beam_size
        alpha, kind = decode.length_penalty, decode.length_penalty_type
        ct2_alpha = 0.0 if K == 1 or kind == "none" or alpha == 0 else alpha
        patience = self.patience if ct2_alpha else 1.0
        results = self.translator.translate_batch(
            pieces, max_batch_size=0, beam_size=K, patience=patience,
            num_hypotheses=round(K * patience) if ct2_alpha else decode.nbest,
            length_penalty=ct2_alpha, return_scores=True, return_end_token=True,
            max_decoding_length=limit, min_decoding_length=min(decode.min_len, limit),  # CTranslate2 wants min <= max
            max_input_length=0, suppress_sequences=self.suppress if suppress else None)
        return [self._rank(r, decode, ct2_alpha) for r in results]

    def _rank(self, result, decode: DecodeConfig, ct2_alpha: float) -> list[Hypothesis]:
        """CTranslate2's finished hypotheses -> ours, ranked by nmt's length penalty."""
        hyps = []
        for pieces, ct2_score in zip(result.hypotheses, result.scores):
            ids = [self.tgt_ids.get(p, UNK_ID) for p in pieces]
            length = len(ids)  # generated tokens, EOS included when it ended with one
            log_prob = ct2_score * length ** ct2_alpha if ct2_alpha else ct2_score  # undo CTranslate2's len ** alpha
            if ids and ids[-1] == EOS_ID:
                ids.pop()
            if decode.beam_size == 1:
                score = log_prob  # greedy: no length penalty, as nmt.search.greedy_search
            else:
                score = log_prob / length_penalty_factor(length, decode.length_penalty, decode.length_penalty_type)
            hyps.append(Hypothesis(ids, float(score), float(log_prob)))
        hyps.sort(key=lambda h: -h.score)
        return hyps[: decode.nbest]

    # ------------------------------------------------------------------ text

    def translate_nbest(self, lines: Sequence[str], decode: DecodeConfig,
                        on_progress: Callable[[int], None] | None = None) -> tuple[list[list[tuple[str, float]]], int]:
        """Per input line `decode.nbest` (text, score) pairs, best first, and the number of
        truncated lines. Lines without tokens give ("", 0.0) without reaching the model."""
        encoded = self.tokenizer.encode_src(list(lines))
        limit = self.max_positions - 1
        n_truncated = sum(len(ids) > limit for ids in encoded)
        results: list[list[tuple[str, float]]] = [[("", 0.0)] * decode.nbest for _ in lines]
        todo = [i for i, ids in enumerate(encoded) if ids]
        if on_progress is not None and len(todo) < len(lines):
            on_progress(len(lines) - len(todo))
        nbests = self.search([encoded[i][:limit] for i in todo], decode, on_progress)
        for i, hyps in zip(todo, nbests):
            texts = self.tokenizer.decode_tgt([h.tokens for h in hyps])
            results[i] = [(one_line(t), h.score) for t, h in zip(texts, hyps)]
        return results, n_truncated

    def translate_lines(self, lines: Sequence[str], decode: DecodeConfig) -> list[str]:
        """The best translation of each line, in order."""
        decode = dataclasses.replace(decode, nbest=1)
        return [r[0][0] for r in self.translate_nbest(lines, decode)[0]]


def translate_ct2_command(model_dir: str, input: str | None, output: str | None, *, beam: int | None = None,
                          nbest: int | None = None, batch_tokens: int | None = None, device: str = "auto",
                          max_len_a: float | None = None, max_len_b: int | None = None, min_len: int | None = None,
                          length_penalty: float | None = None, batch_size: int | None = None,
                          workers: int | None = None, quiet: bool = False, stdin: IO[bytes] | None = None, stdout: IO[bytes] | None = None,
                          stderr: IO[str] | None = None, chunk_lines: int = CHUNK_LINES,
                          compute_type: str = "default", intra_threads: int = 0,
                          patience: float = DEFAULT_PATIENCE) -> int:
    """`nmt translate --engine ctranslate2 --model DIR`: like nmt.translate.translate_command
    (settings left None come from the exported checkpoint's `decode` section). Returns 0."""
    check_io_paths(input, output)
    if workers is not None and workers < 0:
        raise UserError(f"workers must be >= 0 (0 = auto), got {workers}")
    engine = Ct2Translator(model_dir, device, compute_type=compute_type, intra_threads=intra_threads,
                           patience=patience, workers=workers)
    decode = decode_settings(engine.decode, beam=beam, nbest=nbest, batch_tokens=batch_tokens, max_len_a=max_len_a,
                             max_len_b=max_len_b, min_len=min_len, length_penalty=length_penalty,
                             max_batch_size=batch_size, workers=engine.workers)
    stream_translations(lambda lines, on_batch: engine.translate_nbest(lines, decode, on_batch),
                        input, output, nbest=decode.nbest, max_positions=engine.max_positions, quiet=quiet,
                        stdin=stdin, stdout=stdout, stderr=stderr, chunk_lines=chunk_lines)
    return 0
