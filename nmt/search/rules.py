"""The step rules: what a search may generate at each step (conventions: nmt/search/__init__.py), as a
list of rules with one protocol, as CTranslate2's `logits_processors`.

`StepRules(options, inputs, B, device)` builds a batch's list once (`build_rules`: forced prefix,
never-generated tokens, min_len, n-gram blocking, placeholders and glossary terms, each only where
the batch uses it) and runs it; the searches know `StepRules`, not the rules. Per step a search calls
`log_probs(logits, t)`, `advance(tokens)` and, when its rows change, `reorder(rows)`; `start(sent, V,
limits)` before the first step. Each rule owns and reorders the state of its rows.

A step, in order: each rule's `mask` of the logits (before the softmax); the one length budget (a row
whose rules need as many tokens as steps are left may write only what they need: `Rule.budget`,
`Rule.forced`); a row left with nothing may end; the log-softmax; each rule's `mask_log_probs`. No
step reads a tensor value on the host.

Shapes: B sentences, R rows (row r belongs to sentence `sent[r]`), V vocabulary, t the step (1-based).
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt.search.constraints import PlaceholderRule, TermRule
from nmt.search.options import NEG_INF, Rule, SearchInputs, SearchOps, SearchOptions, Terms


class Never(Rule):
    """PAD and the start token are never generated: removed after the softmax (their probability, ~0
    for a trained model, is not redistributed)."""

    def __init__(self, ids: Sequence[int], device):
        self.ids = torch.tensor(list(ids), dtype=torch.long, device=device)

    def mask_log_probs(self, logp: Tensor, t: int) -> None:
        logp.index_fill_(1, self.ids, NEG_INF)


class MinLength(Rule):
    """EOS is forbidden while t <= min_len."""

    def __init__(self, min_len: int, eos: int):
        self.min_len, self.eos = min_len, eos

    def removes(self, t: int) -> int:
        return int(t <= self.min_len)

    def mask(self, logits: Tensor, t: int) -> None:
        if t <= self.min_len:
            logits[:, self.eos] = NEG_INF


class Prefix(Rule):
    """A forced target prefix per sentence: at steps t <= len(prefix) only prefix[t-1], with the
    model's own log-probability (0 for the first `free` tokens); at the first step after it beam
    search lets only the best candidate end (CTranslate2's rule)."""

    def __init__(self, prefixes: Sequence[Sequence[int]], free: int, pad: int, eos: int, device):
        self.longest, self.free, self.eos = max(len(p) for p in prefixes), free, eos
        self.tokens = torch.tensor([list(p) + [pad] * (self.longest - len(p)) for p in prefixes], dtype=torch.long,
                                   device=device)  # [B, P]
        self.lengths = torch.tensor([len(p) for p in prefixes], dtype=torch.long, device=device)  # [B]
        self.value: Tensor | None = None

    def start(self, sent: Tensor, V: int) -> None:
        self.tokens, self.lengths = self.tokens.index_select(0, sent), self.lengths.index_select(0, sent)

    def reorder(self, rows: Tensor) -> None:
        self.tokens, self.lengths = self.tokens.index_select(0, rows), self.lengths.index_select(0, rows)

    def mask(self, logits: Tensor, t: int) -> None:
        """Called first: the forced token's log-probability before any rule masks."""
        self.value = None
        if t <= self.longest:
            token = self.tokens[:, t - 1 : t]  # [R,1]
            value = F.log_softmax(logits, dim=-1).gather(1, token) if t > self.free else torch.zeros_like(
                token, dtype=logits.dtype)
            self.value = token, value, (self.lengths >= t)[:, None]  # rows still in their prefix

    def mask_log_probs(self, logp: Tensor, t: int) -> None:
        if self.value is not None:
            token, value, forced = self.value
            value = torch.where(forced, value, logp.gather(1, token))
            logp.masked_fill_(forced, NEG_INF).scatter_(1, token, value)

    def empty_slots(self, word: Tensor, t: int, K: int) -> Tensor | None:
        if t > self.longest + 1:  # no sentence can be right after its prefix
            return None
        N = word.shape[0]
        plen = self.lengths.view(N, -1)[:, 0]  # [N] (rows are sentence-major)
        rank = torch.arange(word.shape[1], device=word.device)
        return ((plen > 0) & (plen + 1 == t))[:, None] & (word == self.eos) & (rank >= 1) & (rank < K)


class NoRepeatNgram(Rule):
    """No n-gram of the row's output (prefix included) occurs twice: a token that would complete one
    already there is forbidden, unless another rule needs it (`Rule.exempt`: glossary terms win)."""

    def __init__(self, n: int, rules: Sequence[Rule]):
        self.n, self.rules, self.history = n, rules, None  # history [R, t-1]: the row's tokens so far

    def start(self, sent: Tensor, V: int) -> None:
        self.history = torch.empty(sent.shape[0], 0, dtype=torch.long, device=sent.device)

    def advance(self, tokens: Tensor) -> None:
        self.history = torch.cat([self.history, tokens[:, None]], dim=1)

    def reorder(self, rows: Tensor) -> None:
        self.history = self.history.index_select(0, rows)

    def removes(self, t: int) -> int:
        L = t - 1
        return L if self.n == 1 else max(0, L - self.n + 1)  # one token per earlier window

    def mask(self, logits: Tensor, t: int) -> None:
        if self.history.shape[1] < max(self.n - 1, 1):
            return
        exempt = [m for m in (r.exempt(logits.shape[1]) for r in self.rules) if m is not None]
        raw = logits.clone() if exempt else None
        block_repeats(logits, self.history, self.n)
        for m in exempt:
            logits.copy_(torch.where(m, raw, logits))


class StepRules:
    """A batch's rules (`build_rules`) and the step they make together (module docstring). Built from
    the search's options and one batch's inputs (`inputs.check`: ValueError when they do not fit a
    batch of B sentences). `needed`: per sentence the room in output tokens its constrained rules need
    (its prefix, what they must write and an EOS; 0 for a sentence they leave free), None when no
    rule constrains a sentence; `constrained`: per sentence whether a rule allocates its beams."""

    def __init__(self, options: SearchOptions, inputs: SearchInputs, B: int, device):
        inputs.check(B, options)
        self.specials = options.specials
        self.rules = build_rules(options, inputs, B, device)
        self.budgeted = [r for r in self.rules if r.needs]
        self.limit: Tensor | None = None  # [R] each row's maximum output length
        self.never = torch.tensor(list(options.specials.never_generated), dtype=torch.long, device=device)
        flags = [r.constrained for r in self.rules if r.constrained is not None]
        self.constrained = [any(f) for f in zip(*flags)] if flags else None
        self.needed = None
        if self.constrained is not None:
            prefixes = inputs.prefixes or [[]] * B
            counts = [r.tokens_needed() for r in self.budgeted]
            self.needed = [len(p) + sum(c[b] for c in counts) + 1 if self.constrained[b] else 0
                           for b, p in enumerate(prefixes)]

    def start(self, sent: Tensor, V: int, limits: Tensor) -> None:
        """Rows of sentences sent [R], each with its maximum output length limits [R]."""
        self.limit = limits
        for rule in self.rules:
            rule.start(sent, V)

    def advance(self, tokens: Tensor) -> None:
        for rule in self.rules:
            rule.advance(tokens)

    def reorder(self, rows: Tensor) -> None:
        self.limit = self.limit.index_select(0, rows)
        for rule in self.rules:
            rule.reorder(rows)

    def log_probs(self, logits: Tensor, t: int) -> Tensor:
        """logits [R,V] of step t (the search's own fresh output: masked in place) -> fp32
        log-probabilities [R,V] with what the rules forbid at -inf."""
        logits = logits.float()
        V, EOS = logits.shape[1], self.specials.eos
        emptied = bool(self.budgeted) or sum(r.removes(t) for r in self.rules) >= V - self.never.numel()
        eos = logits[:, EOS].clone() if emptied else None  # [R]: for a row left with nothing
        for rule in self.rules:
            rule.mask(logits, t)
        if self.budgeted:
            self._force(logits, t)
        if emptied:  # a row left with nothing it may generate may end
            logits[:, EOS] = torch.where(self._dead_rows(logits), eos, logits[:, EOS])
        logp = F.log_softmax(logits, dim=-1)
        for rule in self.rules:
            rule.mask_log_probs(logp, t)
        return logp

    def _force(self, logits: Tensor, t: int) -> None:
        """The length budget: rows whose rules need at least as many tokens as steps are left (t ..
        limit) may write only what those rules allow (`Rule.forced`); each forced token lowers what
        they need by one, so all of it is written by the limit when the limit leaves room for it."""
        rules, V = self.budgeted, logits.shape[1]
        must = torch.stack([r.pending() for r in rules]).any(dim=0) & (
            torch.stack([r.budget() for r in rules]).sum(dim=0) >= self.limit - t + 1)  # [R]
        missing = [r.missing() for r in rules]
        total = torch.stack(missing).sum(dim=0)
        forced = [r.forced(V, total - m) for r, m in zip(rules, missing)]
        exclusive = torch.stack([x for _, x in forced]).any(dim=0)  # [R]
        allowed = torch.zeros_like(logits, dtype=torch.bool)
        for ok, own in forced:  # an exclusive rule's tokens only, where one is
            allowed |= ok & (own | ~exclusive)[:, None]
        logits.masked_fill_(must[:, None] & ~allowed, NEG_INF)

    def _dead_rows(self, logits: Tensor) -> Tensor:
        """[R] bool: rows whose every token but the never-generated ones is at -inf (those set to -inf
        for one reduction, then put back: the softmax still sees them)."""
        ids = self.never
        if not ids.numel():
            return logits.amax(dim=1) == NEG_INF
        saved = logits.index_select(1, ids)
        logits.index_fill_(1, ids, NEG_INF)
        dead = logits.amax(dim=1) == NEG_INF
        logits.index_copy_(1, ids, saved)
        return dead

    # ---- beam search
    def candidates(self, cand: Tensor, K: int, ops: SearchOps) -> tuple[Tensor, Tensor] | None:
        """The first rule's candidate order (dynamic beam allocation), or None: the plain top 2K."""
        for rule in self.rules:
            found = rule.candidates(cand, K, ops)
            if found is not None:
                return found
        return None

    def empty_slots(self, word: Tensor, t: int, K: int) -> Tensor | None:
        """[N, 2K]: candidates the rules leave empty at step t (or None)."""
        masks = [m for m in (r.empty_slots(word, t, K) for r in self.rules) if m is not None]
        return None if not masks else masks[0] if len(masks) == 1 else torch.stack(masks).any(dim=0)


def build_rules(options: SearchOptions, inputs: SearchInputs, B: int, device) -> list[Rule]:
    """The rules of a batch, in the order they mask: the prefix first (it reads the model's own
    log-probabilities), PAD/start, min_len, n-gram blocking, then the rules that need tokens written
    (placeholders, glossary terms: nmt/search/constraints.py)."""
    specials = options.specials
    rules: list[Rule] = []
    if inputs.prefixes is not None and any(inputs.prefixes):
        rules.append(Prefix(inputs.prefixes, options.free_prefix, specials.pad, specials.eos, device))
    rules.append(Never(specials.never_generated, device))
    if options.min_len:
        rules.append(MinLength(options.min_len, specials.eos))
    if options.no_repeat_ngram:
        rules.append(NoRepeatNgram(options.no_repeat_ngram, rules))
    tokens = options.placeholder_tokens
    if tokens is not None and any(tokens):
        if inputs.placeholders is None:
            raise ValueError("placeholder_tokens need each sentence's placeholders (SearchInputs.placeholders)")
        rules.append(PlaceholderRule(tokens, inputs.placeholders, specials.eos, device))
    if any(inputs.constraints_of()):  # a batch without terms takes none of the constraint paths
        c = inputs.constraints
        rules.append(TermRule(c if isinstance(c, Terms) else Terms(c), options.glossary_margin, specials.eos))
    return rules


def block_repeats(logits: Tensor, history: Tensor, n: int) -> None:
    """Forbid (in place) every token that would complete an n-gram already in its row's history.
    logits [R,V]; history [R,L]. The last n-1 tokens are compared with every earlier window; where one
    matches, the token that followed it is banned."""
    R, L = history.shape
    if n == 1:
        if L:
            logits.scatter_(1, history, NEG_INF)
        return
    if L < n:
        return
    windows = history.unfold(1, n - 1, 1)[:, : L - n + 1]  # [R, L-n+1, n-1]: windows that have a successor
    key = history[:, L - n + 1:]  # [R, n-1]: the current context
    match = (windows == key[:, None, :]).all(dim=2)  # [R, L-n+1]
    follow = history[:, n - 1:]  # [R, L-n+1]: the token after each window
    logits.scatter_add_(1, follow, torch.where(match, NEG_INF, 0.0).to(logits.dtype))
