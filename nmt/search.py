"""Greedy, beam and sampling search over the model's step protocol.

The search sees only `model.encode`, `model.init_cache`, `model.decode_step`,
`cache.reorder`, `model.max_positions` and, for the uncached path,
`model.decode`. Sentences are decoded together: beam rows are laid out
sentence-major (`row = sentence * K + beam`, B*K rows), and a sentence leaves
the batch as soon as it is finished, so the work shrinks as decoding goes on.

Shapes: B sentences, S source length, K beam, V target vocabulary,
N active sentences, t the current step (1-based).

Special ids come from `specials` (nmt/layout.py; the tokenizer's): the decoder starts from
`specials.start` (BOS for nmt's own models) and a hypothesis ends with `specials.eos`.

Conventions (shared by all searches; `StepRules` applies them at every step):
- Step t generates token t. PAD and the start token are never generated (log-prob -inf;
  `Specials.never_generated`); EOS is forbidden while t <= min_len, so an output has
  >= min_len tokens.
- A target prefix (per sentence, optional) is forced: at steps t <= len(prefix) only
  prefix[t-1] may be generated (its log-probability counts, except for the first `free_prefix`
  tokens, which count 0: the language token of an imported M2M100/NLLB model, as transformers'
  `forced_bos_token_id`), then the search continues.
- no_repeat_ngram N > 0: a token that would complete an N-gram already present in the
  hypothesis (prefix included) is forbidden, so no N-gram occurs twice.
- Placeholders (`Placeholders`, with --protect): a placeholder token that is not in the
  sentence's source, or is already in the hypothesis, is forbidden; EOS is forbidden while
  one of the source's is missing; and once no more steps are left before the length limit than
  placeholders are missing, only a missing one may be generated. So every output has each of its
  source's placeholders exactly once (one cut at the length limit too, when the limit has room
  for them all).
- A row left with no allowed token may end (EOS allowed).
- After a forced prefix, the first free step lets only the best candidate end (beam search).
- Maximum output length per sentence: `min(floor(a * src_len + b), model.max_positions - 1)`
  tokens (at least 1; at least len(prefix) + 1 with a prefix), src_len = `src_mask.sum(1)`
  (real source tokens, EOS included).
- A hypothesis ends when it generates EOS (`tokens` excludes it, `log_prob`
  includes it) or when it reaches the maximum length without EOS (truncated:
  no EOS, nothing added). Either way its **length for the penalty is the
  number of generated tokens including EOS**, i.e. the step t at which it ended.
- `log_prob` is the sum of fp32 `log_softmax` values, not changed by a temperature. The
  rules that depend on the hypothesis (min_len, n-gram blocking, placeholders) remove tokens
  before the softmax, so at a step where they removed some, the values are the model's
  renormalised over the allowed tokens (CTranslate2's semantics); PAD and the start token are
  removed after it, and forced prefix tokens keep the model's plain log-probability (0 for the
  first `free_prefix`). Without
  such a step, `log_prob` is what `nmt score` gives. `score = log_prob / lp(length)`. Greedy
  search and sampling apply no length penalty: their `score == log_prob`.
Sampling (`sample_search`) lives in nmt/sampling.py and uses the same step loop.
"""

from __future__ import annotations

import math

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt.cache import DecoderCache
from nmt.errors import Cancelled
from nmt.layout import NMT_SPECIALS, Specials
from nmt.schema import max_finished

PENALTY_TYPES = ("gnmt", "average", "none")
STOPPING = ("exact", "hf")
SAMPLING = ("topk", "topp")
NEG_INF = float("-inf")
Cancel = Callable[[], bool]  # checked before every decoding step: True stops the search (nmt.errors.Cancelled)


@dataclass(frozen=True)
class Hypothesis:
    """One output. tokens: generated ids without BOS/EOS; log_prob: summed token
    log-probabilities (EOS included when it was generated); score: log_prob after the length
    penalty; finished: it ended with EOS (False: it stopped at the maximum length)."""

    tokens: list[int]
    score: float
    log_prob: float
    finished: bool = True


@dataclass(frozen=True)
class SearchOps:
    """The tensor operations the search relies on. The plain ones (`PLAIN_OPS`) are torch's;
    nmt/fast.py provides faster CPU versions that compute the same results.

    topk(x [N,C], K) -> (values, indices) [N,K] (K <= C), best first; argmax(x [N,C]) ->
    (values, indices) [N]; cache_cls: the DecoderCache class to decode with.
    """

    topk: Callable[[Tensor, int], tuple[Tensor, Tensor]] = lambda x, k: x.topk(k, dim=1)
    argmax: Callable[[Tensor], tuple[Tensor, Tensor]] = lambda x: x.max(dim=1)
    cache_cls: type = DecoderCache


PLAIN_OPS = SearchOps()


def max_output_lengths(src_lengths: Sequence[int] | Tensor, max_len_a: float, max_len_b: int,
                       max_positions: int, prefixes: Sequence[list[int]] | None = None) -> list[int]:
    """Maximum output length per sentence, EOS counted: min(floor(a * src_len + b), max_positions - 1),
    at least 1, and with a prefix at least len(prefix) + 1 (room for the prefix and an EOS); src_len
    counts the source's EOS (the engines share this formula)."""
    lengths = src_lengths.tolist() if isinstance(src_lengths, Tensor) else list(src_lengths)
    cap = max(max_positions - 1, 1)
    limits = [max(1, min(math.floor(max_len_a * n + max_len_b), cap)) for n in lengths]
    if prefixes is not None:
        limits = [min(max(n, len(p) + 1), cap) for n, p in zip(limits, prefixes)]
    return limits


def length_penalty_factor(length: int | Tensor, alpha: float, kind: str) -> float | Tensor:
    """Divisor of a hypothesis' log_prob; length = generated tokens including EOS.

    gnmt: ((5 + length) / 6) ** alpha (Wu et al., 2016); average: length ** alpha; none: 1.
    Non-decreasing in length for alpha >= 0 (beam search's early stop relies on it).
    """
    if kind == "none" or alpha == 0:
        return torch.ones_like(length, dtype=torch.float) if isinstance(length, Tensor) else 1.0
    if kind == "gnmt":
        return ((5 + length) / 6) ** alpha
    if kind == "average":
        return length ** alpha
    raise ValueError(f"unknown length_penalty_type {kind!r} (expected one of {', '.join(PENALTY_TYPES)})")


# --------------------------------------------------------------------------- step protocol

class _CachedDecoder:
    """Incremental decoding through the model's DecoderCache: one position per step."""

    def __init__(self, model, memory: Tensor, src_mask: Tensor, max_len: int, ops: SearchOps):
        self.model = model
        self.cache = model.init_cache(memory, src_mask, max_len, cache_cls=ops.cache_cls)

    def step(self, tokens: Tensor) -> Tensor:
        """tokens [R] (position t-1) -> logits [R,V] for token t."""
        return self.model.decode_step(tokens, self.cache)

    def reorder(self, indices: Tensor) -> None:
        """Keep rows `indices` [R'] (beam reordering, expansion, dropping sentences)."""
        self.cache.reorder(indices)


class _UncachedDecoder:
    """Same protocol without a cache: keeps the prefix and re-runs `model.decode` on it every
    step, taking the last position (reference path for tests and benchmarks)."""

    def __init__(self, model, memory: Tensor, src_mask: Tensor, max_len: int, ops: SearchOps):
        self.model, self.memory, self.src_mask = model, memory, src_mask
        self.prefix = torch.empty(memory.shape[0], 0, dtype=torch.long, device=memory.device)  # [R, t-1]

    def step(self, tokens: Tensor) -> Tensor:
        self.prefix = torch.cat([self.prefix, tokens[:, None]], dim=1)  # [R, t]
        return self.model.decode(self.prefix, self.memory, self.src_mask)[:, -1]  # [R, V]

    def reorder(self, indices: Tensor) -> None:
        self.memory = self.memory.index_select(0, indices)
        self.src_mask = self.src_mask.index_select(0, indices)
        self.prefix = self.prefix.index_select(0, indices)


def _start(model, src: Tensor, src_mask: Tensor, max_len_a: float, max_len_b: int, use_cache: bool,
           ops: SearchOps, prefixes: Sequence[list[int]] | None = None):
    """Encode and set up decoding. -> (decoder over B rows, max output lengths [B] long)."""
    limits = max_output_lengths(src_mask.sum(dim=1), max_len_a, max_len_b, model.max_positions, prefixes)
    max_lens = torch.tensor(limits, dtype=torch.long, device=src.device)  # [B]
    memory = model.encode(src, src_mask)  # [B,S,D]
    cls = _CachedDecoder if use_cache else _UncachedDecoder
    return cls(model, memory, src_mask, max(limits), ops), max_lens


@dataclass(frozen=True)
class Placeholders:
    """Tokens the output must copy from its source (protected spans, nmt/protect.py): `tokens[k]` are
    the target ids that write placeholder k (a vocabulary may have several: `<ph_0>`, `▁<ph_0>`),
    `required[b]` the placeholders in sentence b's source. Each required one must be written
    exactly once (by any of its tokens); the others never (`StepRules`)."""

    tokens: list[list[int]]
    required: list[list[int]]


class StepRules:
    """What may be generated at each step (module docstring): PAD/start never, EOS not before
    min_len, the forced prefix, no repeated N-gram, placeholders copied exactly once. Rows are
    mapped to their sentence by `sent`.

    The rules that depend on the hypothesis (min_len, n-gram blocking, placeholders) remove tokens
    *before* the softmax: the search's distribution is the model's, renormalised over what they
    allow (CTranslate2's semantics; without it a hypothesis whose favourite token is blocked looks
    worse than it is, and beam search drops it for a shorter one). PAD and the start token are
    removed after it (their probability, ~0 for a trained model, is not redistributed), and a
    forced prefix token keeps the model's own log-probability (0 for the first `free_prefix` tokens)."""

    def __init__(self, device, min_len: int = 0, no_repeat_ngram: int = 0,
                 prefixes: Sequence[list[int]] | None = None, specials: Specials = NMT_SPECIALS,
                 placeholders: Placeholders | None = None, free_prefix: int = 0):
        self.min_len, self.n, self.specials, self.free_prefix = min_len, no_repeat_ngram, specials, free_prefix
        self.banned = torch.tensor(list(specials.never_generated), dtype=torch.long, device=device)
        self.prefix = self.prefix_len = None
        self.longest_prefix = 0
        if prefixes is not None and any(prefixes):
            self.longest_prefix = max(len(p) for p in prefixes)
            self.prefix = torch.tensor([list(p) + [specials.pad] * (self.longest_prefix - len(p)) for p in prefixes],
                                       dtype=torch.long, device=device)  # [B, P]
            self.prefix_len = torch.tensor([len(p) for p in prefixes], dtype=torch.long, device=device)  # [B]
        self.ph_ids = self.ph_of = self.ph_required = self.ph_onehot = None
        if placeholders is not None and any(placeholders.tokens):
            P = len(placeholders.tokens)
            pairs = [(i, k) for k, ids in enumerate(placeholders.tokens) for i in ids]
            self.ph_ids = torch.tensor([i for i, _ in pairs], dtype=torch.long, device=device)  # [Q] token ids
            self.ph_of = torch.tensor([k for _, k in pairs], dtype=torch.long, device=device)  # [Q] their placeholder
            self.ph_required = torch.tensor([[k in set(req) for k in range(P)] for req in placeholders.required],
                                            dtype=torch.bool, device=device)  # [B, P]
            self.ph_onehot = F.one_hot(self.ph_of, P).float()  # [Q, P]

    def prefix_lengths(self, sent: Tensor) -> Tensor | None:
        """len(prefix) of each row's sentence [R], or None without prefixes."""
        return None if self.prefix_len is None else self.prefix_len.index_select(0, sent)

    def log_probs(self, logits: Tensor, t: int, history: Tensor, sent: Tensor, limit: Tensor | None = None) -> Tensor:
        """logits [R,V] of step t -> fp32 log-probabilities [R,V] with the forbidden tokens at -inf.
        history [R, t-1]: the tokens generated so far; sent [R]: each row's sentence; limit [R]: each
        row's maximum output length (placeholders: what is missing is forced before it). `logits` is
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
        logp = F.log_softmax(self._apply_rules(logits, t, history, sent, limit), dim=-1)
        if self.banned.numel():
            logp.index_fill_(1, self.banned, NEG_INF)
        if forced is not None:
            rows, token, value = forced
            logp[rows] = NEG_INF
            logp[rows, token] = value
        return logp

    def _apply_rules(self, logits: Tensor, t: int, history: Tensor, sent: Tensor,
                     limit: Tensor | None = None) -> Tensor:
        """logits with the tokens min_len, n-gram blocking and the placeholders forbid at -inf (in
        place). A row left with nothing it may generate may end (with the model's EOS logit)."""
        EOS = self.specials.eos
        blocks_eos, blocks_ngram = t <= self.min_len, bool(self.n) and history.shape[1] >= self.n - 1
        if not (blocks_eos or blocks_ngram or self.ph_ids is not None):
            return logits
        eos = logits[:, EOS].clone()  # [R]: for a row left with nothing
        most = int(blocks_eos)  # how many tokens a row can have lost, at most (for the check below)
        if blocks_eos:
            logits[:, EOS] = NEG_INF
        if blocks_ngram and _block_repeats(logits, history, self.n):
            most += history.shape[1] if self.n == 1 else history.shape[1] - self.n + 1  # one per earlier window
        forced_rows = False
        if self.ph_ids is not None:
            required = self.ph_required.index_select(0, sent)  # [R, P]
            used = torch.zeros_like(required)
            if history.shape[1]:
                written = (history[:, :, None] == self.ph_ids).any(dim=1)  # [R, Q]: tokens already written
                used = (written.float() @ self.ph_onehot) > 0  # [R, P]: placeholders already written
            forbid = (~required | used).index_select(1, self.ph_of)  # [R, Q]
            logits[:, self.ph_ids] = logits[:, self.ph_ids].masked_fill(forbid, NEG_INF)
            missing = (required & ~used).sum(dim=1)  # [R]: EOS waits for every placeholder
            logits[:, EOS] = logits[:, EOS].masked_fill(missing > 0, NEG_INF)
            most += self.ph_ids.numel() + 1
            if limit is not None:  # steps t..limit are left: with no more than missing, write one now
                must = ((missing > 0) & (missing >= limit - t + 1)).nonzero().squeeze(1)
                if must.numel():
                    only = torch.full((must.numel(), logits.shape[1]), NEG_INF, dtype=logits.dtype, device=logits.device)
                    only[:, self.ph_ids] = logits[must][:, self.ph_ids]  # the allowed (missing) placeholders
                    logits[must] = only
                    forced_rows = True
        if forced_rows or most >= logits.shape[1] - self.banned.numel():  # else every row keeps some token
            allowed = torch.isfinite(logits)
            if self.banned.numel():
                allowed.index_fill_(1, self.banned, False)
            dead = ~allowed.any(dim=1)
            if bool(dead.any()):
                logits[dead, EOS] = eos[dead]
        return logits


def _block_repeats(logp: Tensor, history: Tensor, n: int) -> bool:
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


# --------------------------------------------------------------------------- greedy

@torch.inference_mode()
def greedy_search(model, src: Tensor, src_mask: Tensor, *, max_len_a: float, max_len_b: int, min_len: int = 0,
                  no_repeat_ngram: int = 0, prefixes: Sequence[list[int]] | None = None,
                  placeholders: Placeholders | None = None, use_cache: bool = True, ops: SearchOps = PLAIN_OPS,
                  specials: Specials = NMT_SPECIALS, free_prefix: int = 0,
                  cancel: Cancel | None = None) -> list[Hypothesis]:
    """Most probable next token at every step. src, src_mask [B,S] -> one Hypothesis per sentence
    (score == log_prob: no length penalty). Finished sentences leave the batch. cancel: see `Cancel`."""
    check_common(min_len, no_repeat_ngram, prefixes, src.shape[0], specials)
    rules = StepRules(src.device, min_len, no_repeat_ngram, prefixes, specials, placeholders, free_prefix)
    out = token_by_token(model, src, src_mask, None, 1, max_len_a, max_len_b, rules, prefixes, use_cache, ops, cancel)
    return [hyps[0] for hyps in out]


def token_by_token(model, src: Tensor, src_mask: Tensor, choose, per_sentence: int, max_len_a: float,
                   max_len_b: int, rules: StepRules, prefixes, use_cache: bool, ops: SearchOps,
                   cancel: Cancel | None = None) -> list[list[Hypothesis]]:
    """One token per row per step: the best one (choose None) or choose(logp, t, rows) -> tokens.
    per_sentence rows per sentence (samples). Finished rows leave the batch. -> per sentence its rows'
    hypotheses, in row order. cancel: see `Cancel`."""
    B, device = src.shape[0], src.device
    if B == 0:
        return []
    decoder, max_lens = _start(model, src, src_mask, max_len_a, max_len_b, use_cache, ops, prefixes)
    R = B * per_sentence
    rows = torch.arange(R, device=device)  # [N] original row of each active row (sentence * per_sentence + k)
    if per_sentence > 1:
        decoder.reorder(torch.arange(B, device=device).repeat_interleave(per_sentence))
        max_lens = max_lens.repeat_interleave(per_sentence)
    EOS = rules.specials.eos
    tokens = torch.full((R,), rules.specials.start, dtype=torch.long, device=device)  # [N] input of this step
    log_prob = torch.zeros(R, device=device)  # [N]
    history = torch.empty(R, 0, dtype=torch.long, device=device)  # [N, t-1]
    out: list[list[Hypothesis | None]] = [[None] * per_sentence for _ in range(B)]
    for t in range(1, int(max_lens.max()) + 1):
        if cancel is not None and cancel():
            raise Cancelled()
        logp = rules.log_probs(decoder.step(tokens), t, history, rows // per_sentence, max_lens)  # [N,V]
        if choose is None:
            best, tokens = ops.argmax(logp)  # [N], [N]
        else:
            tokens = choose(logp, t, rows)
            best = logp.gather(1, tokens[:, None]).squeeze(1)
        log_prob = log_prob + best
        history = torch.cat([history, tokens[:, None]], dim=1)
        ends = (tokens == EOS) | (max_lens <= t)  # [N]
        if not bool(ends.any()):
            continue
        idx = ends.nonzero().squeeze(1)
        for r, toks, lp in zip(rows[idx].tolist(), history[idx].tolist(), log_prob[idx].tolist()):
            finished = toks[-1] == EOS
            if finished:
                toks.pop()
            out[r // per_sentence][r % per_sentence] = Hypothesis(toks, lp, lp, finished)
        keep = (~ends).nonzero().squeeze(1)  # [N']
        if keep.numel() == 0:
            break
        decoder.reorder(keep)
        rows, tokens, log_prob, history, max_lens = (x[keep] for x in (rows, tokens, log_prob, history, max_lens))
    return out  # type: ignore[return-value]


# --------------------------------------------------------------------------- beam

@torch.inference_mode()
def beam_search(model, src: Tensor, src_mask: Tensor, *, beam_size: int, nbest: int = 1,
                length_penalty: float = 1.0, length_penalty_type: str = "gnmt",
                max_len_a: float, max_len_b: int, min_len: int = 0, no_repeat_ngram: int = 0,
                prefixes: Sequence[list[int]] | None = None, placeholders: Placeholders | None = None,
                use_cache: bool = True, ops: SearchOps = PLAIN_OPS,
                specials: Specials = NMT_SPECIALS, free_prefix: int = 0,
                keep_all: bool = False, patience: float = 0.0, stopping: str = "exact",
                cancel: Cancel | None = None) -> list[list[Hypothesis]]:
    """Batched beam search. src, src_mask [B,S] -> per sentence up to `nbest` hypotheses, best first.

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
    would give under it: the live beams never depend on the penalty (nmt/tune.py). (A minimum
    length cannot: it renormalises the distribution, which moves the live beams.)

    patience > 0: a sentence also stops once `max_finished(K, patience)` candidates have ended in
    its top K (counted from the start, whether or not they enter the n-best): fairseq's rule
    (patience 1) and CTranslate2's `patience` (Kasai et al., 2022). Faster with a length penalty,
    where the exact stop waits for a bound that is loose; a longer hypothesis that would have won
    can then be missed. With keep_all the count still applies (it does not depend on the penalty).

    stopping "hf": transformers' rule (`generate()` with `early_stopping=False`, its default) instead of
    the exact stop: each sentence keeps its K best finished hypotheses (not only nbest), and stops once
    it has K of them and its best live beam, scored with the penalty at its *current* length, does not
    beat the K-th (`_stopped`). With a length penalty that can stop before a longer hypothesis
    that would have won (transformers' heuristic); without one it is exact as the default is.
    keep_all needs the exact stop (the heuristic depends on the penalty).

    cancel: see `Cancel`.
    """
    _check_beam_args(beam_size, nbest, length_penalty, length_penalty_type, patience, stopping)
    if keep_all and stopping != "exact":
        raise ValueError("keep_all needs stopping='exact' (the hf rule depends on the length penalty)")
    check_common(min_len, no_repeat_ngram, prefixes, src.shape[0], specials)
    alpha, kind, K, EOS = length_penalty, length_penalty_type, beam_size, specials.eos
    if src.shape[0] == 0:
        return []
    decoder, max_lens = _start(model, src, src_mask, max_len_a, max_len_b, use_cache, ops, prefixes)
    B, device = src.shape[0], src.device
    rules = StepRules(device, min_len, no_repeat_ngram, prefixes, specials, placeholders, free_prefix)
    best_possible_lp = length_penalty_factor(max_lens.float(), alpha, kind)  # [N] penalty at the maximum length
    sent = torch.arange(B, device=device)  # [N] original index of each active sentence
    scores = torch.zeros(B, 1, device=device)  # [N, k] summed log-prob of each live beam; -inf = empty
    tokens = torch.full((B,), specials.start, dtype=torch.long, device=device)  # [N*k] input of this step
    history = torch.empty(B, 0, dtype=torch.long, device=device)  # [N*k, t-1] generated tokens
    pool = K if stopping == "hf" else nbest  # finished hypotheses the stopping rule compares with
    kth_best = torch.full((B, pool), NEG_INF, device=device)  # [N, pool] best finished scores, sorted
    most = max_finished(K, patience)  # 0: the exact stop only
    n_done = torch.zeros(B, dtype=torch.long, device=device)  # [N] candidates ended so far (with patience)
    finished: list[list[Hypothesis]] = [[] for _ in range(B)]
    for t in range(1, int(max_lens.max()) + 1):
        if cancel is not None and cancel():
            raise Cancelled()
        N, k = scores.shape  # k = 1 at the first step (all beams share the prefix BOS), then K
        logp = rules.log_probs(decoder.step(tokens), t, history, sent.repeat_interleave(k),
                               max_lens.repeat_interleave(k) if rules.ph_ids is not None else None)  # [N*k, V]
        V = logp.shape[1]
        top, idx = _topk(logp.add_(scores.view(-1, 1)).view(N, k * V), 2 * K, ops)  # [N, 2K] (in place: logp is fresh)
        word = idx % V  # [N, 2K] token of each candidate
        rows = idx // V + (torch.arange(N, device=device) * k)[:, None]  # [N, 2K] row of its parent beam
        alive = top > NEG_INF
        ends = (word == EOS) | (max_lens <= t)[:, None]  # [N, 2K]
        empty = _after_prefix(rules, sent, t, word, K, EOS)  # [N, 2K] or None: EOS ranked 2..K after a prefix
        if empty is not None:
            top, ends = top.masked_fill(empty, NEG_INF), ends & ~empty  # a live slot with no hypothesis
        ended = ends & alive & (torch.arange(2 * K, device=device) < K)  # endings in the top K finish
        score = top / length_penalty_factor(t, alpha, kind)  # [N, 2K] penalised score if the candidate ends now
        enters = ended & (score > kth_best[:, -1:])  # can still be in the n-best (keep_all: kth_best stays -inf)
        if bool(enters.any()):
            _collect(finished, enters, sent, history, rows, word, top, score, EOS)
            if not keep_all:
                new = score.masked_fill(~ended, NEG_INF)
                kth_best = torch.cat([kth_best, new], dim=1).topk(pool, dim=1).values
        if most:
            n_done = n_done + ended.sum(dim=1)
        live = alive & ~ends  # [N, 2K]
        rank = torch.arange(2 * K, device=device)
        sel = torch.where(live, rank, rank + 2 * K).argsort(dim=1)[:, :K]  # [N, K] the K best live candidates
        scores = top.gather(1, sel).masked_fill(~live.gather(1, sel), NEG_INF)  # [N, K] live beams; -inf = empty
        rows, word = rows.gather(1, sel), word.gather(1, sel)
        if stopping == "hf":
            keep = ~_stopped(scores, kth_best, length_penalty_factor(t, alpha, kind))
        else:
            keep = ~_stopped(scores, kth_best, best_possible_lp)  # keep_all: stops only with no live beam
        if most:
            keep &= n_done < most
        if not bool(keep.all()):
            if not bool(keep.any()):
                break
            sent, max_lens, best_possible_lp, kth_best, scores, rows, word, n_done = (
                x[keep] for x in (sent, max_lens, best_possible_lp, kth_best, scores, rows, word, n_done))
        flat = rows.reshape(-1)  # [N'*K] parent rows of the next step's beams
        decoder.reorder(flat)
        history = torch.cat([history.index_select(0, flat), word.reshape(-1, 1)], dim=1)
        tokens = word.reshape(-1)
    return [sorted(hyps, key=lambda h: -h.score)[: None if keep_all else nbest] for hyps in finished]


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


def _check_beam_args(beam_size: int, nbest: int, alpha: float, kind: str, patience: float = 0.0,
                     stopping: str = "exact") -> None:
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    if not 1 <= nbest <= beam_size:
        raise ValueError(f"nbest must be between 1 and beam_size={beam_size}, got {nbest}")
    if kind not in PENALTY_TYPES:
        raise ValueError(f"unknown length_penalty_type {kind!r} (expected one of {', '.join(PENALTY_TYPES)})")
    if alpha < 0:
        raise ValueError(f"length_penalty must be >= 0, got {alpha}")
    if not patience >= 0 or (patience > 0 and max_finished(beam_size, patience) < 1):
        raise ValueError(f"patience must be 0 or leave round(beam_size * patience) >= 1, got {patience}")
    if stopping not in STOPPING:
        raise ValueError(f"unknown stopping {stopping!r} (expected one of {', '.join(STOPPING)})")


def check_common(min_len: int, no_repeat_ngram: int, prefixes, B: int, specials: Specials = NMT_SPECIALS) -> None:
    """The search boundary's guard for the settings every search takes."""
    if min_len < 0:
        raise ValueError(f"min_len must be >= 0, got {min_len}")
    if no_repeat_ngram < 0:
        raise ValueError(f"no_repeat_ngram must be >= 0, got {no_repeat_ngram}")
    if prefixes is not None:
        if len(prefixes) != B:
            raise ValueError(f"{len(prefixes)} prefixes for {B} sentences")
        if any(t in (specials.pad, specials.start, specials.eos) for p in prefixes for t in p):
            raise ValueError("a prefix cannot contain PAD, the start token or EOS")
