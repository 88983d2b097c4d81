"""Reference constrained searches (issue 37), and the brute force they are checked against.

`reference_greedy` / `reference_beam` are plain searches over the step protocol (encode, init_cache,
decode_step, cache.reorder) built on nmt.search.constraints, with nmt.search's conventions (StepRules'
order: rules before the softmax, PAD/start removed after it, a forced prefix keeps the model's own
log-probability; the endings among the first K candidates finish, the first K live ones continue; at
the first step after a prefix only the best candidate may end) but no early stop: they run until no
beam is left, or (`reference_beam`'s `stop_after`) until a sentence has had that many endings among its
first K candidates (patience's count, which the real search applies to sentences with terms). They are
the reference the real search must equal once it takes constraints.

`brute_force` enumerates every output in plain Python with its own implementation of the rules
(constraint status by scanning the output, not by nmt.search.constraints' automaton).
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field
from typing import NamedTuple, Sequence

import torch
import torch.nn.functional as F

from nmt.search.constraints import Constraints, allocate
from nmt.text.tokenizer import BOS_ID, EOS_ID, PAD_ID

BANNED = (PAD_ID, BOS_ID)


class Hyp(NamedTuple):
    tokens: list
    score: float
    log_prob: float
    finished: bool


@dataclass
class Rules:
    """The search settings a reference search and the brute force share. limits: per sentence, the
    maximum output length; ph_tokens: the fake vocabulary's placeholder tokens (one token each),
    ph_required[b] those sentence b must write exactly once; prefixes[b]: forced first tokens."""

    limits: list
    no_repeat_ngram: int = 0
    ph_tokens: Sequence[int] = ()
    ph_required: list = field(default_factory=list)
    prefixes: list | None = None
    alpha: float = 0.0
    kind: str = "none"
    margin: float = math.inf  # decode.glossary_margin (beam search's term candidates)


def penalty(length: int, rules: Rules) -> float:
    if rules.kind == "gnmt":
        return ((5 + length) / 6) ** rules.alpha
    return length ** rules.alpha if rules.kind == "average" else 1.0


def blocked(history: list, n: int) -> set:
    """Tokens that would complete an n-gram already in `history`."""
    if not n or len(history) < n - 1:
        return set()
    key = tuple(history[len(history) - n + 1:]) if n > 1 else ()
    return {history[i + n - 1] for i in range(len(history) - n + 1) if tuple(history[i:i + n - 1]) == key}


# --------------------------------------------------------------------------- tensor reference

def step_log_probs(logits, t, histories, sent, state, rules: Rules):
    """The search's distribution at step t for rows of sentences sent [R] (StepRules' order)."""
    logits, raw = logits.float().clone(), logits.float().clone()
    R, V = logits.shape
    for r, h in enumerate(histories):
        for tok in blocked(h, rules.no_repeat_ngram):
            logits[r, tok] = float("-inf")
    logits = torch.where(state.next_token_mask(V), raw, logits)  # constraints win over blocking
    extra = extra_tokens = None
    if rules.ph_tokens:
        extra, extra_tokens = torch.zeros(R, dtype=torch.long), torch.zeros(R, V, dtype=torch.bool)
        for r, (h, b) in enumerate(zip(histories, sent.tolist())):
            required = rules.ph_required[b]
            for p in rules.ph_tokens:
                if p not in required or p in h:
                    logits[r, p] = float("-inf")
            missing = [p for p in required if p not in h]
            extra[r], extra_tokens[r, missing] = len(missing), True
            if missing:
                logits[r, EOS_ID] = float("-inf")
    limits = torch.tensor(rules.limits)[sent]
    logits[:, EOS_ID] = logits[:, EOS_ID].masked_fill(~state.eos_allowed(), float("-inf"))
    must, allowed, exclusive = state.forced(limits - t + 1, V, extra)
    if extra_tokens is not None:  # the missing placeholders, unless a started term must go on
        allowed |= extra_tokens & ~exclusive[:, None]
    logits[must] = logits[must].masked_fill(~allowed[must], float("-inf"))
    allowed = torch.isfinite(logits)
    allowed[:, list(BANNED)] = False
    dead = ~allowed.any(dim=1)
    logits[dead, EOS_ID] = raw[dead, EOS_ID]
    logp = F.log_softmax(logits, dim=-1)
    logp[:, list(BANNED)] = float("-inf")
    for r, b in enumerate(sent.tolist()):
        prefix = rules.prefixes[b] if rules.prefixes else []
        if t <= len(prefix):
            logp[r] = float("-inf")
            logp[r, prefix[t - 1]] = F.log_softmax(raw[r], dim=-1)[prefix[t - 1]]
    return logp


def _start(model, src, src_mask, rules):
    memory = model.encode(src, src_mask)
    return model.init_cache(memory, src_mask, max(rules.limits))


def reference_greedy(model, src, src_mask, cons: Constraints, rules: Rules) -> list[Hyp]:
    B = src.shape[0]
    cache = _start(model, src, src_mask, rules)
    sent = torch.arange(B)
    state = cons.state(sent)
    tokens, lp, hist = torch.full((B,), BOS_ID), torch.zeros(B), [[] for _ in range(B)]
    out: list = [None] * B
    for t in range(1, max(rules.limits) + 1):
        logp = step_log_probs(model.decode_step(tokens, cache), t, hist, sent, state, rules)
        best, tokens = logp.max(dim=1)
        lp = lp + best
        state.advance(tokens)
        hist = [h + [w] for h, w in zip(hist, tokens.tolist())]
        keep = []
        for r, b in enumerate(sent.tolist()):
            if tokens[r] == EOS_ID or rules.limits[b] <= t:
                eos = int(tokens[r]) == EOS_ID
                out[b] = Hyp(hist[r][:-1] if eos else hist[r], float(lp[r]), float(lp[r]), eos)
            else:
                keep.append(r)
        if not keep:
            break
        idx = torch.tensor(keep)
        cache.reorder(idx)
        state.reorder(idx)
        sent, tokens, lp, hist = sent[idx], tokens[idx], lp[idx], [hist[r] for r in keep]
    return out


def reference_beam(model, src, src_mask, cons: Constraints, rules: Rules, K: int, nbest: int,
                   stop_after: Sequence[int] | None = None) -> list[list[Hyp]]:
    """stop_after[b]: sentence b stops after that many endings among its first K candidates (0: never)."""
    B = src.shape[0]
    ends = [0] * B
    cache = _start(model, src, src_mask, rules)
    sent = torch.arange(B)
    state = cons.state(sent)
    scores, tokens, hist = torch.zeros(B, 1), torch.full((B,), BOS_ID), [[] for _ in range(B)]
    finished: list = [[] for _ in range(B)]
    for t in range(1, max(rules.limits) + 1):
        N, k = scores.shape
        logp = step_log_probs(model.decode_step(tokens, cache), t, hist, sent.repeat_interleave(k), state, rules)
        V = logp.shape[1]
        top, idx = allocate(state, (logp + scores.view(-1, 1)).view(N, k * V), K, margin=rules.margin)  # [N, 2K]
        word, parent = idx % V, idx // V + (torch.arange(N) * k)[:, None]
        beams = []
        for n, b in enumerate(sent.tolist()):
            plen = len(rules.prefixes[b]) if rules.prefixes else 0
            live = []
            for j in range(2 * K):
                w, s, r = int(word[n, j]), float(top[n, j]), int(parent[n, j])
                if s == float("-inf"):
                    continue
                if w == EOS_ID or rules.limits[b] <= t:
                    if j < K and not (w == EOS_ID and plen and t == plen + 1 and j >= 1):
                        toks = hist[r] + ([] if w == EOS_ID else [w])
                        finished[b].append(Hyp(toks, s / penalty(t, rules), s, w == EOS_ID))
                        ends[b] += 1
                elif len(live) < K:
                    live.append((r, w, s))
            if stop_after and stop_after[b] and ends[b] >= stop_after[b]:
                live = []
            beams.append(live + [(n * k, PAD_ID, float("-inf"))] * (K - len(live)))
        alive = [n for n, live in enumerate(beams) if live[0][2] > float("-inf")]
        if not alive:
            break
        flat = torch.tensor([r for n in alive for r, _, _ in beams[n]])
        words = torch.tensor([w for n in alive for _, w, _ in beams[n]])
        scores = torch.tensor([[s for _, _, s in beams[n]] for n in alive])
        cache.reorder(flat)
        state.reorder(flat)
        state.advance(words)
        hist = [hist[r] + [w] for r, w in zip(flat.tolist(), words.tolist())]
        sent, tokens = sent[torch.tensor(alive)], words
    return [ranked(f, bool(cons.lengths[b].sum()))[:nbest] for b, f in enumerate(finished)]


def ranked(hyps: list[Hyp], terms: bool) -> list[Hyp]:
    """Best first: by score; a sentence with terms puts the hypotheses that ended with EOS before
    those the length limit ended."""
    return sorted(hyps, key=lambda h: (terms and not h.finished, -h.score))


# --------------------------------------------------------------------------- brute force

def status(history: list, seq: list, open_end: bool, joins) -> tuple[str, int]:
    """("done" | "complete" | "progress", progress) of one constraint after `history`, by scanning it."""
    L = len(seq)
    for i in range(len(history) - L + 1):
        if history[i:i + L] == seq and (not open_end or (i + L < len(history) and not joins[history[i + L]])):
            return "done", L
    if len(history) >= L and history[len(history) - L:] == seq:
        return "complete", L
    return "progress", max(q for q in range(L) if q == 0 or history[len(history) - q:] == seq[:q])


def contains(output: list, seq: list, open_end: bool = False, joins=None) -> bool:
    """Whether the output holds `seq` (whole-word: not followed by a joining token, when open_end)."""
    return status(output, seq, open_end, joins)[0] != "progress"


def brute_force(model, src: tuple, seqs: list, rules: Rules, b: int = 0, open_end=None, joins=None) -> list[Hyp]:
    """Every output of sentence b the rules allow, scored by the search's distribution, best first."""
    open_end = open_end or [False] * len(seqs)
    limit, prefix = rules.limits[b], (rules.prefixes[b] if rules.prefixes else [])
    required = rules.ph_required[b] if rules.ph_tokens else []
    out: list[Hyp] = []

    def expand(h: list, lp: float) -> None:
        t = len(h) + 1
        raw = model.logits(src, (BOS_ID,) + tuple(h)).float()
        if t <= len(prefix):
            logp = torch.full_like(raw, float("-inf"))
            logp[prefix[t - 1]] = F.log_softmax(raw, dim=-1)[prefix[t - 1]]
        else:
            logp = _brute_step(raw, h, seqs, open_end, joins, rules, required, limit - t + 1)
        for w in range(len(logp)):
            if logp[w] == float("-inf"):
                continue
            total = lp + float(logp[w])
            if w == EOS_ID:
                out.append(Hyp(h, total / penalty(t, rules), total, True))
            elif t == limit:
                out.append(Hyp(h + [w], total / penalty(t, rules), total, False))
            else:
                expand(h + [w], total)
    expand([], 0.0)
    return ranked(out, bool(seqs))


def _brute_step(raw, h, seqs, open_end, joins, rules, required, steps_left):
    st = [status(h, s, e, joins) for s, e in zip(seqs, open_end)]
    unmet = [(s, p) for s, (kind, p) in zip(seqs, st) if kind == "progress"]
    ban = blocked(h, rules.no_repeat_ngram) - {s[p] for s, p in unmet}
    ban |= {p for p in rules.ph_tokens if p not in required or p in h}
    ph_missing = [p for p in required if p not in h]
    if unmet or ph_missing:
        ban.add(EOS_ID)
    started = max([p for _, p in unmet] + [0])
    need = sum(len(s) for s, _ in unmet) - started
    full = sum(len(s) for s, (kind, _) in zip(seqs, st) if kind != "done")
    pending = any(kind == "complete" for kind, _ in st)
    if (need + len(ph_missing) > 0 or pending) and full + len(ph_missing) >= steps_left:
        allowed = {s[p] for s, p in unmet if p == started} | (set(ph_missing) if started == 0 else set())
        if pending:
            ends = {w for w in allowed if not joins[w]}
            allowed = ends or allowed
            if not unmet and not ph_missing:
                allowed = {w for w in range(len(raw)) if not joins[w]}
        ban |= set(range(len(raw))) - allowed
    logits = raw.clone()
    logits[sorted(ban)] = float("-inf")
    if all(w in ban or w in BANNED for w in range(len(raw))):
        logits[EOS_ID] = raw[EOS_ID]
    logp = F.log_softmax(logits, dim=-1)
    logp[list(BANNED)] = float("-inf")
    return logp
