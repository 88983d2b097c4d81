"""nmt/search/constraints.py: constraint tracking against scanning the output, dynamic beam allocation against a
plain implementation, and the reference constrained searches (tests/constrained_ref.py) against brute
force on the scripted fake model: every output holds every constraint, before the length limit, with
n-gram blocking, placeholders and prefixes; with a beam that prunes nothing, the best outputs are
exactly the best of all outputs the rules allow."""

from __future__ import annotations

import math
import random

import pytest
import torch

from nmt.search.constraints import Constraints, _failure, allocate
from nmt.text.tokenizer import BOS_ID, EOS_ID, PAD_ID

from constrained_ref import Rules, brute_force, contains, reference_beam, reference_greedy, status
from helpers import V, FakeModel, fake_batch

REAL = (1, 4, 5, 6, 7)  # what the fake model may generate (UNK included)
JOINS = [False] * 5 + [True] + [False] * 2  # token 5 continues the word before it


class Rambling(FakeModel):
    """Wants neither to end nor to write 5 or 6: constraints made of them come only from the rules."""

    def logits(self, src, prefix):
        row = super().logits(src, prefix).clone()
        row[[EOS_ID, 5, 6]] -= 20.0
        return row


class Reluctant(FakeModel):
    """Writes 5 and 6 less readily than the fake model does: the exact search's best output with terms
    made of them often runs to the length limit, where the terms are forced in."""

    def logits(self, src, prefix):
        row = super().logits(src, prefix).clone()
        row[[5, 6]] -= 2.0
        return row


class Plural(FakeModel):
    """Likes to continue token 6 with 5 (a term's word with a suffix: "perro" "s")."""

    def logits(self, src, prefix):
        row = super().logits(src, prefix).clone()
        row[5] += 4.0 * (prefix[-1] == 6)
        return row


# --------------------------------------------------------------------------- tracking

def test_failure_function():
    assert _failure([4, 4, 5]) == [0, 0, 1, 0]
    assert _failure([4, 5, 4, 5, 4]) == [0, 0, 0, 1, 2, 3]
    assert _failure([6]) == [0, 0]


@pytest.mark.parametrize("seed", range(6))
def test_tracking_equals_scanning_the_output(seed):
    """Progress and met status after every token, for random outputs and constraints with repeats
    (KMP fallback: simply restarting a broken match misses `4 4 4 5` holding `4 4 5`)."""
    rng = random.Random(seed)
    seqs = [[rng.choice([4, 5]) for _ in range(rng.randint(1, 4))] for _ in range(3)] + [[4, 4, 5]]
    open_end = [rng.random() < 0.5 for _ in seqs]
    for joins in (None, JOINS):
        cons = Constraints.build([seqs, seqs[:1]], joins=joins, open_end=[open_end, open_end[:1]])
        outputs = [[rng.choice([4, 5, 6]) for _ in range(14)] for _ in range(6)] + [[4, 4, 4, 5, 6]]
        state = cons.state(torch.tensor([0] * len(outputs)))
        for t in range(max(map(len, outputs))):
            state.advance(torch.tensor([o[t] if t < len(o) else 6 for o in outputs]))
            for r, o in enumerate(outputs):
                h = (o + [6] * 20)[:t + 1]
                for c, s in enumerate(seqs):
                    kind, p = status(h, s, open_end[c] and joins is not None, joins)
                    assert bool(state.done[r, c]) == (kind == "done"), (h, s, joins)
                    assert int(state.progress[r, c]) == p, (h, s, joins)
        assert bool(state.done[len(outputs) - 1, 3])  # 4 4 4 5 6 holds 4 4 5 (then 6: a word end)


def test_bank_next_tokens_missing_and_eos():
    cons = Constraints.build([[[4, 5], [6]], []])
    state = cons.state(torch.tensor([0, 0, 1]))
    state.advance(torch.tensor([4, 6, 7]))
    assert state.bank().tolist() == [1, 1, 0]
    tokens, valid = state.next_tokens()
    assert tokens[0].tolist() == [5, 6] and valid.tolist() == [[True, True], [True, False], [False, False]]
    assert state.next_token_mask(V)[0].nonzero().squeeze(1).tolist() == [5, 6]
    assert state.missing().tolist() == [2, 2, 0]  # row 0: [4,5] started (1 of 2 left) + [6] whole
    assert state.eos_allowed().tolist() == [False, False, True]
    must, allowed, exclusive = state.forced(torch.tensor([2, 3, 1]), V)
    assert must.tolist() == [True, False, False] and exclusive.tolist() == [True, False, False]
    assert allowed[0].nonzero().squeeze(1).tolist() == [5]  # only the continuation of the started one


def test_build_refuses_empty_constraints_and_pads_joins():
    with pytest.raises(ValueError, match="non-empty"):
        Constraints.build([[[4], []]])
    cons = Constraints.build([[[4]]], joins=JOINS[:6], open_end=[[True]], vocab_size=V)
    assert cons.joins.tolist() == JOINS[:6] + [False] * (V - 6)
    state = cons.state(torch.tensor([0, 0]))
    state.advance(torch.tensor([4, 4]))
    state.advance(torch.tensor([5, 7]))  # 5 continues the word, 7 (beyond the tokenizer's pieces) does not
    assert state.done[:, 0].tolist() == [False, True]


# --------------------------------------------------------------------------- allocation

def plain_allocation(cand, state_rows, seqs, K, V, margin=math.inf):
    """Post & Vilar / Hu et al. in plain Python for one sentence: candidates = top 2K, each beam's
    next constraint tokens (those at most `margin` below the beam's best token) and best token; bank =
    constraint tokens met; round robin over banks."""
    flat = [(float(s), i) for i, s in enumerate(cand.tolist())]
    pool = [i for s, i in sorted(flat, key=lambda x: -x[0])[:2 * K]]
    for j, h in enumerate(state_rows):
        row = cand[j * V:(j + 1) * V]
        pool += [j * V + s[p] for s, (kind, p) in zip(seqs, (status(h, s, False, None) for s in seqs))
                 if kind == "progress" and float(row[s[p]]) >= float(row.max()) - margin]
        pool.append(j * V + int(row.argmax()))
    pool = [i for n, i in enumerate(pool) if i not in pool[:n] and cand[i] > float("-inf")]

    def bank(i):
        h = state_rows[i // V] + [i % V]
        return sum(len(s) if kind != "progress" else p for s, (kind, p) in zip(seqs, (status(h, s, False, None)
                                                                                       for s in seqs)))
    ranked = sorted(pool, key=lambda i: (-bank(i), -float(cand[i])))
    banks = sorted({bank(i) for i in pool}, reverse=True)
    rank = {i: ranked.index(i) - min(ranked.index(x) for x in ranked if bank(x) == bank(i)) for i in pool}
    return sorted(pool, key=lambda i: (rank[i], banks.index(bank(i))))[:2 * K]


@pytest.mark.parametrize("margin", [math.inf, 0.5])
@pytest.mark.parametrize("seed", range(5))
def test_allocation_equals_plain_dynamic_beam_allocation(seed, margin):
    g = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    K, k, Vb = 3, 3, 9
    seqs = [[rng.randrange(4, Vb) for _ in range(rng.randint(1, 3))] for _ in range(2)]
    histories = [[rng.randrange(4, Vb) for _ in range(rng.randint(0, 3))] for _ in range(k)]
    cons = Constraints.build([seqs])
    state = cons.state(torch.zeros(k, dtype=torch.long))
    longest = max(map(len, histories))
    rows = [[0] * (longest - len(h)) + h for h in histories]  # leading 0s: a token no constraint holds
    for t in range(longest):
        state.advance(torch.tensor([r[t] for r in rows]))
    cand = torch.randn(1, k * Vb, generator=g)
    cand[0, torch.randperm(k * Vb, generator=g)[:5]] = float("-inf")
    top, idx = allocate(state, cand, K, margin=margin)
    want = plain_allocation(cand[0], rows, seqs, K, Vb, margin)
    got = [int(i) for i, s in zip(idx[0], top[0]) if s > float("-inf")]
    assert got == want
    assert top[0, :len(want)].tolist() == [float(cand[0, i]) for i in want]


def test_allocation_without_constraints_is_the_top_k():
    """A sentence with no constraints (or all met) gets exactly its top 2K: unconstrained lines decode
    as without a glossary."""
    g = torch.Generator().manual_seed(3)
    cons = Constraints.build([[], [[5]], []])
    state = cons.state(torch.arange(3).repeat_interleave(4))
    state.advance(torch.tensor([6] * 4 + [5] * 4 + [4] * 4))  # sentence 1: its constraint is met
    cand = torch.randn(3, 4 * V, generator=g)
    cand[cand < -1.2] = float("-inf")
    top, idx = allocate(state, cand, 4)
    want_top, want_idx = cand.topk(8, dim=1)
    assert torch.equal(top, want_top) and torch.equal(idx, want_idx)


# --------------------------------------------------------------------------- searches against brute force

def _run(model, src, mask, seqs, rules, K, nbest=1, open_end=None, joins=None, stop_after=None):
    cons = Constraints.build(seqs, joins=joins, open_end=open_end)
    if K is None:
        return [[h] for h in reference_greedy(model, src, mask, cons, rules)]
    return reference_beam(model, src, mask, cons, rules, K, nbest, stop_after)


def _term_stops(seqs, K):
    """The real search's stop counts at patience 0: K endings for a sentence with terms, else none."""
    return [K if cs else 0 for cs in seqs] if K else None


CASES = {  # name: (constraints per sentence, rules besides the limits)
    "plain": ([[[5, 6]], [[4], [6, 6]], []], {}),
    "ngram": ([[[5, 5]], [[4, 4], [6]], [[7]]], {"no_repeat_ngram": 1}),
    "placeholders": ([[[5, 6]], [[4]], []], {"ph_tokens": [7], "ph_required": [[7], [], [7]]}),
    "prefix": ([[[6, 4]], [[5]], [[4, 5]]], {"prefixes": [[6], [4, 4], []]}),
    "margin": ([[[5, 6]], [[4, 5], [6]], [[4, 7]]], {"margin": 0.5}),  # (changes the outputs at K = 3)
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("kind,alpha", [("none", 0.0), ("gnmt", 1.0)])
def test_unpruned_beam_equals_brute_force(case, kind, alpha):
    """K larger than every set of candidates: the n-best are exactly the best outputs the rules allow."""
    seqs, extra = CASES[case]
    model = FakeModel(seed=7)
    src, mask = fake_batch([3, 4, 2], seed=7)
    rules = Rules(limits=[4, 4, 4], alpha=alpha, kind=kind, **extra)
    out = _run(model, src, mask, seqs, rules, K=len(REAL) ** 3 * (len(REAL) + 1), nbest=3)
    for b, hyps in enumerate(out):
        ref = brute_force(model, FakeModel._src(src[b]), seqs[b], rules, b)
        assert [h.tokens for h in hyps] == [r.tokens for r in ref[:3]]
        assert [h.score for h in hyps] == pytest.approx([r.score for r in ref[:3]], abs=1e-4)
        assert [h.log_prob for h in hyps] == pytest.approx([r.log_prob for r in ref[:3]], abs=1e-4)
        assert all(contains(r.tokens, s) for r in ref for s in seqs[b])  # the rules leave nothing else


def test_unpruned_beam_equals_brute_force_with_word_ends():
    """A term that ends inside a word is not met when the next token continues the word (token 5)."""
    seqs, open_end = [[[4, 6]], [[6]], [[4]]], [[True], [True], [False]]
    model = Plural(seed=8)
    src, mask = fake_batch([3, 4, 2], seed=8)
    rules = Rules(limits=[4, 4, 4])
    out = _run(model, src, mask, seqs, rules, K=len(REAL) ** 3 * (len(REAL) + 1), nbest=3, open_end=open_end,
               joins=JOINS)
    changed = False
    for b, hyps in enumerate(out):
        ref = brute_force(model, FakeModel._src(src[b]), seqs[b], rules, b, open_end[b], JOINS)
        assert [h.tokens for h in hyps] == [r.tokens for r in ref[:3]]
        assert [h.score for h in hyps] == pytest.approx([r.score for r in ref[:3]], abs=1e-4)
        assert all(contains(r.tokens, s, e, JOINS) for r in ref for s, e in zip(seqs[b], open_end[b]))
        plain = brute_force(model, FakeModel._src(src[b]), seqs[b], rules, b)
        changed |= [r.tokens for r in plain[:3]] != [r.tokens for r in ref[:3]]
    assert changed  # the word-end rule made a difference


@pytest.mark.parametrize("K", [None, 1, 2, 5])
@pytest.mark.parametrize("seed", range(4))
def test_every_output_holds_every_constraint(K, seed):
    rng = random.Random(seed)
    model = (Rambling if seed % 2 else FakeModel)(seed=seed, scale=1.5)
    src, mask = fake_batch([3, 5, 2, 4], seed=seed)
    seqs = [[[rng.choice([4, 5, 6]) for _ in range(rng.randint(1, 3))] for _ in range(rng.randint(0, 2))]
            for _ in range(4)]
    limits = [sum(map(len, s)) + rng.randint(0, 3) for s in seqs]  # room for them, sometimes no more
    rules = Rules(limits=[max(n, 1) for n in limits], no_repeat_ngram=rng.choice([0, 2]))
    out = _run(model, src, mask, seqs, rules, K=K, nbest=1 if K is None else min(K, 2))
    for b, hyps in enumerate(out):
        assert hyps
        for h in hyps:
            assert len(h.tokens) <= rules.limits[b]
            assert all(contains(h.tokens, s) for s in seqs[b]), (seqs[b], h)


@pytest.mark.parametrize("K", [None, 3])
def test_constraints_and_placeholders_are_written_before_the_length_limit(K):
    """The model wants neither the terms nor the placeholder: the rules write them all, at the limit."""
    model = Rambling(seed=4)
    model_ph = type("NoPlaceholder", (Rambling,), {"logits": lambda self, s, p: Rambling.logits(self, s, p) -
                                                   20.0 * (torch.arange(V) == 7)})(seed=4)
    src, mask = fake_batch([3, 4], seed=4)
    seqs = [[[5, 6], [6]], [[5]]]
    rules = Rules(limits=[4, 2], ph_tokens=[7], ph_required=[[7], [7]])  # exactly the room they need
    for m in (model, model_ph):
        out = _run(m, src, mask, seqs, rules, K=K, nbest=1)
        for b, hyps in enumerate(out):
            h = hyps[0]
            assert len(h.tokens) == rules.limits[b] and not h.finished
            assert all(contains(h.tokens, s) for s in seqs[b]) and h.tokens.count(7) == 1, h


def test_batch_rows_are_independent():
    """Sentences decoded together give what each gives alone (rows mapped to their sentence)."""
    model = FakeModel(seed=9)
    src, mask = fake_batch([3, 5, 4], seed=9)
    seqs = [[[5, 6]], [], [[4], [7, 5]]]
    rules = Rules(limits=[5, 5, 6], alpha=1.0, kind="gnmt")
    together = _run(model, src, mask, seqs, rules, K=3, nbest=2)
    for b in range(3):
        alone = _run(model, src[b:b + 1], mask[b:b + 1], seqs[b:b + 1], Rules(limits=rules.limits[b:b + 1],
                                                                              alpha=1.0, kind="gnmt"), K=3, nbest=2)
        assert [h.tokens for h in together[b]] == [h.tokens for h in alone[0]]
        assert [h.score for h in together[b]] == pytest.approx([h.score for h in alone[0]])


def test_fake_specials():
    assert (PAD_ID, BOS_ID, EOS_ID) == (0, 2, 3)  # the fake vocabulary's layout that REAL relies on


# --------------------------------------------------------------------------- the real search against the reference

def _real(model, src, mask, seqs, K, nbest=1, extra=None, alpha=0.0, kind="none", open_end=None, joins=None,
          patience=0.0):
    """nmt.search.search with these constraints (Terms) and rules -> (its hypotheses, the limits it used)."""
    from nmt.search import SearchInputs, SearchOptions, search
    from nmt.search.options import Terms

    extra = extra or {}
    ph = bool(extra.get("ph_tokens"))
    options = SearchOptions(beam_size=K or 1, nbest=nbest, max_len_a=1.0, max_len_b=0, length_penalty=alpha,
                            length_penalty_type=kind, no_repeat_ngram=extra.get("no_repeat_ngram", 0), patience=patience,
                            placeholder_tokens=((7,),) if ph else None, glossary_margin=extra.get("margin", math.inf))
    inputs = SearchInputs(prefixes=extra.get("prefixes"),
                          placeholders=[[0] if 7 in r else [] for r in extra["ph_required"]] if ph else None,
                          constraints=Terms(seqs, open_end, joins))
    return search(model, src, mask, options, inputs)


def _limits(mask, seqs, extra):
    """The limits the search gives each sentence: src length (a=1, b=0), raised to the room its terms need."""
    from nmt.search.options import max_output_lengths, room_for_terms

    prefixes = extra.get("prefixes")
    limits = max_output_lengths(mask.sum(dim=1), 1.0, 0, FakeModel.max_positions, prefixes)
    needed = [len((prefixes or [[]] * len(seqs))[b]) + sum(map(len, cs)) + (
        len(extra["ph_required"][b]) if extra.get("ph_tokens") else 0) + 1 if cs else 0 for b, cs in enumerate(seqs)]
    return room_for_terms(limits, needed, FakeModel.max_positions)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("K", [None, 2, 3])  # None: greedy (the search's beam_size 1)
def test_search_equals_the_reference(case, K):
    """Greedy and beam search with terms give the reference searches' outputs, scores and log-probs
    (the reference runs without the exact stop, which loses nothing, but with the count of endings that
    stops a sentence with terms), with n-gram blocking, placeholders and prefixes, and every output
    holds its sentence's terms."""
    seqs, extra = CASES[case]
    model = FakeModel(seed=3)
    src, mask = fake_batch([3, 4, 2], seed=3)
    rules = Rules(limits=_limits(mask, seqs, extra), alpha=1.0 if K else 0.0, kind="gnmt" if K else "none", **extra)
    nbest = min(K or 1, 2)
    want = _run(model, src, mask, seqs, rules, K, nbest=nbest, stop_after=_term_stops(seqs, K))
    got = _real(model, src, mask, seqs, K, nbest=nbest, extra=extra, alpha=rules.alpha, kind=rules.kind)
    for b in range(3):
        assert [h.tokens for h in got[b]] == [h.tokens for h in want[b]], (b, got[b], want[b])
        assert [h.score for h in got[b]] == pytest.approx([h.score for h in want[b]], abs=1e-5)
        assert [h.log_prob for h in got[b]] == pytest.approx([h.log_prob for h in want[b]], abs=1e-5)
        assert all(contains(h.tokens, s) for h in got[b] for s in seqs[b])


@pytest.mark.parametrize("kind,alpha", [("average", 1.1), ("gnmt", 1.0)])
def test_sentences_with_terms_stop_after_k_endings(kind, alpha):
    """At patience 0 a sentence with terms stops after K endings (fairseq's constrained search), one
    without terms by the exact rule alone: the search equals the reference with those counts, and on
    this model the count changes some outputs (the exact search keeps outputs forced at the limit). An
    explicit patience applies as given: one large enough gives the exact search's outputs."""
    K, seqs, changed = 3, [[[5, 6]], [[6], [5, 5]], []], 0
    for seed in range(3):
        model = Reluctant(seed=seed)
        src, mask = fake_batch([8, 9, 7], seed=seed)
        rules = Rules(limits=_limits(mask, seqs, {}), alpha=alpha, kind=kind)
        want = _run(model, src, mask, seqs, rules, K, nbest=2, stop_after=_term_stops(seqs, K))
        exact = _run(model, src, mask, seqs, rules, K, nbest=2)
        got = _real(model, src, mask, seqs, K, nbest=2, alpha=alpha, kind=kind)
        slow = _real(model, src, mask, seqs, K, nbest=2, alpha=alpha, kind=kind, patience=100.0)
        for b in range(3):
            assert [h.tokens for h in got[b]] == [h.tokens for h in want[b]], (seed, b)
            assert [h.score for h in got[b]] == pytest.approx([h.score for h in want[b]], abs=1e-5)
            assert [h.tokens for h in slow[b]] == [h.tokens for h in exact[b]], (seed, b)
            changed += [h.tokens for h in want[b]] != [h.tokens for h in exact[b]]
        assert [h.tokens for h in exact[2]] == [h.tokens for h in want[2]]  # no terms: the exact stop
    assert changed >= 2


@pytest.mark.parametrize("K", [None, 2])
def test_search_with_word_ends_equals_the_reference(K):
    seqs, open_end = [[[4, 6]], [[6]], [[4]]], [[True], [True], [False]]
    model = Plural(seed=8)
    src, mask = fake_batch([3, 4, 2], seed=8)
    rules = Rules(limits=_limits(mask, seqs, {}))
    want = _run(model, src, mask, seqs, rules, K, open_end=open_end, joins=JOINS)
    got = _real(model, src, mask, seqs, K, open_end=open_end, joins=JOINS)
    for b in range(3):
        assert [h.tokens for h in got[b]] == [h.tokens for h in want[b]]
        assert all(contains(h.tokens, s, e, JOINS) for h in got[b] for s, e in zip(seqs[b], open_end[b]))


@pytest.mark.parametrize("margin", [math.inf, 0.5])
@pytest.mark.parametrize("K", [None, 1, 4])
@pytest.mark.parametrize("seed", range(3))
def test_unwanted_terms_are_written_before_the_limit(K, seed, margin):
    """A model that wants neither the terms nor to end: every output holds every term, within a limit
    raised to the room they need (the source's own length is shorter)."""
    rng = random.Random(seed)
    model = Rambling(seed=seed, scale=1.5)
    src, mask = fake_batch([2, 3, 2, 4], seed=seed)
    seqs = [[[rng.choice([5, 6]) for _ in range(rng.randint(1, 3))] for _ in range(rng.randint(0, 3))]
            for _ in range(4)]
    out = _real(model, src, mask, seqs, K, nbest=1, extra={"no_repeat_ngram": 2, "margin": margin})
    limits = _limits(mask, seqs, {})
    for b, hyps in enumerate(out):
        for h in hyps:
            assert len(h.tokens) <= limits[b] and all(contains(h.tokens, s) for s in seqs[b]), (seqs[b], h)


@pytest.mark.parametrize("K", [None, 3])
def test_sentences_without_terms_search_as_without_constraints(K):
    """A batch without terms, and the sentences without terms in a batch with some, give exactly the
    outputs of a search without constraints (same tokens, same scores)."""
    from nmt.search import SearchOptions, search

    model = FakeModel(seed=5)
    src, mask = fake_batch([3, 5, 4], seed=5)
    options = SearchOptions(beam_size=K or 1, nbest=1, max_len_a=1.0, max_len_b=2)
    plain = search(model, src, mask, options)
    for seqs in ([[], [], []], [[], [[5, 6]], []]):
        from nmt.search import SearchInputs

        got = search(model, src, mask, options, SearchInputs(constraints=seqs))
        for b in (0, 2):
            assert got[b] == plain[b]
    assert got[1] != plain[1] and contains(got[1][0].tokens, [5, 6])


def test_terms_that_cannot_fit_and_sampling_are_refused():
    from nmt.search import SearchInputs, SearchOptions, search

    model = FakeModel(seed=5)
    src, mask = fake_batch([3], seed=5)
    with pytest.raises(ValueError, match="more than the model's"):
        search(model, src, mask, SearchOptions(max_len_a=1.0, max_len_b=2), SearchInputs(constraints=[[[5] * 70]]))
    with pytest.raises(ValueError, match="sampling"):
        search(model, src, mask, SearchOptions(sampling="topk", max_len_a=1.0, max_len_b=2),
               SearchInputs(constraints=[[[5]]]))
