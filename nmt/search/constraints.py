"""What an output must contain, as step rules (nmt/search/rules.py's protocol): glossary terms (`TermRule`:
token sequences) and placeholders (`PlaceholderRule`: single tokens, exactly once). Both say what a row
still needs, and the one length budget of `StepRules` forces it before the limit. Shapes: B sentences,
R rows (row r belongs to sentence `sent[r]`), C constraints per sentence, L tokens per constraint (both
padded), V vocabulary, N sentences in a beam step with k live beams each (candidates [N, k*V]), K beam
size, M candidates.

Tracking a term (`ConstraintState`): per row and constraint, `progress` is the length of the longest
prefix of the constraint that ends the row's output, updated as Knuth-Morris-Pratt does (so `a a a b`
holds `a a b`). A constraint is *done* once its whole sequence has been generated contiguously, and
stays done. With a `joins` vocabulary mask (`nmt.text.glossary.joining_tokens`), a term that ends inside a
word (`open_end`) is *complete* but not yet done when its last token is written: a next token that
continues the word (`perro` then `s`) breaks the match; any other token, EOS or the limit makes it
count. `met` = done or complete.

The rules of a term: EOS only when every term is met; n-gram blocking spares the tokens that advance an
unmet term (`next_token_mask`). The budget: `missing` (continue the furthest started term, then write
each other one whole) is what a row needs at least; `full`, the tokens of every term not done, is what a
free token could leave it to write. Once full plus what other rules need reaches the steps left, a row
may only write the next token of its furthest started term (`exclusive`: nothing else), else the first
token of an unmet term or another rule's token, and after a complete term waiting for its word end no
token that would take it back. Each forced token lowers what is needed by one, so every term is met by
the limit when the limit leaves room for them all (`StepRules.needed` raises it so).

Beam search (`allocate`): dynamic beam allocation (Post & Vilar, 2018) in the vectorized form of Hu et
al. (2019), as fairseq's LexicallyConstrainedBeamSearch. Candidates: the top 2K by score, plus for
every live beam the tokens that advance its unmet terms (only within `margin` nats of its best token)
and its own best token; duplicates dropped. Each candidate's bank is the number of term tokens it has
met; candidates are taken round-robin over the banks (highest first), best first inside each, and the
search takes this order as its top-k. A sentence whose candidates all have one bank gets its top 2K.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from nmt.search.options import NEG_INF, PLAIN_OPS, Rule, SearchOps, Terms


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
        joins (`nmt.text.glossary.joining_tokens`) is padded with False to `vocab_size`, the model's output
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

    def pending(self) -> Tensor:
        """[R] bool: a constraint is unmet, or a complete term waits for its word end."""
        return (self.missing() > 0) | (self._met() & ~self.done).any(dim=1)

    def full(self) -> Tensor:
        """[R] what a free token could leave to write: the tokens of every constraint not done."""
        return torch.where(self.done, 0, self.lengths).sum(dim=1)

    def must_write(self, steps_left: Tensor, extra: Tensor | None = None) -> Tensor:
        """[R] bool: rows that must write toward their constraints now (module docstring). steps_left
        [R] = limit - t + 1; extra [R]: other tokens the row must still write (missing placeholders)."""
        extra = extra if extra is not None else torch.zeros_like(steps_left)
        return (self.pending() | (extra > 0)) & (self.full() + extra >= steps_left)

    def allowed(self, V: int, extra: Tensor | None = None) -> tuple[Tensor, Tensor]:
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
        """(must [R] (`must_write`), allowed [R, V], exclusive [R]) for every row (`allowed`)."""
        return (self.must_write(steps_left, extra), *self.allowed(V, extra))


class TermRule(Rule):
    """Glossary terms as a step rule (nmt/search/rules.py's protocol): EOS only once every term is met, the
    length budget forces what is missing, n-gram blocking spares the tokens that advance a term, and
    beam search allocates its beams by the terms met (`allocate`). `margin`: decode.glossary_margin."""

    needs = True

    def __init__(self, terms: Terms, margin: float, eos: int):
        self.terms, self.margin, self.eos = terms, margin, eos
        self.constrained = [bool(cs) for cs in terms.seqs]
        self.state: ConstraintState | None = None

    def start(self, sent: Tensor, V: int) -> None:
        t = self.terms
        cons = Constraints.build([[list(q) for q in cs] for cs in t.seqs], sent.device, joins=t.joins,
                                 open_end=t.open_end, vocab_size=V)
        self.state = cons.state(sent)

    def advance(self, tokens: Tensor) -> None:
        self.state.advance(tokens)

    def reorder(self, rows: Tensor) -> None:
        self.state.reorder(rows)

    def exempt(self, V: int) -> Tensor:
        return self.state.next_token_mask(V)

    def mask(self, logits: Tensor, t: int) -> None:
        logits[:, self.eos] = logits[:, self.eos].masked_fill(~self.state.eos_allowed(), NEG_INF)

    def pending(self) -> Tensor:
        return self.state.pending()

    def missing(self) -> Tensor:
        return self.state.missing()

    def budget(self) -> Tensor:
        return self.state.full()

    def forced(self, V: int, others: Tensor) -> tuple[Tensor, Tensor]:
        return self.state.allowed(V, others)

    def tokens_needed(self) -> list[int]:
        return [sum(len(q) for q in cs) for cs in self.terms.seqs]

    def candidates(self, cand: Tensor, K: int, ops: SearchOps) -> tuple[Tensor, Tensor]:
        return allocate(self.state, cand, K, ops, self.margin)


class PlaceholderRule(Rule):
    """Placeholders (decode.protect) as a step rule: each placeholder <ph_k> of a sentence's source is
    written exactly once, others never; EOS waits for the missing ones and the length budget forces them.
    tokens[k]: the target ids that write <ph_k>; required[b]: the placeholders of sentence b's source."""

    needs = True

    def __init__(self, tokens: Sequence[Sequence[int]], required: Sequence[Sequence[int]], eos: int, device):
        P = len(tokens)
        pairs = [(i, k) for k, ids in enumerate(tokens) for i in ids]
        self.ids = torch.tensor([i for i, _ in pairs], dtype=torch.long, device=device)  # [Q] token ids
        self.of = torch.tensor([k for _, k in pairs], dtype=torch.long, device=device)  # [Q] their placeholder
        self.onehot = torch.nn.functional.one_hot(self.of, P).float()  # [Q, P]
        self.sentences = torch.tensor([[k in set(req) for k in range(P)] for req in required], dtype=torch.bool,
                                      device=device)  # [B, P]
        self.counts, self.eos = [len(req) for req in required], eos

    def start(self, sent: Tensor, V: int) -> None:
        self.required = self.sentences.index_select(0, sent)  # [R, P]
        self.used = torch.zeros_like(self.required)  # [R, P]: written already

    def advance(self, tokens: Tensor) -> None:
        self.used = self.used | (((tokens[:, None] == self.ids).float() @ self.onehot) > 0)

    def reorder(self, rows: Tensor) -> None:
        self.required, self.used = self.required.index_select(0, rows), self.used.index_select(0, rows)

    def _forbidden(self) -> Tensor:
        """[R, Q]: the placeholder tokens a row may not write (not in its source, or written)."""
        return (~self.required | self.used).index_select(1, self.of)

    def removes(self, t: int) -> int:
        return self.ids.numel() + 1

    def mask(self, logits: Tensor, t: int) -> None:
        logits[:, self.ids] = logits[:, self.ids].masked_fill(self._forbidden(), NEG_INF)
        logits[:, self.eos] = logits[:, self.eos].masked_fill(self.missing() > 0, NEG_INF)

    def pending(self) -> Tensor:
        return self.missing() > 0

    def missing(self) -> Tensor:
        return (self.required & ~self.used).sum(dim=1)

    def budget(self) -> Tensor:
        return self.missing()

    def forced(self, V: int, others: Tensor) -> tuple[Tensor, Tensor]:
        allowed = torch.zeros(self.required.shape[0], V, dtype=torch.bool, device=self.ids.device)
        allowed[:, self.ids] = ~self._forbidden()  # the missing placeholders' tokens
        return allowed, torch.zeros_like(allowed[:, 0])

    def tokens_needed(self) -> list[int]:
        return self.counts


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


def allocate(state: ConstraintState, cand: Tensor, K: int, ops: SearchOps = PLAIN_OPS,
             margin: float = math.inf) -> tuple[Tensor, Tensor]:
    """Dynamic beam allocation (module docstring). cand [N, k*V]: each live beam's summed log-probs of
    its extensions (-inf = not allowed), beams sentence-major, the rows of `state` in that order
    (N*k). -> (scores, indices) [N, 2K] into k*V, in allocation order, as the search's top-k gives them
    (-inf where there are fewer candidates). ops: the search's top-k and argmax.
    margin (decode.glossary_margin): a beam's term tokens join the candidates only where their
    log-prob is at most `margin` below the beam's best token's (the top 2K are kept whatever they hold)."""
    N, kV = cand.shape
    k = state.sent.shape[0] // N
    V = kV // k
    top, idx = ops.top(cand, 2 * K)  # [N, 2K]
    tokens, valid = state.next_tokens()  # [N*k, C]
    rows = cand.view(N * k, V)
    best_score, best = ops.argmax(rows)  # [N*k] each beam's own best token
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
