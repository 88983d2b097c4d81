"""Batched beam search (nmt/search.py's docstring has the conventions; `beam_search` the rules).

Beam rows are laid out sentence-major (`row = sentence * k + beam`, N*k rows), and a sentence
leaves the batch as soon as it is done. One step, top to bottom: `_candidates` (the top 2K
extensions of each sentence's live beams), `_finish` (those that end in the top K join the
sentence's finished list), `_select` (the K best that do not end become the live beams), `_keep`
(which sentences go on), then `_Beams.advance` (drop the sentences that are done, reorder the
decoder's rows).

Shapes: B sentences, N active sentences, K beam size, k live beams per sentence (1 at the first
step, then K), V target vocabulary, t the current step (1-based).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt.constraints import ConstraintState, allocate
from nmt.decoding import check_cancel, start
from nmt.rules import NEG_INF, StepRules
from nmt.schema import max_finished
from nmt.search_options import (NO_INPUTS, PLAIN_OPS, Cancel, Hypothesis, SearchInputs, SearchOps, SearchOptions,
                                length_penalty_factor)


@torch.inference_mode()
def beam_search(model, src: Tensor, src_mask: Tensor, options: SearchOptions, inputs: SearchInputs = NO_INPUTS,
                *, ops: SearchOps = PLAIN_OPS, cancel: Cancel | None = None) -> list[list[Hypothesis]]:
    """Batched beam search. src, src_mask [B,S] -> per sentence up to `options.nbest` hypotheses, best first.

    Each step extends the K live beams of a sentence and ranks the K*V candidates by summed
    log-probability. Candidates in the top K that end (EOS or maximum length) go to the
    sentence's finished list, ranked by penalised score; the next live beams are the K best
    candidates that do not end, taken from the top 2K (as fairseq and CTranslate2 do: an
    ending candidate does not cost the search a live beam). Early stop: see `_stopped` (with a length penalty the search goes on
    while a live beam can still win, so even K = 1 may return a longer output than greedy
    search; with `length_penalty_type: none`, K = 1 is greedy search). At the first step after a
    forced prefix only the best candidate may end (CTranslate2's rule: a prefix that already reads
    as a whole translation would otherwise let the short hypothesis in through the lower beams);
    an EOS candidate ranked 2..K there leaves its beam slot empty.

    keep_all: every candidate that ends in the top K is kept and no sentence stops before its
    beams do (nothing is pruned by the length penalty): all its finished hypotheses are returned,
    best first. Any length penalty can then be applied afterwards, with the result the search
    would give under it: the live beams never depend on the penalty (nmt/tune.py; for a sentence with
    terms, keep its EOS-ended hypotheses first, below). (A minimum
    length cannot: it renormalises the distribution, which moves the live beams.)

    patience > 0: a sentence also stops once `max_finished(K, patience)` candidates have ended in
    its top K (counted from the start, whether or not they enter the n-best): fairseq's rule
    (patience 1) and CTranslate2's `patience` (Kasai et al., 2022). Faster with a length penalty,
    where the exact stop waits for a bound that is loose; a longer hypothesis that would have won
    can then be missed. With keep_all the count still applies (it does not depend on the penalty).
    A sentence with terms (`inputs.constraints`) stops so with patience 1 when `patience` is 0
    (`stop_counts`): fairseq's constrained search's rule. Its hypotheses that ended with EOS rank
    before those the length limit ended (best score first within each): a hypothesis at the limit is
    the length rule's fallback, which forced its missing terms into its last steps, and with a length
    penalty one that rambled on to the limit and had a term appended there can outscore one that
    placed every term and ended (BENCHMARKS.md, "Glossaries").

    stopping "hf": transformers' rule (`generate()` with `early_stopping=False`, its default) instead of
    the exact stop: each sentence keeps its K best finished hypotheses (not only nbest), and stops once
    it has K of them and its best live beam, scored with the penalty at its *current* length, does not
    beat the K-th (`_stopped`). With a length penalty that can stop before a longer hypothesis
    that would have won (transformers' heuristic); without one it is exact as the default is.
    keep_all needs the exact stop (the heuristic depends on the penalty).

    cancel: see `Cancel`.
    """
    rules = StepRules(options, inputs, src.shape[0], src.device)
    if src.shape[0] == 0:
        return []
    decoder, max_lens = start(model, src, src_mask, options, ops, inputs, rules.needed)
    beams = _Beams.start(options, max_lens, stop_counts(options, rules.needed, src.shape[0], src.device))
    for t in range(1, int(max_lens.max()) + 1):
        check_cancel(cancel)
        logits = decoder.step(beams.tokens)
        if t == 1:
            beams.terms = rules.constraint_state(beams.sent, logits.shape[1])  # None without terms
        cand = _candidates(beams, rules, logits, t, options.beam_size, ops, options.glossary_margin)
        _finish(beams, cand, t, options)
        scores, rows, word = _select(cand, options.beam_size)
        if not beams.advance(_keep(beams, scores, t, options), scores, rows, word, decoder):
            break
    return _best_first(beams.finished, rules.needed, None if options.keep_all else options.nbest)


def _best_first(finished: list[list[Hypothesis]], needed: list[int] | None, n: int | None) -> list[list[Hypothesis]]:
    """Each sentence's first n finished hypotheses (all: None) by score; a sentence with terms (`needed`
    > 0) puts those that ended with EOS before those the length limit ended (`beam_search`)."""
    terms = needed or [0] * len(finished)
    return [sorted(hyps, key=lambda h: (bool(t) and not h.finished, -h.score))[:n] for hyps, t in zip(finished, terms)]


@dataclass
class _Beams:
    """The state of a batch's beam search between two steps."""

    sent: Tensor  # [N] original index of each active sentence
    max_lens: Tensor  # [N] its maximum output length
    best_possible_lp: Tensor  # [N] the penalty at that length
    kth_best: Tensor  # [N, pool] best finished scores, sorted (-inf: none yet; keep_all: stays -inf)
    n_done: Tensor  # [N] candidates ended so far (counted with patience)
    scores: Tensor  # [N, k] summed log-prob of each live beam; -inf = empty
    tokens: Tensor  # [N*k] input of the next step
    history: Tensor  # [N*k, t-1] generated tokens
    most: Tensor  # [N] endings after which the sentence stops (`stop_counts`): 0 = the stopping rule alone
    finished: list[list[Hypothesis]]  # per original sentence, in the order they ended
    terms: ConstraintState | None = None  # [N*k rows] the live beams' constraints (None: no terms)

    @classmethod
    def start(cls, options: SearchOptions, max_lens: Tensor, most: Tensor) -> _Beams:
        B, device = max_lens.shape[0], max_lens.device
        pool = options.beam_size if options.stopping == "hf" else options.nbest  # what the stopping rule compares with
        return cls(sent=torch.arange(B, device=device), max_lens=max_lens,
                   best_possible_lp=length_penalty_factor(max_lens.float(), options.length_penalty,
                                                          options.length_penalty_type),
                   kth_best=torch.full((B, pool), NEG_INF, device=device),
                   n_done=torch.zeros(B, dtype=torch.long, device=device),
                   scores=torch.zeros(B, 1, device=device),
                   tokens=torch.full((B,), options.specials.start, dtype=torch.long, device=device),
                   history=torch.empty(B, 0, dtype=torch.long, device=device),
                   most=most, finished=[[] for _ in range(B)])

    def advance(self, keep: Tensor, scores: Tensor, rows: Tensor, word: Tensor, decoder) -> bool:
        """Continue the sentences `keep` [N] with live beams scores, rows (their parent rows), word
        [N, K]: the others leave the batch, the decoder's rows follow. -> False when none is left."""
        if not bool(keep.all()):
            if not bool(keep.any()):
                return False
            self.sent, self.max_lens, self.best_possible_lp, self.kth_best, scores, rows, word, self.n_done, \
                self.most = (x[keep] for x in (self.sent, self.max_lens, self.best_possible_lp, self.kth_best, scores,
                                               rows, word, self.n_done, self.most))
        flat = rows.reshape(-1)  # [N'*K] parent rows of the next step's beams
        decoder.reorder(flat)
        if self.terms is not None:
            self.terms.reorder(flat)
            self.terms.advance(word.reshape(-1))
        self.history = torch.cat([self.history.index_select(0, flat), word.reshape(-1, 1)], dim=1)
        self.tokens, self.scores = word.reshape(-1), scores
        return True


class _Candidates(NamedTuple):
    """The top 2K extensions of each active sentence's live beams, best first: [N, 2K] each."""

    top: Tensor  # summed log-prob (-inf: no candidate, or a slot left empty after a prefix)
    word: Tensor  # its token
    rows: Tensor  # the row of its parent beam
    alive: Tensor  # a real candidate (finite before a slot was emptied)
    ends: Tensor  # it ends: EOS, or the maximum length


def _candidates(beams: _Beams, rules: StepRules, logits: Tensor, t: int, K: int, ops: SearchOps,
                margin: float = float("inf")) -> _Candidates:
    """Rank the extensions of the live beams (logits [N*k, V] of step t) by summed log-probability
    (with terms: dynamic beam allocation, `margin` its decode.glossary_margin)."""
    N, k = beams.scores.shape  # k = 1 at the first step (all beams share the prefix BOS), then K
    device, EOS = logits.device, rules.specials.eos
    limit = beams.max_lens.repeat_interleave(k) if rules.ph_ids is not None or beams.terms is not None else None
    logp = rules.log_probs(logits, t, beams.history, beams.sent.repeat_interleave(k), limit, beams.terms)  # [N*k, V]
    V = logp.shape[1]
    cand = logp.add_(beams.scores.view(-1, 1)).view(N, k * V)  # in place: logp is fresh
    if beams.terms is None:
        top, idx = _topk(cand, 2 * K, ops)  # [N, 2K]
    else:  # dynamic beam allocation: the top 2K in the order that keeps every bank of met terms
        top, idx = allocate(beams.terms, cand, K, ops.topk, ops.argmax, margin)
    word = idx % V  # [N, 2K] token of each candidate
    rows = idx // V + (torch.arange(N, device=device) * k)[:, None]  # [N, 2K] row of its parent beam
    alive = top > NEG_INF
    ends = (word == EOS) | (beams.max_lens <= t)[:, None]  # [N, 2K]
    empty = _after_prefix(rules, beams.sent, t, word, K, EOS)  # [N, 2K] or None: EOS ranked 2..K after a prefix
    if empty is not None:
        top, ends = top.masked_fill(empty, NEG_INF), ends & ~empty  # a live slot with no hypothesis
    return _Candidates(top, word, rows, alive, ends)


def _finish(beams: _Beams, c: _Candidates, t: int, options: SearchOptions) -> None:
    """The candidates that end in the top K join their sentence's finished list (those that can still be
    in its n-best), and the stopping rule's records follow (the n-best scores, the count of endings)."""
    K = options.beam_size
    ended = c.ends & c.alive & (torch.arange(2 * K, device=c.top.device) < K)  # endings in the top K finish
    score = c.top / length_penalty_factor(t, options.length_penalty, options.length_penalty_type)  # if it ends now
    enters = ended & (score > beams.kth_best[:, -1:])  # can still be in the n-best (keep_all: kth_best stays -inf)
    if bool(enters.any()):
        _collect(beams.finished, enters, beams.sent, beams.history, c.rows, c.word, c.top, score,
                 options.specials.eos)
        if not options.keep_all:
            new = score.masked_fill(~ended, NEG_INF)
            beams.kth_best = torch.cat([beams.kth_best, new], dim=1).topk(beams.kth_best.shape[1], dim=1).values
    beams.n_done = beams.n_done + ended.sum(dim=1)


def _select(c: _Candidates, K: int) -> tuple[Tensor, Tensor, Tensor]:
    """The next live beams: the K best candidates that do not end. -> (scores, parent rows, tokens) [N, K]."""
    live = c.alive & ~c.ends  # [N, 2K]
    rank = torch.arange(2 * K, device=c.top.device)
    sel = torch.where(live, rank, rank + 2 * K).argsort(dim=1)[:, :K]  # [N, K] the K best live candidates
    scores = c.top.gather(1, sel).masked_fill(~live.gather(1, sel), NEG_INF)  # [N, K] live beams; -inf = empty
    return scores, c.rows.gather(1, sel), c.word.gather(1, sel)


def _keep(beams: _Beams, scores: Tensor, t: int, options: SearchOptions) -> Tensor:
    """Which sentences go on [N]: the stopping rule (`_stopped`) and, with patience, the count."""
    if options.stopping == "hf":
        keep = ~_stopped(scores, beams.kth_best,
                         length_penalty_factor(t, options.length_penalty, options.length_penalty_type))
    else:
        keep = ~_stopped(scores, beams.kth_best, beams.best_possible_lp)  # keep_all: stops only with no live beam
    return keep & ((beams.most == 0) | (beams.n_done < beams.most))


def stop_counts(options: SearchOptions, needed: list[int] | None, B: int, device) -> Tensor:
    """[B] the endings after which each sentence stops (0: the stopping rule alone):
    `max_finished(K, patience)`, and for a sentence with terms K (patience 1) when patience is 0.
    needed: `StepRules.needed` (per sentence the room its terms need, 0 without terms; None: no terms).

    Why the terms change the default: their search cannot end a hypothesis before it holds every term,
    and with a length penalty the exact stop's bound stays loose, so it searches on to the length
    limit, where the length rule forces the missing terms in at the end, and such rambling
    hypotheses, long enough to be favoured by the penalty, beat the ones that took the terms in early
    and ended (BENCHMARKS.md, "Glossaries": 108 of 500 Bible outputs reached the limit, 12 with
    this rule). fairseq's constrained search and Sockeye's stop at K finished hypotheses too."""
    plain = max_finished(options.beam_size, options.patience)
    with_terms = max_finished(options.beam_size, 1.0) if options.patience == 0 else plain
    return torch.tensor([with_terms if n else plain for n in needed or [0] * B], dtype=torch.long, device=device)


def _after_prefix(rules: StepRules, sent: Tensor, t: int, word: Tensor, K: int, eos: int) -> Tensor | None:
    """[N, 2K]: the EOS candidates ranked 2..K at the first step after a sentence's forced prefix
    (they leave their beam slot empty: CTranslate2's rule), or None when no sentence is at that step."""
    if rules.prefix is None or t > rules.longest_prefix + 1:  # no sentence can be right after its prefix
        return None
    plen = rules.prefix_lengths(sent)
    first_free = (plen > 0) & (plen + 1 == t)  # [N]
    if not bool(first_free.any()):
        return None
    rank = torch.arange(word.shape[1], device=word.device)
    return first_free[:, None] & (word == eos) & (rank >= 1) & (rank < K)


def _stopped(scores: Tensor, kth_best: Tensor, best_possible_lp: Tensor | float) -> Tensor:
    """Which sentences are done: no live beam can ever beat their n-best finished hypotheses.

    scores [N,K] summed log-probs of the live beams (-inf = none), kth_best [N,nbest],
    best_possible_lp [N] = lp(max_len). A live beam with log-prob L (<= 0) that ends later,
    at length l <= max_len, has log-prob L' <= L (every token adds a log-prob <= 0) and a
    penalty lp(l) <= lp(max_len) (lp does not decrease with length), so its score is
    L' / lp(l) <= L / lp(l) <= L / lp(max_len): dividing a non-positive number by a larger
    positive one can only raise it. Hence L / lp(max_len) bounds everything the beam can
    still produce, and once the nbest-th finished score reaches the best bound the sentence's
    result is final, the same as decoding on to max_len. (Stopping at K finished
    hypotheses, as fairseq does, is not safe: with a length penalty a longer hypothesis can
    still overtake the finished ones.) No live beam gives a bound of -inf: done.

    stopping "hf" calls it with kth_best [N,K] and lp(t), the penalty at the live beams' current length
    t: transformers' test (`_check_early_stop_heuristic` with early_stopping=False: done when all K
    finished slots are filled and the best live beam's log-prob / t ** alpha is not above the worst of
    them). A heuristic: a live beam that goes on can still score better under a length penalty.
    """
    bound = scores.max(dim=1).values / best_possible_lp  # [N]
    return kth_best[:, -1] >= bound


def _topk(cand: Tensor, K: int, ops: SearchOps) -> tuple[Tensor, Tensor]:
    """Top K of cand [N, C] along dim 1, padded with -inf when C < K (tiny vocabularies)."""
    if cand.shape[1] >= K:
        return ops.topk(cand, K)
    top, idx = cand.topk(cand.shape[1], dim=1)
    if top.shape[1] < K:
        pad = K - top.shape[1]
        top = F.pad(top, (0, pad), value=NEG_INF)
        idx = F.pad(idx, (0, pad), value=0)
    return top, idx


def _collect(finished: list[list[Hypothesis]], enters: Tensor, sent: Tensor, history: Tensor,
             rows: Tensor, word: Tensor, log_prob: Tensor, score: Tensor, eos: int) -> None:
    """Append the candidates marked in enters [N,K] to `finished` (one host transfer per tensor)."""
    s, j = enters.nonzero(as_tuple=True)
    prefixes = history.index_select(0, rows[s, j]).tolist()  # each t-1 tokens
    for sid, prefix, w, lp, sc in zip(sent[s].tolist(), prefixes, word[s, j].tolist(),
                                      log_prob[s, j].tolist(), score[s, j].tolist()):
        finished[sid].append(Hypothesis(prefix if w == eos else prefix + [w], sc, lp, w == eos))
