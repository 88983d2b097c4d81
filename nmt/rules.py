"""The step rules: what each search may generate at each step (nmt/search.py's docstring has the
conventions). `StepRules(options, inputs, device)` is the one place they are built, once per batch
(they hold the batch's prefixes and placeholders as tensors); every search calls its `log_probs` at
every step.

Shapes: B sentences, R rows (each row belongs to sentence `sent[r]`), V vocabulary, P placeholders,
Q placeholder tokens, t the current step (1-based).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt.constraints import Constraints, ConstraintState
from nmt.search_options import SearchInputs, SearchOptions, Terms, room_needed

NEG_INF = float("-inf")


class StepRules:
    """What may be generated at each step: PAD/start never, EOS not before min_len, the forced
    prefix, no repeated N-gram, placeholders copied exactly once. Rows are mapped to their sentence
    by `sent`.

    The rules that depend on the hypothesis (min_len, n-gram blocking, placeholders) remove tokens
    *before* the softmax: the search's distribution is the model's, renormalised over what they
    allow (CTranslate2's semantics; without it a hypothesis whose favourite token is blocked looks
    worse than it is, and beam search drops it for a shorter one). PAD and the start token are
    removed after it (their probability, ~0 for a trained model, is not redistributed), and a
    forced prefix token keeps the model's own log-probability (0 for the first `free_prefix` tokens).

    Built from the search's options and one batch's inputs (`inputs.check`: ValueError when they do
    not fit a batch of B sentences).
    """

    def __init__(self, options: SearchOptions, inputs: SearchInputs, B: int, device):
        inputs.check(B, options)
        specials = options.specials
        self.min_len, self.n, self.specials = options.min_len, options.no_repeat_ngram, specials
        self.free_prefix = options.free_prefix
        self.banned = torch.tensor(list(specials.never_generated), dtype=torch.long, device=device)
        self.prefix = self.prefix_len = None
        self.longest_prefix = 0
        prefixes = inputs.prefixes
        if prefixes is not None and any(prefixes):
            self.longest_prefix = max(len(p) for p in prefixes)
            self.prefix = torch.tensor([list(p) + [specials.pad] * (self.longest_prefix - len(p)) for p in prefixes],
                                       dtype=torch.long, device=device)  # [B, P]
            self.prefix_len = torch.tensor([len(p) for p in prefixes], dtype=torch.long, device=device)  # [B]
        self.ph_ids = self.ph_of = self.ph_required = self.ph_onehot = None
        tokens = options.placeholder_tokens
        if tokens is not None and any(tokens):
            if inputs.placeholders is None:
                raise ValueError("placeholder_tokens need each sentence's placeholders (SearchInputs.placeholders)")
            P = len(tokens)
            pairs = [(i, k) for k, ids in enumerate(tokens) for i in ids]
            self.ph_ids = torch.tensor([i for i, _ in pairs], dtype=torch.long, device=device)  # [Q] token ids
            self.ph_of = torch.tensor([k for _, k in pairs], dtype=torch.long, device=device)  # [Q] their placeholder
            self.ph_required = torch.tensor([[k in set(req) for k in range(P)] for req in inputs.placeholders],
                                            dtype=torch.bool, device=device)  # [B, P]
            self.ph_onehot = F.one_hot(self.ph_of, P).float()  # [Q, P]
        self.terms, self.needed, self.device = None, None, device
        seqs = inputs.constraints_of()
        if any(seqs):  # a batch without terms takes none of the constraint paths
            c = inputs.constraints
            self.terms = c if isinstance(c, Terms) else Terms(c)
            prefixes, placeholders = inputs.prefixes or [[]] * B, inputs.placeholders or [[]] * B
            self.needed = [room_needed(len(p), cs, len(ph) if self.ph_ids is not None else 0)
                           for p, cs, ph in zip(prefixes, seqs, placeholders)]

    def constraint_state(self, sent: Tensor, V: int) -> ConstraintState | None:
        """The constraints' state of rows of sentences sent [R] before their first token (None
        without terms); V: the model's output size."""
        if self.terms is None:
            return None
        terms = self.terms
        cons = Constraints.build([[list(q) for q in cs] for cs in terms.seqs], self.device, joins=terms.joins,
                                 open_end=terms.open_end, vocab_size=V)
        return cons.state(sent)

    def prefix_lengths(self, sent: Tensor) -> Tensor | None:
        """len(prefix) of each row's sentence [R], or None without prefixes."""
        return None if self.prefix_len is None else self.prefix_len.index_select(0, sent)

    def log_probs(self, logits: Tensor, t: int, history: Tensor, sent: Tensor, limit: Tensor | None = None,
                  state: ConstraintState | None = None) -> Tensor:
        """logits [R,V] of step t -> fp32 log-probabilities [R,V] with the forbidden tokens at -inf.
        history [R, t-1]: the tokens generated so far; sent [R]: each row's sentence; limit [R]: each
        row's maximum output length (placeholders and terms: what is missing is forced before it);
        state: the rows' constraints (`constraint_state`), which the search advances. `logits` is
        the search's own (a decoding step's fresh output): the rules mask it in place."""
        logits = logits.float()
        forced = None
        if self.prefix is not None and t <= self.longest_prefix:
            rows = (self.prefix_len.index_select(0, sent) >= t).nonzero().squeeze(1)  # rows still in their prefix
            if rows.numel():
                token = self.prefix.index_select(0, sent.index_select(0, rows))[:, t - 1]  # [F]
                if t > self.free_prefix:  # the model's own log-probability, before any rule masks
                    value = F.log_softmax(logits.index_select(0, rows), dim=-1).gather(1, token[:, None]).squeeze(1)
                else:
                    value = 0.0  # a free prefix token (the language token of an imported model) counts 0
                forced = rows, token, value
        logp = F.log_softmax(self._apply_rules(logits, t, history, sent, limit, state), dim=-1)
        if self.banned.numel():
            logp.index_fill_(1, self.banned, NEG_INF)
        if forced is not None:
            rows, token, value = forced
            logp[rows] = NEG_INF
            logp[rows, token] = value
        return logp

    def _apply_rules(self, logits: Tensor, t: int, history: Tensor, sent: Tensor,
                     limit: Tensor | None = None, state: ConstraintState | None = None) -> Tensor:
        """logits with the tokens min_len, n-gram blocking, the placeholders and the terms forbid at
        -inf (in place). A row left with nothing it may generate may end (with the model's EOS logit).
        Terms (nmt/constraints.py): n-gram blocking never removes a token that advances one, and the
        length limit forces placeholders and terms by one rule (`ConstraintState.apply`)."""
        EOS = self.specials.eos
        blocks_eos, blocks_ngram = t <= self.min_len, bool(self.n) and history.shape[1] >= self.n - 1
        if not (blocks_eos or blocks_ngram or self.ph_ids is not None or state is not None):
            return logits
        eos = logits[:, EOS].clone()  # [R]: for a row left with nothing
        most = int(blocks_eos)  # how many tokens a row can have lost, at most (for the check below)
        if blocks_eos:
            logits[:, EOS] = NEG_INF
        if blocks_ngram:
            raw = logits.clone() if state is not None else None
            if block_repeats(logits, history, self.n):
                most += history.shape[1] if self.n == 1 else history.shape[1] - self.n + 1  # one per earlier window
                if raw is not None:  # the terms win over no_repeat_ngram
                    logits = torch.where(state.next_token_mask(logits.shape[1]), raw, logits)
        forced_rows, missing = False, None
        if self.ph_ids is not None:
            forced_rows, missing = self._placeholders(logits, t, history, sent, None if state is not None else limit)
            most += self.ph_ids.numel() + 1
        if state is not None:
            extra, extra_tokens = missing if missing is not None else (None, None)
            state.apply(logits, limit - t + 1, EOS, extra, extra_tokens)
            forced_rows = True
        if forced_rows or most >= logits.shape[1] - self.banned.numel():  # else every row keeps some token
            dead = self._dead_rows(logits)
            if bool(dead.any()):
                logits[dead, EOS] = eos[dead]
        return logits

    def _dead_rows(self, logits: Tensor) -> Tensor:
        """[R] bool: rows whose every token but the never-generated ones is at -inf. One reduction over
        the row (the banned columns set to -inf for it, then put back: log_softmax still sees them)."""
        if not self.banned.numel():
            return logits.amax(dim=1) == NEG_INF
        saved = logits.index_select(1, self.banned)
        logits.index_fill_(1, self.banned, NEG_INF)
        dead = logits.amax(dim=1) == NEG_INF
        logits.index_copy_(1, self.banned, saved)
        return dead

    def _placeholders(self, logits: Tensor, t: int, history: Tensor, sent: Tensor,
                      limit: Tensor | None) -> tuple[bool, tuple[Tensor, Tensor]]:
        """Mask (in place) the placeholders a row may not write and EOS while one is missing; once no
        more steps are left than placeholders are missing (with `limit`), only a missing one. ->
        (whether any row was so forced, (missing [R]: how many each row still needs, their tokens
        [R, V] bool)): with terms, `ConstraintState.apply` forces them, not this."""
        required = self.ph_required.index_select(0, sent)  # [R, P]
        used = torch.zeros_like(required)
        if history.shape[1]:
            written = (history[:, :, None] == self.ph_ids).any(dim=1)  # [R, Q]: tokens already written
            used = (written.float() @ self.ph_onehot) > 0  # [R, P]: placeholders already written
        forbid = (~required | used).index_select(1, self.ph_of)  # [R, Q]
        logits[:, self.ph_ids] = logits[:, self.ph_ids].masked_fill(forbid, NEG_INF)
        missing = (required & ~used).sum(dim=1)  # [R]: EOS waits for every placeholder
        logits[:, self.specials.eos] = logits[:, self.specials.eos].masked_fill(missing > 0, NEG_INF)
        if limit is None:
            tokens = torch.zeros(logits.shape, dtype=torch.bool, device=logits.device)
            tokens[:, self.ph_ids] = ~forbid  # the missing placeholders' tokens
            return False, (missing, tokens)
        must = ((missing > 0) & (missing >= limit - t + 1)).nonzero().squeeze(1)  # steps t..limit are left
        if not must.numel():
            return False, None
        only = torch.full((must.numel(), logits.shape[1]), NEG_INF, dtype=logits.dtype, device=logits.device)
        only[:, self.ph_ids] = logits[must][:, self.ph_ids]  # the allowed (missing) placeholders
        logits[must] = only
        return True, None


def block_repeats(logp: Tensor, history: Tensor, n: int) -> bool:
    """Forbid (in place) every token that would complete an n-gram already in its row's history;
    returns whether any token was forbidden. logp [R,V]; history [R,L]. The last n-1 tokens are
    compared with every earlier window; where one matches, the token that followed it is banned."""
    R, L = history.shape
    if n == 1:
        if L:
            logp.scatter_(1, history, NEG_INF)
        return bool(L)
    if L < n:
        return False
    windows = history.unfold(1, n - 1, 1)[:, : L - n + 1]  # [R, L-n+1, n-1]: windows that have a successor
    key = history[:, L - n + 1:]  # [R, n-1]: the current context
    match = (windows == key[:, None, :]).all(dim=2)  # [R, L-n+1]
    if not bool(match.any()):
        return False
    follow = history[:, n - 1:]  # [R, L-n+1]: the token after each window
    logp.scatter_add_(1, follow, torch.where(match, NEG_INF, 0.0).to(logp.dtype))
    return True
