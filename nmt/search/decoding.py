"""The step protocol the searches decode through, and the token-by-token loop of greedy search and
sampling (nmt/search/__init__.py's docstring has the conventions).

The searches see only `model.encode`, `model.init_cache`, `model.decode_step`, `cache.reorder`,
`model.max_positions` and, for the uncached path, `model.decode`. Rows are laid out sentence-major
(`row = sentence * per_sentence + k`), and a row leaves the batch as soon as it is finished, so the
work shrinks as decoding goes on.

Shapes: B sentences, S source length, V target vocabulary, R rows, N active rows, t the current
step (1-based).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import Tensor

from nmt.search.cache import source_groups
from nmt.errors import Cancelled
from nmt.search.rules import StepRules
from nmt.search.options import (NO_INPUTS, PLAIN_OPS, Cancel, Final, Hypothesis, SearchInputs, SearchOps,
                                SearchOptions, max_output_lengths, room_for_terms)

Choose = Callable[[Tensor, int, Tensor], Tensor]  # (logp [N,V], t, rows [N]) -> the tokens [N] of step t


class _CachedDecoder:
    """Incremental decoding through the model's DecoderCache: one position per step."""

    def __init__(self, model, memory: Tensor, src_mask: Tensor, max_len: int, ops: SearchOps):
        self.model, self.steps = model, ops.steps
        self.cache = model.init_cache(memory, src_mask, max_len, cache_cls=ops.cache_cls)

    def step(self, tokens: Tensor) -> Tensor:
        """tokens [R] (position t-1) -> logits [R,V] for token t (with `SearchOps.steps`, in a joined step)."""
        if self.steps is not None:
            return self.steps.step(self.model, self.cache, tokens)
        return self.model.decode_step(tokens, self.cache)

    def reorder(self, indices: Tensor, sources: Tensor | None, group: int) -> None:
        """Row i becomes old row indices[i] [R'] (beam reordering, expansion, dropping sentences); the
        new rows come in runs of `group` rows of one source, sources [N'] the old sources kept (None:
        the same ones). The search knows its layout, so nothing is read back from the device."""
        self.cache.reorder(indices, sources, group)


class _UncachedDecoder:
    """Same protocol without a cache: keeps the prefix and re-runs `model.decode` on it every
    step, taking the last position (reference path for tests and benchmarks)."""

    def __init__(self, model, memory: Tensor, src_mask: Tensor, max_len: int, ops: SearchOps):
        self.model, self.memory, self.src_mask = model, memory, src_mask
        self.prefix = torch.empty(memory.shape[0], 0, dtype=torch.long, device=memory.device)  # [R, t-1]

    def step(self, tokens: Tensor) -> Tensor:
        self.prefix = torch.cat([self.prefix, tokens[:, None]], dim=1)  # [R, t]
        return self.model.decode(self.prefix, self.memory, self.src_mask)[:, -1]  # [R, V]

    def reorder(self, indices: Tensor, sources: Tensor | None, group: int) -> None:
        self.memory = self.memory.index_select(0, indices)
        self.src_mask = self.src_mask.index_select(0, indices)
        self.prefix = self.prefix.index_select(0, indices)


CONTRAST_FLOOR = 1e-9  # a token the contrast languages outweigh keeps this share of its probability


def contrast(logits: Tensor, others: Sequence[Tensor], weight: float) -> Tensor:
    """Language-contrastive decoding's step distribution (Sennrich et al., 2024): logits [R,V] given the
    target language and `others` (each [R,V]) given the contrast languages -> log(max(p - weight *
    sum(q), 1e-9 * p)) [R,V] fp32 (p, q their softmaxes; the search's rules renormalise it). The floor
    keeps every token the model allows possible (forced prefixes, placeholders and terms), ranked below
    every token with a positive difference."""
    p = torch.softmax(logits.float(), dim=-1)
    q = sum(torch.softmax(o.float(), dim=-1) for o in others)
    return torch.maximum(p - weight * q, CONTRAST_FLOOR * p).log()


class _ContrastDecoder:
    """One decoder over 1 + C stacked groups of the same rows: the search's and one per contrast language,
    whose input has that language's token in place of the target language's. One forward pass per step;
    step 1 gives the first group's logits (the language token is forced), later steps `contrast` of the
    groups. Row r of group g is row g * N + r of the inner decoder."""

    def __init__(self, inner, rows: int, tokens: Sequence[int], weight: float):
        self.inner, self.n, self.tokens, self.weight, self.t = inner, rows, tokens, weight, 0
        self.n_src = rows  # sources of each group (one per row at first)

    def step(self, tokens: Tensor) -> Tensor:
        self.t += 1
        inputs = [tokens] + [torch.full_like(tokens, c) if self.t == 2 else tokens for c in self.tokens]
        logits, *others = self.inner.step(torch.cat(inputs)).split(self.n)
        return logits if self.t == 1 else contrast(logits, others, self.weight)

    def reorder(self, indices: Tensor, sources: Tensor | None, group: int) -> None:
        groups = range(len(self.tokens) + 1)
        if sources is not None:
            sources = torch.cat([sources + g * self.n_src for g in groups])
            self.n_src = sources.shape[0] // len(groups)
        self.inner.reorder(torch.cat([indices + g * self.n for g in groups]), sources, group)
        self.n = indices.shape[0]


def start(model, src: Tensor, src_mask: Tensor, options: SearchOptions, ops: SearchOps,
          inputs: SearchInputs = NO_INPUTS, needed: Sequence[int] | None = None):
    """Encode and set up decoding. -> (decoder over B rows, max output lengths [B] long). The limits
    come from the sources' lengths and prefixes; needed: per
    sentence the room its terms need (`StepRules.needed`), which raises its limit."""
    limits = max_output_lengths(src_mask.sum(dim=1), options.max_len_a, options.max_len_b, model.max_positions,
                                inputs.prefixes)
    if needed is not None:
        limits = room_for_terms(limits, needed, model.max_positions)
    max_lens = torch.tensor(limits, dtype=torch.long, device=src.device)  # [B]
    memory = model.encode(src, src_mask)  # [B,S,D]
    cls = (ops.decoder_cls or _CachedDecoder) if options.use_cache else _UncachedDecoder
    if not options.contrast_tokens:
        return cls(model, memory, src_mask, max(limits), ops), max_lens
    groups = len(options.contrast_tokens) + 1  # the contrast languages' rows stacked after the search's
    inner = cls(model, memory.repeat(groups, 1, 1), src_mask.repeat(groups, 1), max(limits), ops)
    return _ContrastDecoder(inner, src.shape[0], options.contrast_tokens, options.contrast_weight), max_lens


def check_cancel(cancel: Cancel | None) -> None:
    """Raise nmt.errors.Cancelled when `cancel()` says so (before every decoding step)."""
    if cancel is not None and cancel():
        raise Cancelled()


@torch.inference_mode()
def greedy_search(model, src: Tensor, src_mask: Tensor, options: SearchOptions, inputs: SearchInputs = NO_INPUTS,
                  *, ops: SearchOps = PLAIN_OPS, cancel: Cancel | None = None,
                  on_final: Final | None = None) -> list[list[Hypothesis]]:
    """Most probable next token at every step. src, src_mask [B,S] -> per sentence [its Hypothesis]
    (score == log_prob: no length penalty). Finished sentences leave the batch. cancel: see `Cancel`;
    on_final: see `Final`."""
    rules = StepRules(options, inputs, src.shape[0], src.device)
    return token_by_token(model, src, src_mask, options, inputs, rules, None, 1, ops, cancel, on_final)


def token_by_token(model, src: Tensor, src_mask: Tensor, options: SearchOptions, inputs: SearchInputs,
                   rules: StepRules, choose: Choose | None, per_sentence: int, ops: SearchOps,
                   cancel: Cancel | None = None, on_final: Final | None = None) -> list[list[Hypothesis]]:
    """One token per row per step: the best one (choose None) or choose(logp, t, rows) -> tokens.
    per_sentence rows per sentence (samples). Finished rows leave the batch. -> per sentence its rows'
    hypotheses, in row order. cancel: see `Cancel`. One host read per step: which rows ended (and with
    on_final, see `Final`, the tokens of the sentences that ended, on the steps where some did)."""
    B, device = src.shape[0], src.device
    if B == 0:
        return []
    decoder, max_lens = start(model, src, src_mask, options, ops, inputs, rules.needed)
    R, T = B * per_sentence, int(max_lens.max())
    layout = _Layout(R, per_sentence)
    if per_sentence > 1:
        decoder.reorder(torch.arange(B, device=device).repeat_interleave(per_sentence), None, per_sentence)
        max_lens = max_lens.repeat_interleave(per_sentence)
    EOS = rules.specials.eos
    rows = torch.arange(R, device=device)  # [N] original row of each active row (sentence * per_sentence + k)
    tokens = torch.full((R,), rules.specials.start, dtype=torch.long, device=device)  # [N] input of this step
    log_prob = torch.zeros(R, device=device)  # [N]
    out = torch.zeros(R, T, dtype=torch.long, device=device)  # [R, T] each original row's tokens
    final = torch.zeros(R, device=device)  # [R] each original row's log_prob when it ended
    for t in range(1, T + 1):
        check_cancel(cancel)
        logits = decoder.step(tokens)  # [N,V]
        if t == 1:
            rules.start(rows // per_sentence, logits.shape[1], max_lens)
        logp = rules.log_probs(logits, t)  # [N,V]
        if choose is None:
            best, tokens = ops.argmax(logp)  # [N], [N]
        else:
            tokens = choose(logp, t, rows)
            best = logp.gather(1, tokens[:, None]).squeeze(1)
        rules.advance(tokens)
        log_prob = log_prob + best
        out.select(1, t - 1).index_copy_(0, rows, tokens)
        final.index_copy_(0, rows, log_prob)
        ends = (tokens == EOS) | (max_lens <= t)  # [N]
        ended = ends.tolist()  # the step's one host read
        if not any(ended):
            continue
        kept = layout.end(ended, t)
        if on_final is not None and layout.done:
            layout.deliver(out, final, EOS, on_final)
        if not kept:
            break
        keep = torch.nonzero_static(~ends, size=len(kept)).squeeze(1)  # [N'] (no host read: N' is known)
        decoder.reorder(keep, *layout.sources(keep, kept))
        rules.reorder(keep)
        rows, tokens, log_prob, max_lens = (x.index_select(0, keep) for x in (rows, tokens, log_prob, max_lens))
    hyps = layout.hypotheses(out.tolist(), final.tolist(), EOS)
    if on_final is not None:
        for b in layout.undelivered():
            on_final(b, hyps[b])
    return hyps


class _Layout:
    """The host's record of a token-by-token search's rows: which original row each active row is, the
    step each original row ended at, and how the active rows map to the decoder's sources (runs of
    `group` rows of one source, as the cache keeps them; nmt/search/cache.py's `source_groups`)."""

    def __init__(self, R: int, per_sentence: int):
        self.active = list(range(R))  # original row of each active row
        self.ended_at = [0] * R
        self.per_sentence = per_sentence
        self.source_of = [r // per_sentence for r in range(R)]  # each active row's source in the decoder
        self.left = [per_sentence] * (R // per_sentence)  # rows of each sentence still active
        self.done: list[int] = []  # the sentences whose last row ended at the latest step
        self.delivered = [False] * (R // per_sentence)

    def end(self, ended: list[bool], t: int) -> list[int]:
        """Rows `ended` ended at step t -> the active rows kept (their positions)."""
        self.done = []
        for r, e in zip(self.active, ended):
            if e:
                self.ended_at[r] = t
                b = r // self.per_sentence
                self.left[b] -= 1
                if not self.left[b]:
                    self.done.append(b)
        kept = [i for i, e in enumerate(ended) if not e]
        self.active = [self.active[i] for i in kept]
        return kept

    def sources(self, keep: Tensor, kept: list[int]) -> tuple[Tensor | None, int]:
        """(the decoder's sources kept [N'] or None, rows per source) once rows `kept` stay."""
        if self.per_sentence == 1:  # one source per row: the rows kept are the sources kept
            return keep, 1
        sources, group = source_groups([self.source_of[i] for i in kept])
        self.source_of = [i // group for i in range(len(kept))]
        return torch.tensor(sources, dtype=torch.long).to(keep.device, non_blocking=True), group

    def hypotheses(self, out: list[list[int]], final: list[float], eos: int) -> list[list[Hypothesis]]:
        """Per sentence its rows' hypotheses (out: each original row's tokens, final: its log_prob)."""
        hyps = [self._hypothesis(r, toks, lp, eos) for r, (toks, lp) in enumerate(zip(out, final))]
        S = self.per_sentence
        return [hyps[b * S:(b + 1) * S] for b in range(len(hyps) // S)]

    def _hypothesis(self, r: int, toks: list[int], lp: float, eos: int) -> Hypothesis:
        toks = toks[: self.ended_at[r]]
        finished = toks[-1] == eos
        return Hypothesis(toks[:-1] if finished else toks, lp, lp, finished)

    def deliver(self, out: Tensor, final: Tensor, eos: int, on_final: Final) -> None:
        """on_final for the sentences `done` at the latest step: their rows read from out [R,T] and final [R]
        (one host read each), as `hypotheses` builds them."""
        S = self.per_sentence
        rows = [b * S + k for b in self.done for k in range(S)]
        idx = torch.tensor(rows, dtype=torch.long).to(out.device, non_blocking=True)
        T = max(self.ended_at[r] for r in rows)
        toks, lps = out.index_select(0, idx)[:, :T].tolist(), final.index_select(0, idx).tolist()
        for i, b in enumerate(self.done):
            self.delivered[b] = True
            on_final(b, [self._hypothesis(rows[i * S + k], toks[i * S + k], lps[i * S + k], eos) for k in range(S)])

    def undelivered(self) -> list[int]:
        return [b for b, d in enumerate(self.delivered) if not d]
