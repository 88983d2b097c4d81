"""Lexical constraints for the search: token sequences every output must contain (glossary terms, issue 37).

Tensor code apart from the search loop, which calls it (greedy: `ConstraintState.apply` at each step, through
nmt.rules.StepRules; beam, nmt/beam.py: also `allocate` in place of its top-k, and it stops a sentence with
terms after K endings, `beam.stop_counts`); tests/constrained_ref.py's reference searches call it too. Shapes: B sentences, R rows (hypotheses; row r belongs
to sentence `sent[r]`), C constraints per sentence, L tokens per constraint (both padded), V vocabulary,
N sentences in a beam step with k live beams each (candidates [N, k*V]), K beam size, M candidates.

Tracking (`ConstraintState`): per row and constraint, `progress` is the length of the longest prefix
of the constraint that ends the row's output, updated as Knuth-Morris-Pratt does: a token that breaks
a partial match falls back to the longest prefix that still ends the output (so `a a a b` holds
`a a b`; simply restarting would miss it). A constraint is *done* once its whole sequence has been
generated contiguously, and stays done. With a `joins` vocabulary mask (`nmt.glossary.word_joining`),
a constraint whose term ends inside a word (`open_end`) is *complete* but not yet done when its last
token is written: the next token decides. One that continues the word (`perro` then `s`: "perros"
holds no whole word "perro") breaks the match as above; any other token, EOS or the length limit
(the output ends) makes it count. `met` = done or complete.

The rules (`apply`, on a step's logits before the softmax, as nmt.search.StepRules masks):
- EOS only when every constraint is met;
- the length limit: `missing` = (sum of L over the unmet constraints) - (the largest progress among
  them) bounds the tokens still needed (continue the furthest started one, then write each other one
  whole); `full` = the sum of L over the constraints not done is what a free token can leave to write
  (it may break every partial match, or take back a complete one). A row is free while full + extra
  (placeholders still missing) < steps left (t..limit); from then on it may only write: the next
  token of its furthest started constraint when one is started (`exclusive`: anything else would
  break it), else the first token of an unmet constraint or one of `extra_tokens` (a missing
  placeholder), and after a complete term waiting for its word end no token that would take it back
  (any token that ends the word, when nothing else is missing). So missing + extra <= steps left holds
  when the row is first forced, and each forced token lowers missing + extra by one: every constraint
  is met by the limit when the limit leaves room for them all, at least len(prefix) +
  `Constraints.total` (+ placeholders) tokens, which the search must ensure.
- n-gram blocking never removes a token that advances an unmet constraint (`next_token_mask`: the
  search restores those logits after blocking): the constraints win over no_repeat_ngram.
A forced token takes a complete term back only in a contrived glossary: where no other token is
allowed, i.e. a term started inside another one's last word continues that word (targets `New York`
and `Yorker`).

Beam search (`allocate`): dynamic beam allocation (Post & Vilar, 2018) in the vectorized form of Hu et
al. (2019), as fairseq's LexicallyConstrainedBeamSearch. Candidates: the top 2K by score, plus for
every live beam the tokens that advance its unmet constraints and its own best token; duplicates
dropped. With a `margin` (decode.glossary_margin) a beam's constraint tokens join only where their
log-prob is at most `margin` below its best token's: the allocation keeps the best candidate of every
bank first, so a term token the model finds absurd at a step would otherwise be written there ("Take
from night" for "go up by night"); the length rule still forces what is missing. Each candidate's bank is the number of constraint tokens it has met (sum over constraints of
L when met, else progress). Candidates are sorted by (bank, score), ranked inside their bank, and
taken round-robin: the best of every bank (highest bank first), then the second of every bank, and
so on; the search takes this order as it takes its top-k (endings among the first K finish, the
first K live ones continue). A sentence whose candidates all have one bank (no constraints, or all
done) gets exactly its top 2K, in order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import Tensor

NEG_INF = float("-inf")


def _failure(seq: Sequence[int]) -> list[int]:
    """KMP failure function: fail[p] = length of the longest proper border of seq[:p] (fail[0] = 0)."""
    fail = [0] * (len(seq) + 1)
    k = 0
    for p in range(1, len(seq)):
        while k and seq[p] != seq[k]:
            k = fail[k]
        k += seq[p] == seq[k]
        fail[p + 1] = k
    return fail


@dataclass(frozen=True)
class Constraints:
    """The constraints of a batch: seqs [B, C, L] token ids (-1 = padding), lengths [B, C] (0 = an
    empty slot), fail [B, C, L+1] (`_failure`), open_end [B, C] (needs a word end: only with joins),
    joins [V] bool or None (the tokens that continue the word before them)."""

    seqs: Tensor
    lengths: Tensor
    fail: Tensor
    open_end: Tensor
    joins: Tensor | None = None

    @classmethod
    def build(cls, per_sentence: Sequence[Sequence[Sequence[int]]], device=None, *,
              joins: Sequence[bool] | Tensor | None = None, open_end: Sequence[Sequence[bool]] | None = None,
              vocab_size: int | None = None) -> "Constraints":
        """per_sentence[b]: the token sequences sentence b's output must contain (non-empty, ids >= 0).
        open_end[b][c]: whether constraint c ends inside a word (used with `joins`; default all False).
        joins (`nmt.glossary.joining_tokens`) is padded with False to `vocab_size`, the model's output
        size (which may exceed the tokenizer's)."""
        B = len(per_sentence)
        C = max([len(cs) for cs in per_sentence] + [1])
        L = max([len(s) for cs in per_sentence for s in cs] + [1])
        seqs, lengths = torch.full((B, C, L), -1, dtype=torch.long), torch.zeros(B, C, dtype=torch.long)
        fail, ends = torch.zeros(B, C, L + 1, dtype=torch.long), torch.zeros(B, C, dtype=torch.bool)
        for b, cs in enumerate(per_sentence):
            for c, seq in enumerate(cs):
                if not seq or min(seq) < 0:
                    raise ValueError(f"constraint {c} of sentence {b} must be a non-empty list of token ids, got {seq}")
                seqs[b, c, :len(seq)] = torch.tensor(list(seq))
                lengths[b, c] = len(seq)
                fail[b, c, :len(seq) + 1] = torch.tensor(_failure(seq))
                ends[b, c] = bool(open_end[b][c]) if open_end is not None and joins is not None else False
        mask = None if joins is None else torch.as_tensor(joins, dtype=torch.bool)
        if mask is not None and vocab_size is not None and mask.shape[0] < vocab_size:
            mask = torch.cat([mask, torch.zeros(vocab_size - mask.shape[0], dtype=torch.bool)])
        mask = None if mask is None else mask.to(device)
        return cls(seqs.to(device), lengths.to(device), fail.to(device), ends.to(device), mask)

    @property
    def total(self) -> Tensor:
        """[B] constraint tokens per sentence: the room its output needs besides a prefix."""
        return self.lengths.sum(dim=1)

    def state(self, sent: Tensor) -> "ConstraintState":
        """The start state of rows whose sentences are sent [R] (nothing generated yet)."""
        return ConstraintState(self, sent)


class ConstraintState:
    """Per row, the progress on each of its sentence's constraints (module docstring). The search owns
    one, reorders it with its rows and advances it with every generated token (a forced prefix too)."""

    def __init__(self, cons: Constraints, sent: Tensor):
        self.cons, self.sent = cons, sent  # sent [R]: each row's sentence
        self.lengths = cons.lengths.index_select(0, sent)  # [R, C]
        self.progress = torch.zeros_like(self.lengths)  # [R, C]
        self.done = self.lengths == 0  # [R, C]: empty slots count as done

    def reorder(self, indices: Tensor) -> None:
        """Keep rows `indices` [R'] (beam reordering, expansion, finished sentences leaving)."""
        self.sent, self.lengths = self.sent.index_select(0, indices), self.lengths.index_select(0, indices)
        self.progress, self.done = self.progress.index_select(0, indices), self.done.index_select(0, indices)

    def advance(self, tokens: Tensor) -> None:
        """Each row generated tokens [R]."""
        self.progress, self.done = _advance(self.cons, self.sent, self.lengths, self.progress, self.done, tokens)

    def _met(self) -> Tensor:
        return self.done | (self.progress == self.lengths)  # [R, C]

    def eos_allowed(self) -> Tensor:
        """[R] bool: every constraint met."""
        return self._met().all(dim=1)

    def bank(self) -> Tensor:
        """[R] constraint tokens met (L of a met constraint, else its progress)."""
        return torch.where(self._met(), self.lengths, self.progress).sum(dim=1)

    def next_tokens(self) -> tuple[Tensor, Tensor]:
        """(tokens [R, C], valid [R, C]): the token that advances each unmet constraint."""
        seqs = self.cons.seqs.index_select(0, self.sent)  # [R, C, L]
        tokens = seqs.gather(2, self.progress.clamp(max=seqs.shape[2] - 1)[..., None]).squeeze(2)
        return tokens, ~self._met()

    def next_token_mask(self, V: int) -> Tensor:
        """[R, V] bool: the tokens that advance an unmet constraint of the row."""
        tokens, valid = self.next_tokens()
        idx = torch.where(valid, tokens, V)  # invalid ones go to a spare column
        return torch.zeros(tokens.shape[0], V + 1, dtype=torch.bool, device=tokens.device).scatter_(1, idx, True)[:, :V]

    def _started(self) -> tuple[Tensor, Tensor]:
        """(unmet [R, C], the largest progress among them [R])."""
        unmet = ~self._met()
        return unmet, torch.where(unmet, self.progress, 0).max(dim=1).values

    def missing(self) -> Tensor:
        """[R] tokens that finish every unmet constraint, at most: continue the furthest started one,
        then write each other one whole."""
        unmet, started = self._started()
        return torch.where(unmet, self.lengths, 0).sum(dim=1) - started

    def must_write(self, steps_left: Tensor, extra: Tensor | None = None) -> Tensor:
        """[R] bool: rows that must write toward their constraints now (module docstring). steps_left
        [R] = limit - t + 1; extra [R]: other tokens the row must still write (missing placeholders)."""
        extra = extra if extra is not None else torch.zeros_like(steps_left)
        pending = (self._met() & ~self.done).any(dim=1)  # [R] a term waits for its word end
        full = torch.where(self.done, 0, self.lengths).sum(dim=1)  # what a free token could leave to write
        return ((self.missing() + extra > 0) | pending) & (full + extra >= steps_left)

    def _allowed(self, V: int, extra: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """(allowed [R, V]: the constraint tokens a row that must write may write; exclusive [R]: a
        constraint is started, so no placeholder either)."""
        unmet, started = self._started()
        tokens, _ = self.next_tokens()
        idx = torch.where(unmet & (self.progress == started[:, None]), tokens, V)  # continue the furthest
        allowed = torch.zeros(tokens.shape[0], V + 1, dtype=torch.bool, device=tokens.device).scatter_(1, idx, True)
        allowed = allowed[:, :V]
        joins = self.cons.joins
        if joins is not None:  # after a term waiting for its word end: no token that would take it back
            pending = (~unmet & ~self.done).any(dim=1)
            keep = allowed & ~joins
            allowed = torch.where((pending & keep.any(dim=1))[:, None], keep, allowed)
            alone = pending & (self.missing() + (extra if extra is not None else 0) == 0)
            allowed |= alone[:, None] & ~joins  # only that term: any token that ends the word
        return allowed, started > 0

    def forced(self, steps_left: Tensor, V: int, extra: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """(must [R] (`must_write`), allowed [R, V], exclusive [R]) for every row (`_allowed`)."""
        return (self.must_write(steps_left, extra), *self._allowed(V, extra))

    def _take(self, rows: Tensor) -> "ConstraintState":
        """A copy of rows [F] of the state."""
        sub = ConstraintState.__new__(ConstraintState)
        sub.cons = self.cons
        sub.sent, sub.lengths, sub.progress, sub.done = (x.index_select(0, rows) for x in
                                                         (self.sent, self.lengths, self.progress, self.done))
        return sub

    def apply(self, logits: Tensor, steps_left: Tensor, eos: int, extra: Tensor | None = None,
              extra_tokens: Tensor | None = None) -> Tensor:
        """logits [R, V] (before the softmax) with what the constraints forbid at -inf, in place: EOS
        until every constraint is met; for the rows that `must_write`, all but the tokens `forced`
        allows (and the row's `extra_tokens` [R, V], its missing placeholders, unless exclusive). With
        placeholders the search leaves their length-limit rule to this call (extra, extra_tokens): two
        separate rules would each allow only their own tokens. One host sync (the rows that must write)."""
        logits[:, eos] = logits[:, eos].masked_fill(~self.eos_allowed(), NEG_INF)
        rows = self.must_write(steps_left, extra).nonzero().squeeze(1)  # [F]
        if rows.numel():
            allowed, exclusive = self._take(rows)._allowed(logits.shape[1], None if extra is None else extra[rows])
            if extra_tokens is not None:
                allowed |= extra_tokens[rows] & ~exclusive[:, None]
            logits[rows] = logits[rows].masked_fill(~allowed, NEG_INF)
        return logits


def _advance(cons: Constraints, sent: Tensor, lengths: Tensor, progress: Tensor, done: Tensor,
             tokens: Tensor) -> tuple[Tensor, Tensor]:
    """(progress, done) [R, C] after rows of sentences sent [R] generate tokens [R] (module docstring)."""
    seqs, fail = cons.seqs.index_select(0, sent), cons.fail.index_select(0, sent)  # [R, C, L], [R, C, L+1]
    open_end = cons.open_end.index_select(0, sent)  # [R, C]
    L = seqs.shape[2]
    w = tokens[:, None]  # [R, 1]
    complete = ~done & (progress == lengths)  # open-ended constraints waiting for a word end
    if cons.joins is not None:
        done = done | (complete & ~cons.joins[tokens][:, None])
    p = progress
    for _ in range(L):  # fall back while the next token of the partial match is not w (at most L times)
        nxt = seqs.gather(2, p.clamp(max=L - 1)[..., None]).squeeze(2)
        stuck = (p > 0) & ((p == lengths) | (nxt != w))
        p = torch.where(stuck, fail.gather(2, p[..., None]).squeeze(2), p)
    nxt = seqs.gather(2, p.clamp(max=L - 1)[..., None]).squeeze(2)
    p = torch.where((p < lengths) & (nxt == w), p + 1, p)
    p = torch.where(done, lengths, p)
    done = done | ((p == lengths) & ~open_end)
    return p, done


def allocate(state: ConstraintState, cand: Tensor, K: int,
             topk: Callable[[Tensor, int], tuple[Tensor, Tensor]] | None = None,
             argmax: Callable[[Tensor], tuple[Tensor, Tensor]] | None = None,
             margin: float = math.inf) -> tuple[Tensor, Tensor]:
    """Dynamic beam allocation (module docstring). cand [N, k*V]: each live beam's summed log-probs of
    its extensions (-inf = not allowed), beams sentence-major, the rows of `state` in that order
    (N*k). -> (scores, indices) [N, 2K] into k*V, in allocation order, as the search's top-k gives them
    (-inf where there are fewer candidates). topk, argmax: the search's (`SearchOps`; None: torch's).
    margin (decode.glossary_margin): a beam's term tokens join the candidates only where their
    log-prob is at most `margin` below the beam's best token's (the top 2K are kept whatever they hold)."""
    N, kV = cand.shape
    k = state.sent.shape[0] // N
    V = kV // k
    top, idx = _topk(cand, 2 * K, topk)  # [N, 2K]
    tokens, valid = state.next_tokens()  # [N*k, C]
    rows = cand.view(N * k, V)
    best_score, best = argmax(rows) if argmax is not None else rows.max(dim=1)  # [N*k] each beam's own best token
    if margin != math.inf:  # term tokens the model finds implausible here are not tried
        valid = valid & (rows.gather(1, tokens.clamp(min=0)) >= best_score[:, None] - margin)
    ok = torch.cat([valid, torch.ones_like(best[:, None], dtype=torch.bool)], dim=1).view(N, -1)
    beam = torch.arange(k, device=cand.device).repeat(N)[:, None]  # [N*k, 1]
    extra = (beam * V + torch.cat([tokens, best[:, None]], dim=1)).view(N, -1)  # [N, k*(C+1)]
    spare = kV + torch.arange(extra.shape[1], device=cand.device)  # distinct indices for the invalid ones
    unique = torch.cat([idx, torch.where(ok, extra, spare)], dim=1)  # [N, M]
    idx = torch.cat([idx, torch.where(ok, extra, 0)], dim=1)
    score = torch.cat([top, cand.gather(1, idx[:, 2 * K:]).masked_fill(~ok, NEG_INF)], dim=1)  # [N, M]
    score = score.masked_fill(_duplicates(unique), NEG_INF)
    flat = ((torch.arange(N, device=cand.device) * k)[:, None] + idx // V).reshape(-1)  # [N*M] their beams
    lengths = state.lengths[flat]
    p, d = _advance(state.cons, state.sent[flat], lengths, state.progress[flat], state.done[flat],
                    (idx % V).reshape(-1))
    bank = torch.where(d | (p == lengths), lengths, p).sum(dim=1).view(N, -1)  # [N, M]
    order = _round_robin(score, bank)[:, :2 * K]
    return score.gather(1, order), idx.gather(1, order)


def _topk(cand: Tensor, n: int, topk) -> tuple[Tensor, Tensor]:
    """Top n of cand [N, C] along dim 1, padded with -inf (index 0) when C < n."""
    if cand.shape[1] >= n:
        return topk(cand, n) if topk is not None else cand.topk(n, dim=1)
    top, idx = cand.topk(cand.shape[1], dim=1)
    pad = n - top.shape[1]
    return torch.nn.functional.pad(top, (0, pad), value=NEG_INF), torch.nn.functional.pad(idx, (0, pad))


def _duplicates(idx: Tensor) -> Tensor:
    """[N, M] bool: candidates whose index occurred earlier in their row."""
    order = idx.argsort(dim=1, stable=True)
    s = idx.gather(1, order)
    dup = torch.cat([torch.zeros_like(s[:, :1], dtype=torch.bool), s[:, 1:] == s[:, :-1]], dim=1)
    return torch.zeros_like(dup).scatter_(1, order, dup)


def _round_robin(score: Tensor, bank: Tensor) -> Tensor:
    """[N, M] candidate positions in allocation order: by (bank, score), ranked in their bank, then
    rank by rank across the banks (highest bank first); -inf candidates last, in their order."""
    N, M = score.shape
    by_score = score.argsort(dim=1, descending=True, stable=True)
    order = by_score.gather(1, bank.gather(1, by_score).argsort(dim=1, descending=True, stable=True))
    b = bank.gather(1, order)  # [N, M] banks, descending
    pos = torch.arange(M, device=score.device).expand(N, M)
    starts = torch.cat([torch.ones_like(b[:, :1], dtype=torch.bool), b[:, 1:] != b[:, :-1]], dim=1)
    rank = pos - torch.where(starts, pos, 0).cummax(dim=1).values  # place inside its bank
    which = starts.long().cumsum(dim=1) - 1  # 0 = the highest bank present
    key = rank * (M + 1) + which
    key = torch.where(score.gather(1, order) > NEG_INF, key, M * (M + 1) + pos)
    return order.gather(1, key.argsort(dim=1, stable=True))
