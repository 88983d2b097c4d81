"""Batched beam search (nmt/search/__init__.py's docstring has the conventions; `beam_search` the rules).

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
from torch import Tensor

from nmt.search.decoding import check_cancel, start
from nmt.search.rules import StepRules
from nmt.schema import max_finished
from nmt.search.options import (NEG_INF, NO_INPUTS, PLAIN_OPS, Cancel, Final, Hypothesis, SearchInputs, SearchOps,
                                SearchOptions, length_penalty_factor)


@torch.inference_mode()
def beam_search(model, src: Tensor, src_mask: Tensor, options: SearchOptions, inputs: SearchInputs = NO_INPUTS,
                *, ops: SearchOps = PLAIN_OPS, cancel: Cancel | None = None,
                on_final: Final | None = None) -> list[list[Hypothesis]]:
    """Batched beam search. src, src_mask [B,S] -> per sentence up to `options.nbest` hypotheses, best first.

    Each step ranks the extensions of a sentence's K live beams by summed log-probability; those in
    the top K that end (EOS or the length limit) join its finished list, ranked by penalised score,
    and the next live beams are the K best that do not end, from the top 2K (fairseq's and
    CTranslate2's rule). At the first step after a forced prefix only the best candidate may end
    (CTranslate2's rule; an EOS ranked 2..K leaves its slot empty). A sentence stops when no live beam
    can still win (`_stopped`, exact), with `stopping: hf` by transformers' heuristic, with `patience`
    > 0 also after `max_finished(K, patience)` endings in its top K, and, where a rule allocates its
    beams (glossary terms) and patience is 0, after K endings (`stop_counts`); such a sentence ranks
    its EOS-ended hypotheses first (`_best_first`). keep_all: every ending in the top K is kept and no
    sentence stops before its beams run out, so any length penalty can be applied afterwards
    (nmt/translation/tune.py); it needs the exact stop. cancel: see `Cancel`. on_final: see `Final` (the
    hypotheses of the sentences that leave are traced when they leave, over the steps so far: a trace and
    three host reads on those steps).
    """
    rules = StepRules(options, inputs, src.shape[0], src.device)
    if src.shape[0] == 0:
        return []
    decoder, max_lens = start(model, src, src_mask, options, ops, inputs, rules.needed)
    beams = _Beams.start(options, max_lens, stop_counts(options, rules.constrained, src.shape[0], src.device))
    n = None if options.keep_all else options.nbest
    if on_final is not None:
        beams.active = list(range(src.shape[0]))
    for t in range(1, int(max_lens.max()) + 1):
        check_cancel(cancel)
        logits = decoder.step(beams.tokens)
        if t == 1:
            rules.start(beams.sent, logits.shape[1], beams.max_lens)
        cand = _candidates(beams, rules, logits, t, options.beam_size, ops)
        _finish(beams, cand, t, options)
        scores, rows, word = _select(cand, options.beam_size)
        if not beams.advance(_keep(beams, scores, t, options), scores, rows, word, decoder, rules):
            break
        if beams.left:  # (on_final) the sentences that left at this step
            traced = beams.record.hypotheses(src.shape[0], options.specials.eos, beams.left)
            for b in beams.left:
                on_final(b, _best_first([traced[b]], rules.constrained and [rules.constrained[b]], n)[0])
    finished = _best_first(beams.record.hypotheses(src.shape[0], options.specials.eos), rules.constrained, n)
    for b in beams.active or ():  # (on_final) the sentences still searching at the end
        on_final(b, finished[b])
    return finished


def _best_first(finished: list[list[Hypothesis]], constrained: list[bool] | None,
                n: int | None) -> list[list[Hypothesis]]:
    """Each sentence's first n finished hypotheses (all: None) by score; a sentence whose beams a rule
    allocates (glossary terms) puts those that ended with EOS before those the length limit ended."""
    flags = constrained or [False] * len(finished)
    return [sorted(hyps, key=lambda h: (c and not h.finished, -h.score))[:n] for hyps, c in zip(finished, flags)]


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
    most: Tensor  # [N] endings after which the sentence stops (`stop_counts`): 0 = the stopping rule alone
    record: _Record  # what ended, and each live beam's parent and token, step by step (on the device)
    active: list[int] | None = None  # with on_final: the original index of each active sentence, on the host
    left: list[int] = ()  # with on_final: the sentences that left at the latest step

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
                   most=most, record=_Record())

    def advance(self, keep: Tensor, scores: Tensor, rows: Tensor, word: Tensor, decoder, rules: StepRules) -> bool:
        """Continue the sentences `keep` [N] with live beams scores, rows (their parent rows), word
        [N, K]: the others leave the batch, the decoder's and the rules' rows follow. -> False when
        none is left. The step's one host read: how many sentences go on (with `active`: which)."""
        N, K = word.shape
        if self.active is None:
            n = int(keep.sum())
        else:
            flags = keep.tolist()
            n, self.left = sum(flags), [b for b, f in zip(self.active, flags) if not f]
            if n:
                self.active = [b for b, f in zip(self.active, flags) if f]
        if n == 0:
            self.left = ()  # (all of them: the search ends, and gives them)
            return False
        sources = None
        if n < N:
            sources = torch.nonzero_static(keep, size=n).squeeze(1)  # [N'] (no host read: N' is known)
            self.sent, self.max_lens, self.best_possible_lp, self.kth_best, scores, rows, word, self.n_done, \
                self.most = (x.index_select(0, sources) for x in (self.sent, self.max_lens, self.best_possible_lp,
                                                                  self.kth_best, scores, rows, word, self.n_done,
                                                                  self.most))
        flat, tokens = rows.reshape(-1), word.reshape(-1)  # [N'*K] parent rows and tokens of the next beams
        decoder.reorder(flat, sources, K)
        rules.reorder(flat)
        rules.advance(tokens)
        self.record.beams(flat, tokens)
        self.tokens, self.scores = tokens, scores
        return True


class _Record:
    """Beam search's history on the device, read once when the search ends: per step the candidates that
    ended and entered their sentence's n-best (`ended`), and each live beam's parent row and token
    (`beams`), from which every finished hypothesis' tokens are traced back (`hypotheses`)."""

    def __init__(self):
        self.steps: list[tuple[int, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]] = []
        self.parents: list[Tensor] = []  # per step s, [R_s+1]: the row of step s each next row continues
        self.tokens: list[Tensor] = []  # per step s, [R_s+1]: its token

    def ended(self, t: int, enters: Tensor, sent: Tensor, rows: Tensor, word: Tensor, log_prob: Tensor,
              score: Tensor) -> None:
        """The candidates of step t marked in enters [N,K] (rows: their parent rows, word: their last token)."""
        self.steps.append((t, enters, sent[:, None].expand_as(enters), rows, word, log_prob, score))

    def beams(self, parents: Tensor, tokens: Tensor) -> None:
        self.parents.append(parents)
        self.tokens.append(tokens)

    def hypotheses(self, B: int, eos: int, only: list[int] | None = None) -> list[list[Hypothesis]]:
        """Per sentence its finished hypotheses, in the order they ended (step, then rank); only: of these
        sentences alone (the others' lists stay empty)."""
        out: list[list[Hypothesis]] = [[] for _ in range(B)]
        if not self.steps:
            return out
        parts = list(zip(*[s[1:] for s in self.steps]))  # per field, one tensor per step
        enters, sent, rows, word, log_prob, score = (torch.cat([x.reshape(-1) for x in f]) for f in parts)
        if only is not None:
            enters = enters & torch.isin(sent, torch.tensor(only, dtype=sent.dtype).to(sent.device))
        step = torch.cat([torch.full((x.numel(),), t, dtype=torch.long, device=x.device)
                          for (t, *_), x in zip(self.steps, parts[0])])
        sel = enters.nonzero().squeeze(1)
        step, sent, rows, word, log_prob, score = (x.index_select(0, sel) for x in (step, sent, rows, word,
                                                                                     log_prob, score))
        tokens = self._trace(step, rows, word)  # [M, T]
        ints = torch.cat([torch.stack([sent, step, word], dim=1), tokens], dim=1).tolist()  # [M, 3 + T]
        for (s, t, w, *toks), (lp, sc) in zip(ints, torch.stack([log_prob, score], dim=1).tolist()):
            toks = toks[:t]
            out[s].append(Hypothesis(toks[:-1] if w == eos else toks, sc, lp, w == eos))
        return out

    def _trace(self, step: Tensor, rows: Tensor, word: Tensor) -> Tensor:
        """[M, T] the tokens of M candidates that ended at steps `step` [M] from parent rows `rows` of
        their step with last token `word`: token t is `word`, the earlier ones traced back step by step."""
        M, T = step.shape[0], self.steps[-1][0]
        out = torch.zeros(M, T, dtype=torch.long, device=step.device)
        out.scatter_(1, (step - 1)[:, None], word[:, None])
        if not self.parents:
            return out
        offsets = [0]
        for p in self.parents[:-1]:
            offsets.append(offsets[-1] + p.shape[0])  # where step s's rows start
        parents, tokens = torch.cat(self.parents), torch.cat(self.tokens)
        p = rows  # each candidate's row in the layout of step s + 1 (while step > s)
        for s in range(len(self.parents), 0, -1):
            on = step > s  # [M] the candidates with a token s before their last
            idx = (offsets[s - 1] + p).clamp(max=parents.shape[0] - 1)
            out[:, s - 1] = torch.where(on, tokens.index_select(0, idx), out[:, s - 1])
            p = torch.where(on, parents.index_select(0, idx), p)
        return out


class _Candidates(NamedTuple):
    """The top 2K extensions of each active sentence's live beams, best first: [N, 2K] each."""

    top: Tensor  # summed log-prob (-inf: no candidate, or a slot left empty after a prefix)
    word: Tensor  # its token
    rows: Tensor  # the row of its parent beam
    alive: Tensor  # a real candidate (finite before a slot was emptied)
    ends: Tensor  # it ends: EOS, or the maximum length


def _candidates(beams: _Beams, rules: StepRules, logits: Tensor, t: int, K: int, ops: SearchOps) -> _Candidates:
    """Rank the extensions of the live beams (logits [N*k, V] of step t) by summed log-probability, or
    in the order a rule allocates them (glossary terms: dynamic beam allocation)."""
    N, k = beams.scores.shape  # k = 1 at the first step (all beams share the prefix BOS), then K
    device, EOS = logits.device, rules.specials.eos
    logp = rules.log_probs(logits, t)  # [N*k, V]
    V = logp.shape[1]
    cand = logp.add_(beams.scores.view(-1, 1)).view(N, k * V)  # in place: logp is fresh
    found = rules.candidates(cand, K, ops)
    top, idx = found if found is not None else ops.top(cand, 2 * K)  # [N, 2K]
    word = idx % V  # [N, 2K] token of each candidate
    rows = idx // V + (torch.arange(N, device=device) * k)[:, None]  # [N, 2K] row of its parent beam
    alive = top > NEG_INF
    ends = (word == EOS) | (beams.max_lens <= t)[:, None]  # [N, 2K]
    empty = rules.empty_slots(word, t, K)  # [N, 2K] or None: EOS ranked 2..K after a prefix
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
    beams.record.ended(t, enters[:, :K], beams.sent, c.rows[:, :K], c.word[:, :K], c.top[:, :K], score[:, :K])
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


def stop_counts(options: SearchOptions, constrained: list[bool] | None, B: int, device) -> Tensor:
    """[B] the endings after which each sentence stops (0: the stopping rule alone): `max_finished(K,
    patience)`, and K (patience 1) when patience is 0 for a sentence whose beams a rule allocates
    (`StepRules.constrained`: glossary terms). Their search cannot end a hypothesis before it holds every
    term, and with a length penalty the exact stop's bound stays loose, so it would search on to the
    length limit, where the missing terms are forced in, and such long hypotheses win under the penalty
    (BENCHMARKS.md, "Glossaries"); fairseq's and Sockeye's constrained searches stop at K too."""
    plain = max_finished(options.beam_size, options.patience)
    with_terms = max_finished(options.beam_size, 1.0) if options.patience == 0 else plain
    return torch.tensor([with_terms if c else plain for c in constrained or [False] * B], dtype=torch.long,
                        device=device)


def _stopped(scores: Tensor, kth_best: Tensor, best_possible_lp: Tensor | float) -> Tensor:
    """Which sentences are done: no live beam can ever beat their n-best finished hypotheses.

    scores [N,K] summed log-probs of the live beams (-inf = none), kth_best [N,nbest], best_possible_lp
    [N] = lp(max_len). A beam with log-prob L <= 0 that ends later, at length l <= max_len, scores at
    most L / lp(l) <= L / lp(max_len) (log-probs only fall, lp only grows), so once the nbest-th finished
    score reaches the best such bound the result is final. stopping "hf" passes kth_best [N,K] and
    lp(t), the penalty at the current length: transformers' `_check_early_stop_heuristic` (a heuristic).
    """
    bound = scores.max(dim=1).values / best_possible_lp  # [N]
    return kth_best[:, -1] >= bound


