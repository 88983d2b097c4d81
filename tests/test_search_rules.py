"""Issue 25's search rules: renormalised rule masks, placeholders copied exactly once, the first step
after a prefix, keep_all (every penalty afterwards gives the search's own result). References are
brute force over the fake model's table."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from nmt.search import SearchInputs, SearchOptions, beam_search, greedy_search, length_penalty_factor, sample_search
from nmt.text.tokenizer import BOS_ID, EOS_ID

from helpers import FakeModel, fake_batch

V = 8
REAL = (1, 4, 5, 6, 7)  # what may be generated (UNK included)


def search_log_prob(model, src, tokens, finished, banned_fn):
    """Sum over the output of the search's distribution: at each step the model's softmax over the
    tokens `banned_fn(prefix)` does not forbid (PAD/BOS dropped after it, not renormalised)."""
    seq, total = [BOS_ID], 0.0
    for tok in tokens + ([EOS_ID] if finished else []):
        logits = model.logits(src, tuple(seq)).clone()
        for b in banned_fn(seq[1:]):
            logits[b] = -math.inf
        total += float(torch.log_softmax(logits, dim=-1)[tok])
        seq.append(tok)
    return total


def blocked_3grams(prefix):
    if len(prefix) < 2:
        return set()
    key = tuple(prefix[-2:])
    return {prefix[i + 2] for i in range(len(prefix) - 2) if tuple(prefix[i:i + 2]) == key}


class Loopy(FakeModel):
    """Prefers to repeat the token two steps back (4 5 4 5 ...): n-gram blocking fires."""

    def logits(self, src, prefix):
        row = super().logits(src, prefix).clone()
        if len(prefix) >= 3:
            row[prefix[-2]] += 3.0
        return row


@pytest.mark.parametrize("kind", ["greedy", "beam"])
def test_no_repeat_ngram_renormalises_over_the_allowed_tokens(kind):
    """Fails with the old rule (blocked tokens removed after the softmax): log_prob is the sum of the
    renormalised distribution's values, as CTranslate2 computes them."""
    model = Loopy(seed=11, scale=1.0)
    src, mask = fake_batch([4, 6, 3], seed=11)
    kw = dict(max_len_a=0.0, max_len_b=12, no_repeat_ngram=3)
    out = greedy_search(model, src, mask, SearchOptions(**kw)) if kind == "greedy" else \
        beam_search(model, src, mask, SearchOptions(beam_size=3, nbest=3, length_penalty_type="none", **kw))
    fired = 0
    for i, hyps in enumerate(out):
        s = FakeModel._src(src[i])
        for h in hyps:
            want = search_log_prob(model, s, h.tokens, h.finished, blocked_3grams)
            assert h.log_prob == pytest.approx(want, abs=1e-4)
            fired += any(blocked_3grams(h.tokens[:j]) for j in range(len(h.tokens) + 1))
    assert fired  # the rule removed a token somewhere


# --------------------------------------------------------------------------- placeholders

PH = [6, 7]  # the fake vocabulary's "placeholder" tokens: placeholder 0 is written by 6, placeholder 1 by 7


def ph_banned(required, max_len=None):
    """The placeholder rules at the step after `prefix`: a placeholder not required or already written is
    banned, EOS while one is missing, and everything but the missing ones once the steps left before
    `max_len` are no more than the missing count."""
    def banned(prefix):
        out = {p for p in PH if p not in required or p in prefix}
        missing = [p for p in required if p not in prefix]
        if missing:
            out.add(EOS_ID)
            if max_len is not None and len(missing) >= max_len - len(prefix):
                out |= {t for t in range(V) if t not in missing}  # PAD and BOS too: only these are left
        return out
    return banned


def test_placeholders_exactly_once_in_every_search():
    model = FakeModel(seed=12, scale=2.0)
    src, mask = fake_batch([4, 3, 5, 2], seed=12)
    required = [[6], [], [6, 7], [7]]
    ph = SearchInputs(placeholders=[[PH.index(t) for t in r] for r in required])
    kw = dict(max_len_a=0.0, max_len_b=10, placeholder_tokens=((6,), (7,)))
    searches = {"greedy": greedy_search(model, src, mask, SearchOptions(**kw), ph),
                "beam": beam_search(model, src, mask, SearchOptions(beam_size=3, nbest=3, length_penalty_type="average",
                                                                    **kw), ph),
                "sample": sample_search(model, src, mask, SearchOptions(nbest=5, sampling="topk", topk=4, seed=3, **kw),
                                        ph)}
    free = beam_search(model, src, mask, SearchOptions(beam_size=3, nbest=3, length_penalty_type="average",
                                                       max_len_a=0.0, max_len_b=10))
    assert any(sorted(t for t in h.tokens if t in PH) != sorted(r) for hyps, r in zip(free, required) for h in hyps)
    for name, out in searches.items():
        assert sum(h.finished for hyps in out for h in hyps) >= 0.8 * sum(map(len, out)), name
        for i, hyps in enumerate(out):
            for h in hyps:  # finished or cut at the length limit: each required placeholder exactly once
                assert sorted(t for t in h.tokens if t in PH) == sorted(required[i]), (name, i, h.tokens)
                want = search_log_prob(model, FakeModel._src(src[i]), h.tokens, h.finished, ph_banned(required[i], 10))
                assert h.log_prob == pytest.approx(want, abs=1e-4)


class Rambling(FakeModel):
    """Never wants to end or to write a placeholder: without the room rule every output would reach the
    length limit with its placeholders missing."""

    def logits(self, src, prefix):
        row = super().logits(src, prefix).clone()
        row[EOS_ID] -= 20.0
        row[6] -= 20.0
        row[7] -= 20.0
        return row


@pytest.mark.parametrize("max_len", [2, 3, 6])
def test_placeholders_are_written_before_the_length_limit(max_len):
    """Fails without the room rule: outputs cut at the limit lacked their placeholders."""
    model = Rambling(seed=18, scale=1.0)
    src, mask = fake_batch([4, 3, 5, 2], seed=18)
    required = [[6], [], [6, 7], [7]]
    ph = SearchInputs(placeholders=[[PH.index(t) for t in r] for r in required])
    kw = dict(max_len_a=0.0, max_len_b=max_len, placeholder_tokens=((6,), (7,)))
    searches = {"greedy": greedy_search(model, src, mask, SearchOptions(**kw), ph),
                "beam": beam_search(model, src, mask, SearchOptions(beam_size=3, nbest=2, length_penalty_type="average",
                                                                    **kw), ph),
                "sample": sample_search(model, src, mask, SearchOptions(nbest=3, sampling="topk", topk=4, seed=3, **kw),
                                        ph)}
    for name, out in searches.items():
        for i, hyps in enumerate(out):
            for h in hyps:
                assert not h.finished and len(h.tokens) == max_len, (name, h)  # this model never ends
                assert sorted(t for t in h.tokens if t in PH) == sorted(required[i]), (name, i, h.tokens)
                want = search_log_prob(model, FakeModel._src(src[i]), h.tokens, False, ph_banned(required[i], max_len))
                assert h.log_prob == pytest.approx(want, abs=1e-4)


def test_exhaustive_beam_with_placeholders_equals_brute_force():
    """A beam wide enough to prune nothing returns the best outputs among those the rules allow."""
    model = FakeModel(seed=13, scale=2.0)
    src, mask = fake_batch([3, 2], seed=13)
    required, max_len = [[6], [6, 7]], 4
    out = beam_search(model, src, mask, SearchOptions(beam_size=300, nbest=3, length_penalty=1.0,
                                                      length_penalty_type="gnmt", max_len_a=0.0, max_len_b=max_len,
                                                      placeholder_tokens=((6,), (7,))),
                      SearchInputs(placeholders=[[PH.index(t) for t in r] for r in required]))
    for i, hyps in enumerate(out):
        s, banned = FakeModel._src(src[i]), ph_banned(required[i], max_len)
        scored = []
        for n in range(0, max_len + 1):
            for toks in itertools.product(REAL, repeat=n):
                toks = list(toks)
                finished = n < max_len
                if any(t in banned(toks[:j]) for j, t in enumerate(toks)) or (finished and EOS_ID in banned(toks)):
                    continue
                lp = search_log_prob(model, s, toks, finished, banned)
                scored.append(lp / length_penalty_factor(n + finished, 1.0, "gnmt"))
        scored.sort(reverse=True)
        assert [h.score for h in hyps] == pytest.approx(scored[:3], abs=1e-4)


# --------------------------------------------------------------------------- prefixes, keep_all

class EndsAfterPrefix(FakeModel):
    """After the prefix [4, 5], EOS is the second most probable token (the first is 6)."""

    def logits(self, src, prefix):
        row = super().logits(src, prefix).clone()
        if prefix[-2:] == (4, 5) and len(prefix) == 3:
            row[:] = -5.0
            row[6], row[EOS_ID], row[7] = 3.0, 2.5, 1.0
        return row


def test_first_step_after_a_prefix_lets_only_the_best_candidate_end():
    model = EndsAfterPrefix(seed=14)
    src, mask = fake_batch([4], seed=14)
    options = SearchOptions(beam_size=4, nbest=4, length_penalty_type="none", max_len_a=0.0, max_len_b=8)
    out = beam_search(model, src, mask, options, SearchInputs(prefixes=[[4, 5]]))
    assert all(h.tokens != [4, 5] for h in out[0])  # "prefix + EOS" (rank 2 at that step) never finishes
    free = beam_search(model, src, mask, options, SearchInputs(prefixes=[[4]]))
    assert all(h.tokens[0] == 4 for h in free[0])


@pytest.mark.parametrize("K", [1, 3])
def test_keep_all_then_any_penalty_equals_the_search(K):
    model = FakeModel(seed=15, scale=1.5)
    src, mask = fake_batch([5, 2, 7, 3], seed=15)
    kw = dict(max_len_a=1.0, max_len_b=3, no_repeat_ngram=2)
    every = beam_search(model, src, mask, SearchOptions(beam_size=K, nbest=1, keep_all=True, **kw))
    for kind, alpha in (("gnmt", 0.6), ("gnmt", 1.5), ("average", 1.0), ("average", 1.8), ("none", 0.0)):
        for min_len in (0,):  # (a minimum length changes the search: EOS is renormalised away)
            direct = beam_search(model, src, mask, SearchOptions(beam_size=K, length_penalty=alpha,
                                                                 length_penalty_type=kind, min_len=min_len, **kw))
            for hyps, d in zip(every, direct):
                ok = [h for h in hyps if len(h.tokens) >= min_len or not h.finished]
                best = max(ok, key=lambda h: h.log_prob / length_penalty_factor(len(h.tokens) + h.finished, alpha, kind))
                assert best.tokens == d[0].tokens, (kind, alpha, min_len)


@pytest.mark.parametrize("K,patience", [(3, 1.0), (4, 0.5), (3, 2.0)])
@pytest.mark.parametrize("kind,alpha", [("average", 1.0), ("gnmt", 1.5), ("none", 0.0)])
def test_patience_stops_after_that_many_finished_candidates(K, patience, kind, alpha):
    """Reference: the keep_all search (never stops) lists every candidate that ended in a top K with
    the step it ended at (its length); a sentence under `patience` sees those that ended up to the
    step where the count reached round(K * patience), and returns the best of them."""
    from nmt.schema import max_finished

    model = FakeModel(seed=17, scale=1.2)
    src, mask = fake_batch([5, 2, 7, 3, 6, 4], seed=17)
    kw = dict(max_len_a=1.5, max_len_b=4, no_repeat_ngram=2)
    every = beam_search(model, src, mask, SearchOptions(beam_size=K, nbest=1, keep_all=True, **kw))
    kw.update(beam_size=K, nbest=2, length_penalty=alpha, length_penalty_type=kind)
    got = beam_search(model, src, mask, SearchOptions(patience=patience, **kw))
    exact = beam_search(model, src, mask, SearchOptions(**kw))
    most, differ = max_finished(K, patience), 0
    for hyps, ours, full in zip(every, got, exact):
        step = lambda h: len(h.tokens) + h.finished  # noqa: E731 (the step it ended at)
        steps = sorted(step(h) for h in hyps)
        stop = steps[min(most, len(steps)) - 1]  # the step at which the count reached `most`
        seen = [h for h in hyps if step(h) <= stop]
        ranked = sorted(seen, key=lambda h: -h.log_prob / length_penalty_factor(step(h), alpha, kind))
        assert [h.tokens for h in ours] == [h.tokens for h in ranked[:2]]
        differ += [h.tokens for h in ours] != [h.tokens for h in full]
    if kind != "none" and patience < 2:
        assert differ  # the rule does stop sooner than the exact search somewhere (the test can fail)


def test_a_placeholder_written_by_several_tokens_counts_once():
    """A vocabulary may write <ph_0> as "<ph_0>" and as "▁<ph_0>": either one, once, in all."""
    model = FakeModel(seed=16, scale=2.0)
    src, mask = fake_batch([4, 3, 5], seed=16)
    out = beam_search(model, src, mask, SearchOptions(beam_size=3, nbest=3, length_penalty_type="average",
                                                      max_len_a=0.0, max_len_b=10, placeholder_tokens=((6, 7),)),
                      SearchInputs(placeholders=[[0], [], [0]]))
    for i, hyps in enumerate(out):
        for h in hyps:
            if h.finished:
                assert sum(t in (6, 7) for t in h.tokens) == (1 if i != 1 else 0), h.tokens
