"""Greedy and beam search against independent references.

- A scripted fake model (next-token logits = a fixed pseudo-random table of (source, prefix))
  checks beam hypotheses and scores exactly against brute-force enumeration and against a
  simple one-sentence reference beam search written here (no batching, no cache, no early stop).
- A tiny random Transformer checks the same against enumeration scored by `model.decode`
  (full teacher forcing), plus beam 1 == greedy, batch independence, cached == uncached,
  n-best order, and the min/max length rules.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from nmt.config import ModelConfig
from nmt.model.transformer import Transformer
from nmt.search import SearchInputs, SearchOptions, beam_search, greedy_search, search
from nmt.text.tokenizer import BOS_ID, EOS_ID, PAD_ID

from helpers import V, FakeModel, HostReads, fake_batch, tiny_transformer


ALLOWED = [t for t in range(V) if t not in (PAD_ID, BOS_ID, EOS_ID)]  # UNK may be generated


def penalty(length: int, alpha: float, kind: str) -> float:
    """Independent copy of the length penalty (length = generated tokens incl. EOS)."""
    if kind == "gnmt":
        return ((5 + length) / 6) ** alpha
    if kind == "average":
        return length ** alpha
    return 1.0


def enumerate_outputs(max_len: int, min_len: int):
    """Every possible output: (tokens, ends_with_eos). EOS after >= min_len tokens; truncated at max_len."""
    for n in range(min_len, max_len):
        for toks in itertools.product(ALLOWED, repeat=n):
            yield list(toks), True
    for toks in itertools.product(ALLOWED, repeat=max_len):
        yield list(toks), False


def step_log_probs(model: FakeModel, src: tuple, prefix: tuple, min_len: int = 0) -> torch.Tensor:
    """The search's distribution for the token after `prefix` (BOS first): the model's, renormalised
    without EOS while the output is shorter than min_len (the rule removes EOS before the softmax)."""
    logits = model.logits(src, prefix).clone()
    if len(prefix) <= min_len:  # generating token t = len(prefix) <= min_len
        logits[EOS_ID] = float("-inf")
    return torch.log_softmax(logits, dim=-1)


def fake_score(model: FakeModel, src: tuple, tokens: list[int], eos: bool, alpha: float, kind: str, min_len: int = 0):
    """(score, log_prob) of one output from the table directly."""
    seq = [BOS_ID] + tokens + ([EOS_ID] if eos else [])
    lp = sum(float(step_log_probs(model, src, tuple(seq[: i + 1]), min_len)[seq[i + 1]]) for i in range(len(seq) - 1))
    return lp / penalty(len(seq) - 1, alpha, kind), lp


def reference_beam(model: FakeModel, src: tuple, K: int, max_len: int, min_len: int, alpha: float, kind: str):
    """Plain one-sentence beam search with the documented semantics, run to max_len (no early stop):
    rank all extensions of the live beams; the ending candidates (EOS / max length) among the top K
    are finished, and the next live beams are the K best non-ending candidates among the top 2K.
    Returns finished [(score, log_prob, tokens)] best first."""
    beams, finished = [((BOS_ID,), 0.0)], []
    for t in range(1, max_len + 1):
        cands = []
        for prefix, lp in beams:
            logp = step_log_probs(model, src, prefix, min_len)
            for w in range(V):
                if w in (PAD_ID, BOS_ID) or (w == EOS_ID and t <= min_len):
                    continue
                cands.append((lp + float(logp[w]), prefix + (w,)))
        cands.sort(key=lambda c: -c[0])
        beams = []
        for rank, (lp, seq) in enumerate(cands[: 2 * K]):
            if seq[-1] == EOS_ID or t == max_len:
                if rank < K:
                    toks = list(seq[1:-1]) if seq[-1] == EOS_ID else list(seq[1:])
                    finished.append((lp / penalty(t, alpha, kind), lp, toks))
            elif len(beams) < K:
                beams.append((seq, lp))
        if not beams:
            break
    return sorted(finished, key=lambda f: -f[0])


PENALTIES = [("gnmt", 1.0), ("gnmt", 2.0), ("average", 1.0), ("none", 0.0)]


@pytest.mark.parametrize("kind,alpha", PENALTIES)
def test_fake_exhaustive_beam_equals_brute_force(kind, alpha):
    # K >= (#live prefixes) * (#tokens) at every step: nothing is pruned, so the beam's n-best
    # must be the exact n-best; only a wrong early stop (or bookkeeping) could lose one.
    max_len, min_len, nbest = 4, 1, 3
    model = FakeModel(seed=1)
    src, src_mask = fake_batch([3, 5, 2], seed=1)
    K = len(ALLOWED) ** (max_len - 2) * (len(ALLOWED) + 1)
    out = beam_search(model, src, src_mask, SearchOptions(beam_size=K, nbest=nbest, length_penalty=alpha,
                                                          length_penalty_type=kind, max_len_a=0.0, max_len_b=max_len,
                                                          min_len=min_len))
    for i, hyps in enumerate(out):
        s = FakeModel._src(src[i])
        ref = sorted((fake_score(model, s, toks, eos, alpha, kind, min_len)[0]
                      for toks, eos in enumerate_outputs(max_len, min_len)), reverse=True)
        assert len(hyps) == nbest
        for rank, h in enumerate(hyps):
            assert h.score == pytest.approx(ref[rank], abs=1e-4)
            eos = len(h.tokens) < max_len
            assert (h.score, h.log_prob) == pytest.approx(fake_score(model, s, h.tokens, eos, alpha, kind, min_len),
                                                          abs=1e-4)


@pytest.mark.parametrize("kind,alpha", PENALTIES)
@pytest.mark.parametrize("K,nbest", [(1, 1), (2, 2), (3, 1), (5, 3)])
def test_fake_beam_equals_reference_beam(kind, alpha, K, nbest):
    model = FakeModel(seed=2)
    lengths = [4, 1, 6, 3, 2]
    src, src_mask = fake_batch(lengths, seed=2)
    a, b, min_len = 1.0, 2, 2
    out = beam_search(model, src, src_mask, SearchOptions(beam_size=K, nbest=nbest, length_penalty=alpha,
                                                          length_penalty_type=kind, max_len_a=a, max_len_b=b,
                                                          min_len=min_len))
    for i, hyps in enumerate(out):
        ref = reference_beam(model, FakeModel._src(src[i]), K, int(a * lengths[i] + b), min_len, alpha, kind)[:nbest]
        assert [h.tokens for h in hyps] == [r[2] for r in ref]
        assert [x for h in hyps for x in (h.score, h.log_prob)] == pytest.approx([x for r in ref for x in r[:2]], abs=1e-4)


def reference_hf_beam(model: FakeModel, src: tuple, K: int, max_len: int, alpha: float, kind: str):
    """transformers' beam search with early_stopping=False (generation/utils.py `_beam_search`, written
    out for one sentence): the finished pool holds the K best penalised scores, filled from the ending
    candidates among the top K of 2K; after each step the sentence is done once the pool is full and the
    best live beam's log-prob / lp(t), t its current length, is not above the pool's worst. -> the pool,
    best first, as (score, log_prob, tokens)."""
    beams, pool = [((BOS_ID,), 0.0)], []
    for t in range(1, max_len + 1):
        cands = []
        for prefix, lp in beams:
            logp = step_log_probs(model, src, prefix)
            cands += [(lp + float(logp[w]), prefix + (w,)) for w in range(V) if w not in (PAD_ID, BOS_ID)]
        cands.sort(key=lambda c: -c[0])
        beams = []
        for rank, (lp, seq) in enumerate(cands[: 2 * K]):
            if seq[-1] == EOS_ID or t == max_len:
                if rank < K:
                    toks = list(seq[1:-1]) if seq[-1] == EOS_ID else list(seq[1:])
                    pool = sorted(pool + [(lp / penalty(t, alpha, kind), lp, toks)], key=lambda f: -f[0])[:K]
            elif len(beams) < K:
                beams.append((seq, lp))
        if not beams or (len(pool) == K and beams[0][1] / penalty(t, alpha, kind) <= pool[-1][0]):
            break
    return pool


@pytest.mark.parametrize("kind,alpha", PENALTIES + [("average", 2.0)])
@pytest.mark.parametrize("K,nbest", [(1, 1), (3, 1), (4, 2)])
def test_fake_hf_stopping_equals_transformers_rule(kind, alpha, K, nbest):
    """stopping="hf" is transformers' default rule (the reference above), and with a length penalty it
    is not the exact stop: on some sentences it returns a shorter hypothesis than the exact search."""
    model = FakeModel(seed=6)
    lengths = [4, 1, 6, 3, 2, 5, 7, 3, 6, 4, 5, 2]
    src, src_mask = fake_batch(lengths, seed=6)
    a, b = 1.0, 3
    kw = dict(beam_size=K, nbest=nbest, length_penalty=alpha, length_penalty_type=kind, max_len_a=a, max_len_b=b)
    hf = beam_search(model, src, src_mask, SearchOptions(stopping="hf", **kw))
    exact = beam_search(model, src, src_mask, SearchOptions(**kw))
    for i, hyps in enumerate(hf):
        ref = reference_hf_beam(model, FakeModel._src(src[i]), K, int(a * lengths[i] + b), alpha, kind)[:nbest]
        assert [h.tokens for h in hyps] == [r[2] for r in ref]
        assert [x for h in hyps for x in (h.score, h.log_prob)] == pytest.approx([x for r in ref for x in r[:2]], abs=1e-4)
    differ = sum(x[0].tokens != y[0].tokens for x, y in zip(hf, exact))
    if kind == "none" or alpha == 0:
        assert differ == 0 and hf == exact  # without a penalty the heuristic bound is exact
    elif kind == "average":
        assert differ > 0  # the heuristic stops before a longer hypothesis that the exact search finds


def test_fake_cached_path_steps_once_per_token_and_drops_finished_sentences():
    model = FakeModel(seed=3)
    src, src_mask = fake_batch([1, 6], seed=3)  # max lengths 1*1+1 = 2 and 6+1 = 7
    K = 3
    out = beam_search(model, src, src_mask, SearchOptions(beam_size=K, max_len_a=1.0, max_len_b=1, min_len=7))
    assert model.n_decode == 0  # never re-decodes a prefix
    assert [len(h[0].tokens) for h in out] == [2, 7]  # min_len > max_len: truncated at max_len
    # step 1 runs on one row per sentence, then K per sentence; sentence 0 leaves after step 2.
    assert model.step_rows == [2, 2 * K] + [K] * 5


def test_fake_uncached_equals_cached():
    src, src_mask = fake_batch([4, 2, 5], seed=4)
    cached, uncached = FakeModel(seed=4), FakeModel(seed=4)
    kw = dict(beam_size=3, nbest=3, max_len_a=1.0, max_len_b=2)
    a = beam_search(cached, src, src_mask, SearchOptions(**kw))
    b = beam_search(uncached, src, src_mask, SearchOptions(use_cache=False, **kw))
    assert uncached.n_decode > 0 and uncached.step_rows == []
    assert a == b
    g1 = greedy_search(cached, src, src_mask, SearchOptions(max_len_a=1.0, max_len_b=2))
    g2 = greedy_search(uncached, src, src_mask, SearchOptions(max_len_a=1.0, max_len_b=2, use_cache=False))
    assert g1 == g2


def test_fake_greedy_is_argmax_chain():
    model = FakeModel(seed=5)
    src, src_mask = fake_batch([3, 1, 4], seed=5)
    out = greedy_search(model, src, src_mask, SearchOptions(max_len_a=1.0, max_len_b=2, min_len=1))
    for i, (h,) in enumerate(out):
        s, seq, lp = FakeModel._src(src[i]), [BOS_ID], 0.0
        max_len = len(s) + 2
        while len(seq) - 1 < max_len:
            logp = step_log_probs(model, s, tuple(seq), min_len=1).clone()  # EOS renormalised away at step 1
            logp[[PAD_ID, BOS_ID]] = -math.inf
            seq.append(int(logp.argmax()))
            lp += float(logp[seq[-1]])
            if seq[-1] == EOS_ID:
                break
        assert h.tokens == [t for t in seq[1:] if t != EOS_ID]
        assert h.log_prob == pytest.approx(lp, abs=1e-5) and h.score == h.log_prob


def test_options_carry_every_search_setting_of_the_decode_section():
    """SearchOptions.from_decode takes each decode key the search uses, under the same name (a key left out
    would silently fall back to the search's default), and the tokenizer's ids and placeholder tokens."""
    import dataclasses

    from nmt.config import DecodeConfig, decode_config, decode_options, decode_value
    from nmt.layout import Specials

    shared = {f.name for f in dataclasses.fields(SearchOptions)} & {name for name, _, _ in decode_options()}
    assert shared == {"beam_size", "nbest", "length_penalty", "length_penalty_type", "patience", "stopping", "sampling",
                      "topk", "topp", "temperature", "seed", "max_len_a", "max_len_b", "min_len", "no_repeat_ngram",
                      "glossary_margin", "contrast_weight"}
    changed = dict(beam_size=7, nbest=3, length_penalty=0.7, length_penalty_type="average", patience=2.0,
                   stopping="hf", sampling="topp", topk=4, topp=0.5, temperature=0.8, seed=9, max_len_a=0.5,
                   max_len_b=3, min_len=2, no_repeat_ngram=4, glossary_margin=2.5, contrast_weight=0.3, protect=True)
    assert all(changed[k] != decode_value(DecodeConfig(), k) for k in shared)  # each one differs from its default

    class Tok:  # what from_decode reads of a tokenizer
        specials = Specials(pad=1, unk=0, start=2, eos=5)
        languages, default_tgt_lang, free_language_token = {}, None, False

        def vocab_pieces(self):
            return [["<ph_1>"], ["<unk>", "<s>", "a", "<ph_0>", "</s>", "<ph_1>", "▁<ph_1>"]]

    options = SearchOptions.from_decode(decode_config(None, changed), Tok())
    assert {k: getattr(options, k) for k in shared} == {k: changed[k] for k in shared}
    assert options.specials == Tok.specials and options.free_prefix == 0
    assert options.placeholder_tokens[:2] == ((3,), (5, 6)) and not any(options.placeholder_tokens[2:])
    assert SearchOptions.from_decode(decode_config(None, {}), Tok()).placeholder_tokens is None


def test_search_dispatches_on_the_options():
    """One entry point: sampling, greedy search at beam 1, else beam search (the strategies' own results)."""
    from nmt.search import sample_search

    model = FakeModel(seed=8)
    src, src_mask = fake_batch([3, 5, 2], seed=8)
    inputs = SearchInputs(prefixes=[[4], [], [5, 6]], keys=[3, 1, 2])
    for options, strategy in ((SearchOptions(max_len_a=1.0, max_len_b=2), greedy_search),
                              (SearchOptions(beam_size=3, nbest=2, max_len_a=1.0, max_len_b=2), beam_search),
                              (SearchOptions(sampling="topk", topk=3, nbest=2, max_len_a=1.0, max_len_b=2),
                               sample_search)):
        want = strategy(model, src, src_mask, options, inputs)
        assert search(model, src, src_mask, options, inputs) == want
        assert [len(h) for h in want] == [options.nbest] * 3
    greedy = search(model, src, src_mask, SearchOptions(max_len_a=1.0, max_len_b=2), inputs)
    assert greedy != search(model, src, src_mask, SearchOptions(beam_size=3, max_len_a=1.0, max_len_b=2), inputs)
    with pytest.raises(ValueError, match="sampling"):  # glossary terms are searched by greedy and beam search only
        search(model, src, src_mask, SearchOptions(sampling="topk", max_len_a=1.0, max_len_b=2),
               SearchInputs(constraints=[[[4]]] * 3))


def test_bad_arguments():
    model = FakeModel()
    src, src_mask = fake_batch([2])
    for kw in (dict(beam_size=0), dict(beam_size=2, nbest=3), dict(beam_size=2, length_penalty_type="x"),
               dict(beam_size=2, length_penalty=-1.0), dict(beam_size=2, stopping="never"),
               dict(beam_size=2, stopping="hf", keep_all=True), dict(min_len=-1), dict(no_repeat_ngram=-1),
               dict(sampling="x"), dict(sampling="topk", topp=0.0), dict(beam_size=2, patience=0.1),
               dict(beam_size=2, glossary_margin=-1.0), dict(beam_size=2, glossary_margin=float("nan"))):
        with pytest.raises(ValueError):
            SearchOptions(max_len_a=1.0, max_len_b=1, **kw)
    options = SearchOptions(max_len_a=1.0, max_len_b=1)
    for inputs in (SearchInputs(prefixes=[[4], [5]]), SearchInputs(prefixes=[[EOS_ID]]), SearchInputs(keys=[1, 2])):
        with pytest.raises(ValueError):
            search(model, src, src_mask, options, inputs)
    assert greedy_search(model, src[:0], src_mask[:0], options) == []
    assert beam_search(model, src[:0], src_mask[:0], SearchOptions(beam_size=2, max_len_a=1.0, max_len_b=1)) == []


# --------------------------------------------------------------------------- tiny Transformer

@pytest.fixture(scope="module")
def model() -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=16, n_heads=2, layers=2, ffn_dim=32, dropout=0.0, max_positions=32, tie_output=False,
                      positions="sinusoidal")  # the table these seeds were chosen with (varied output lengths)
    m = Transformer(cfg, V, V).eval()
    with torch.no_grad():  # flatter next-token distributions than the default init: more varied searches
        m.output_proj.weight.normal_(0.0, 0.15)
        m.output_proj.weight[EOS_ID] *= 0.3  # EOS neither always first nor never
    return m


def model_batch(lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    return fake_batch(lengths, seed)


def teacher_forced_scores(model, src_row, mask_row, outputs, alpha, kind):
    """Score many (tokens, eos) outputs of one source with model.decode (full teacher forcing)."""
    seqs = [[BOS_ID] + toks + ([EOS_ID] if eos else []) for toks, eos in outputs]
    T = max(len(s) for s in seqs)
    tgt = torch.tensor([s + [PAD_ID] * (T - len(s)) for s in seqs])
    n = len(seqs)
    with torch.no_grad():
        memory = model.encode(src_row[None].expand(n, -1), mask_row[None].expand(n, -1))
        logp = F.log_softmax(model.decode(tgt[:, :-1], memory, mask_row[None].expand(n, -1)).float(), -1)
    tok_lp = logp.gather(2, tgt[:, 1:, None])[..., 0]  # [n, T-1]
    res = []
    for i, s in enumerate(seqs):
        lp = float(tok_lp[i, : len(s) - 1].double().sum())
        res.append((lp / penalty(len(s) - 1, alpha, kind), lp))
    return res


@pytest.mark.parametrize("kind,alpha", [("gnmt", 1.5), ("average", 1.0), ("none", 0.0)])
def test_transformer_beam_vs_brute_force(model, kind, alpha):
    max_len = 4
    src, src_mask = model_batch([5, 3], seed=6)
    outputs = list(enumerate_outputs(max_len, 0))
    kw = dict(length_penalty=alpha, length_penalty_type=kind, max_len_a=0.0, max_len_b=max_len)
    wide = len(ALLOWED) ** (max_len - 2) * (len(ALLOWED) + 1)  # no pruning at any step
    exhaustive = beam_search(model, src, src_mask, SearchOptions(beam_size=wide, nbest=2, **kw))
    narrow = {K: beam_search(model, src, src_mask, SearchOptions(beam_size=K, **kw)) for K in (1, 2, V)}
    for i in range(src.shape[0]):
        ref = teacher_forced_scores(model, src[i], src_mask[i], outputs, alpha, kind)
        order = sorted(range(len(outputs)), key=lambda j: -ref[j][0])
        best = exhaustive[i]
        assert best[0].tokens == outputs[order[0]][0]
        assert [h.score for h in best] == pytest.approx([ref[j][0] for j in order[:2]], abs=1e-4)
        assert best[0].log_prob == pytest.approx(ref[order[0]][1], abs=1e-4)
        for K, out in narrow.items():
            h = out[i][0]
            j = outputs.index((h.tokens, len(h.tokens) < max_len))  # a valid output
            assert (h.score, h.log_prob) == pytest.approx(ref[j], abs=1e-4)
            assert h.score <= ref[order[0]][0] + 1e-5


def test_transformer_beam1_equals_greedy_without_penalty(model):
    """Beam 1 without a length penalty is greedy search. With a penalty it searches on past an
    ending (the top 2 candidates: a live beam is refilled), so its penalised score is at least
    greedy's."""
    src, src_mask = model_batch([7, 2, 5, 9, 4], seed=7)
    kw = dict(max_len_a=1.5, max_len_b=3)
    greedy = [h for (h,) in greedy_search(model, src, src_mask, SearchOptions(**kw))]
    beam = beam_search(model, src, src_mask, SearchOptions(beam_size=1, length_penalty_type="none", **kw))
    assert [b[0].tokens for b in beam] == [g.tokens for g in greedy]
    assert [b[0].log_prob for b in beam] == pytest.approx([g.log_prob for g in greedy], abs=1e-6)
    assert len({len(g.tokens) for g in greedy}) > 1  # the batch really has sentences ending at different steps
    for kind in ("gnmt", "average"):
        beam = beam_search(model, src, src_mask, SearchOptions(beam_size=1, length_penalty_type=kind, **kw))
        for (b,), g in zip(beam, greedy):
            length = len(g.tokens) + g.finished
            assert b.score >= g.log_prob / penalty(length, 1.0, kind) - 1e-6


def test_transformer_batch_independence_and_cache(model):
    lengths = [7, 2, 5, 9, 4, 1]
    src, src_mask = model_batch(lengths, seed=8)
    kw = dict(beam_size=4, nbest=3, max_len_a=1.2, max_len_b=3)
    batched = beam_search(model, src, src_mask, SearchOptions(**kw))
    uncached = beam_search(model, src, src_mask, SearchOptions(use_cache=False, **kw))
    greedy_options = SearchOptions(max_len_a=1.2, max_len_b=3)
    greedy = [h for (h,) in greedy_search(model, src, src_mask, greedy_options)]
    greedy_uncached = greedy_search(model, src, src_mask, SearchOptions(max_len_a=1.2, max_len_b=3, use_cache=False))
    assert [g.tokens for g in greedy] == [g.tokens for (g,) in greedy_uncached]
    for i, n in enumerate(lengths):
        alone = beam_search(model, src[i : i + 1, :n], src_mask[i : i + 1, :n], SearchOptions(**kw))[0]
        for other in (batched[i], uncached[i]):
            assert [h.tokens for h in other] == [h.tokens for h in alone]
            assert [h.score for h in other] == pytest.approx([h.score for h in alone], abs=1e-5)
        (g_alone,) = greedy_search(model, src[i : i + 1, :n], src_mask[i : i + 1, :n], greedy_options)[0]
        assert g_alone.tokens == greedy[i].tokens


def test_transformer_nbest_sorted_distinct_and_max_len(model):
    lengths = [6, 3, 8]
    src, src_mask = model_batch(lengths, seed=9)
    out = beam_search(model, src, src_mask, SearchOptions(beam_size=5, nbest=5, length_penalty=0.6, max_len_a=0.5,
                                                          max_len_b=2))
    for n, hyps in zip(lengths, out):
        assert len(hyps) == 5
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == 5
        assert all(len(h.tokens) <= int(0.5 * n + 2) for h in hyps)
        assert all(t not in (PAD_ID, BOS_ID, EOS_ID) for h in hyps for t in h.tokens)
    # model.max_positions caps the output length: at most max_positions - 1 tokens.
    capped = beam_search(model, src, src_mask, SearchOptions(beam_size=2, max_len_a=0.0, max_len_b=100, min_len=100))
    assert [len(h[0].tokens) for h in capped] == [model.max_positions - 1] * 3


def test_min_len_and_forced_length(model):
    src, src_mask = model_batch([3, 5, 2, 6], seed=10)
    kw = dict(max_len_a=0.0, max_len_b=9)
    for m in (model, FakeModel(seed=10, scale=0.5)):  # both end early when free to
        free = beam_search(m, src, src_mask, SearchOptions(beam_size=3, nbest=3, **kw))
        assert min(len(h.tokens) for hyps in free for h in hyps) < 4
        assert min(len(g.tokens) for (g,) in greedy_search(m, src, src_mask, SearchOptions(**kw))) < 4
        for min_len in (4, 9):  # 9 == max_len: exactly 9 tokens
            out = beam_search(m, src, src_mask, SearchOptions(beam_size=3, nbest=3, min_len=min_len, **kw))
            lens = [len(h.tokens) for hyps in out for h in hyps] + [
                len(g.tokens) for (g,) in greedy_search(m, src, src_mask, SearchOptions(min_len=min_len, **kw))]
            assert min(lens) >= min_len and max(lens) <= 9
            assert min_len < 9 or set(lens) == {9}


# --------------------------------------------------------------------------- host reads per step

class _NoEos(torch.nn.Module):
    """A tiny random Transformer that never ends by itself (EOS logit -30): outputs run to their limit."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        cfg = ModelConfig(d_model=16, n_heads=2, layers=1, ffn_dim=32, dropout=0.0, max_positions=40, tie_output=False)
        self.inner = Transformer(cfg, 14, 14).eval()
        self.max_positions = self.inner.max_positions

    def encode(self, src, src_mask):
        return self.inner.encode(src, src_mask)

    def init_cache(self, *args, **kwargs):
        return self.inner.init_cache(*args, **kwargs)

    def decode_step(self, tokens, cache):
        logits = self.inner.decode_step(tokens, cache)
        logits[:, EOS_ID] = -30.0
        return logits


@pytest.mark.parametrize("case", ["greedy", "greedy+ngram", "beam", "beam+ngram", "placeholders", "terms", "greedy+terms",
                                  "prefix+terms+placeholders", "fast greedy", "fast beam+terms"])
def test_decoding_reads_the_host_at_most_once_per_step(case):
    """Two searches whose outputs are forced to 10 and to 20 tokens: the extra steps of the second cost at
    most one host read each (what ends and what stays) on the search a GPU runs (plain ops), where each
    read is a device sync. On the CPU's fast ops (nmt/search/fast.py) the reusing cache also looks up which beams
    moved (tensors on the host already: no device to wait for), one more per beam search step."""
    from nmt.search.fast import FAST_OPS
    from nmt.search import PLAIN_OPS

    model = _NoEos()
    src, mask = fake_batch([5, 3, 4], seed=2)
    beam = 1 if "greedy" in case else 3
    extra = dict(no_repeat_ngram=2) if "ngram" in case else {}
    if "placeholders" in case:
        extra["placeholder_tokens"] = ((10,), (11,))
    inputs = SearchInputs(
        placeholders=[[0], [1], [0, 1]] if "placeholders" in case else None,
        constraints=[[[7, 8]], [], [[9], [12, 13]]] if "terms" in case else None,
        prefixes=[[5], [], [6, 7]] if "prefix" in case else None)
    ops = FAST_OPS if case.startswith("fast") else PLAIN_OPS
    reads, lengths = [], []
    for limit in (10, 20):
        options = SearchOptions(beam_size=beam, max_len_a=0.0, max_len_b=limit, **extra)
        with HostReads() as counter:
            out = search(model, src, mask, options, inputs, ops=ops)
        reads.append(counter.count)
        lengths.append(max(len(h.tokens) for hyps in out for h in hyps))
    assert lengths == [10, 20]
    most = 2 if case == "fast beam+terms" else 1
    assert (reads[1] - reads[0]) / (lengths[1] - lengths[0]) <= most, reads


@pytest.mark.parametrize("kw", [dict(beam_size=1), dict(beam_size=4, nbest=3, no_repeat_ngram=2),
                                dict(sampling="topk", topk=5, nbest=2, seed=1),
                                dict(beam_size=3, keep_all=True, length_penalty=0.0)])
def test_on_final_gives_each_sentence_its_returned_hypotheses_when_it_leaves(kw):
    """Issue 58: `search(..., on_final=...)` hands each sentence's hypotheses over once, equal to what the
    search returns, and those of sentences that finish early before the search ends (streamed lines)."""
    from nmt.layout import source_tensors
    from nmt.search import search

    model = tiny_transformer(seed=3).eval()
    gen = torch.Generator().manual_seed(0)
    ids = [torch.randint(4, 20, (n,), generator=gen).tolist() for n in (3, 9, 1, 6, 12, 2)]
    src, src_mask = source_tensors(ids)
    options = SearchOptions(max_len_a=1.0, max_len_b=2, **kw)
    steps, got = [], {}

    def on_final(b, hyps):
        assert b not in got
        got[b] = (hyps, len(steps))

    out = search(model, src, src_mask, options, cancel=lambda: steps.append(1) and False, on_final=on_final)
    assert out == search(model, src, src_mask, options)
    assert sorted(got) == list(range(len(ids)))
    assert all(got[b][0] == out[b] for b in got)
    assert min(at for _, at in got.values()) < len(steps)  # (the step count when it came) before the end


def test_searches_that_join_a_running_one_mid_search_give_what_they_give_alone(model):
    """Three searches in three threads through one StepPool (nmt/search/joining.py): a beam search with
    n-best, and, started while it is at its 4th step, a greedy search with prefixes and n-gram blocking and a
    sampling search. Their steps run joined (one forward pass over all their rows) until each ends, and
    each gives what it gives alone; a search cancelled mid-search leaves the pool at once."""
    import dataclasses
    import threading
    import time

    from nmt.search import PLAIN_OPS
    from nmt.search.joining import StepPool

    pool = StepPool(wait=30.0)  # (a step waits for every member: which steps join does not depend on timing)
    ops = dataclasses.replace(PLAIN_OPS, steps=pool)
    src, src_mask = model_batch([7, 2, 5, 9], seed=8)
    jobs = {"beam": (src, src_mask, SearchOptions(beam_size=3, nbest=2, min_len=10, max_len_a=0.0, max_len_b=16),
                     SearchInputs()),
            "greedy": (src[:2, :7], src_mask[:2, :7], SearchOptions(no_repeat_ngram=2, max_len_a=1.2, max_len_b=3),
                       SearchInputs(prefixes=[[5, 6], []])),
            "sample": (src[2:], src_mask[2:], SearchOptions(sampling="topk", topk=5, nbest=2, max_len_a=1.0, max_len_b=4),
                       SearchInputs(keys=[7, 3]))}
    alone = {k: search(model, s, m, o, i) for k, (s, m, o, i) in jobs.items()}
    got, threads, beam_steps = {}, [], []

    def run(k, cancel=None):
        s, m, o, i = jobs[k]
        got[k] = search(model, s, m, o, i, ops=ops, cancel=cancel)

    def at_beam_step() -> bool:  # the beam search's step hook: at its 4th step the others start and join it
        beam_steps.append(pool.steps)
        if len(beam_steps) == 4:
            threads.extend(threading.Thread(target=run, args=(k,)) for k in ("greedy", "sample"))
            for t in threads:
                t.start()
            deadline = time.monotonic() + 30
            while pool.members < 3 and time.monotonic() < deadline:  # both asked for their first step
                time.sleep(0.001)
        return False

    run("beam", at_beam_step)
    for t in threads:
        t.join()
    for k, out in alone.items():
        assert [[h.tokens for h in hyps] for hyps in got[k]] == [[h.tokens for h in hyps] for hyps in out], k
        assert [h.score for hyps in got[k] for h in hyps] == pytest.approx([h.score for hyps in out for h in hyps],
                                                                           abs=1e-5)
    greedy_steps = max(len(h.tokens) + h.finished for (h,) in alone["greedy"])
    assert pool.joined >= greedy_steps  # every step of the greedy search ran in one pass with the beam search's
    assert pool.steps < len(beam_steps) + greedy_steps  # ... and none of them alone
    assert pool.members == 0


def test_a_search_cancelled_mid_search_leaves_the_pool_and_the_others_go_on(model):
    import dataclasses
    import threading
    import time

    from nmt.errors import Cancelled
    from nmt.search import PLAIN_OPS
    from nmt.search.joining import StepPool

    pool = StepPool(wait=30.0)
    ops = dataclasses.replace(PLAIN_OPS, steps=pool)
    src, src_mask = model_batch([7, 2, 5, 9], seed=8)
    options = SearchOptions(beam_size=2, min_len=10, max_len_a=0.0, max_len_b=12)
    stop, members, outcome, its_steps = threading.Event(), [], [], []

    def its_step() -> bool:  # before its 2nd step, it waits until the other search is in the pool too
        its_steps.append(1)
        deadline = time.monotonic() + 30
        while len(its_steps) == 2 and pool.members < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        return stop.is_set()

    def cancelled_one():
        try:
            search(model, src[:2], src_mask[:2], SearchOptions(min_len=10, max_len_a=0.0, max_len_b=12), ops=ops,
                   cancel=its_step)
        except Cancelled:
            outcome.append("cancelled")
    other = threading.Thread(target=cancelled_one)

    def at_step() -> bool:
        members.append(pool.members)
        if len(members) == 1:
            other.start()
            deadline = time.monotonic() + 30
            while pool.members < 1 and time.monotonic() < deadline:
                time.sleep(0.001)
        if len(members) == 4:
            stop.set()
        return False

    out = search(model, src, src_mask, options, ops=ops, cancel=at_step)
    other.join()
    assert outcome == ["cancelled"]
    assert members[1:4] == [2, 2, 2] and set(members[5:]) == {1}  # joined, then alone once it left
    assert [[h.tokens for h in hyps] for hyps in out] == \
        [[h.tokens for h in hyps] for hyps in search(model, src, src_mask, options)]
    assert pool.members == 0


def test_the_step_pool_runs_a_new_short_search_first_joins_short_ones_and_lets_a_long_one_go_on():
    """StepPool's choice of the searches that step together (nmt/search/joining.py), on a model whose step
    takes time in proportion to its rows: a long search (80 rows) runs 30 steps; then two short ones (1 row
    each) start: their steps run joined with each other (2 rows, once both have asked), not with the long one's
    (its rows do not fit in `join_rows`; the first may step alone until the other has asked), and all of them
    before the long one's next step (their claims are far below its own);
    afterwards the long one goes on alone to its end."""
    import threading
    import time

    from nmt.search.joining import StepPool

    class Timed:  # decode_step: 0.2 ms a row, recording each step's rows
        def __init__(self):
            self.steps: list[int] = []

        def decode_step(self, tokens, cache):
            self.steps.append(tokens.shape[0])
            time.sleep(0.0002 * tokens.shape[0])
            return torch.zeros(tokens.shape[0], 3)

    model, pool = Timed(), StepPool(wait=30.0, join_rows=64)
    started = threading.Barrier(3)

    def search_like(rows: int, steps: int, start_at: int | None = None) -> None:
        with pool.member():
            for t in range(steps):
                if t == start_at:
                    for s in shorts:
                        s.start()
                    started.wait()  # (both short ones have started)
                    while pool.members < 3:
                        time.sleep(0.0005)
                    assert pool.running_rows == 80 + 1 + 1
                pool.step(model, None, torch.zeros(rows, dtype=torch.long))

    def short() -> None:
        started.wait()
        search_like(1, 10)

    shorts = [threading.Thread(target=short) for _ in range(2)]
    search_like(80, 40, start_at=30)
    for s in shorts:
        s.join()
    shorts_steps = model.steps[30:-10]  # (the first short one may take a step before the other has asked)
    assert model.steps[:30] == model.steps[-10:] + [80] * 20 == [80] * 30, str(model.steps)
    assert sum(shorts_steps) == 20 and set(shorts_steps) <= {1, 2} and shorts_steps.count(2) >= 1, str(model.steps)
    assert pool.members == 0 and pool.joined == shorts_steps.count(2) and pool.rows == 80 * 40 + 20


@pytest.mark.parametrize("parallel", [1, 2])
def test_the_step_pool_runs_up_to_parallel_steps_at_once(parallel):
    """StepPool(parallel=2) (`nmt serve` on 2 CPU threads): the steps of two searches that do not join (each of
    `join_rows` rows or more) run at the same time, each in its own thread; with parallel=1, one at a time."""
    import threading

    from nmt.search.joining import StepPool

    meet, lock = threading.Barrier(2, timeout=1.0), threading.Lock()
    met: list[bool] = []
    entered = [0]

    class Model:  # its first two steps wait (at most 1 s) for another step to be running
        def decode_step(self, tokens, cache):
            with lock:
                entered[0] += 1
                first_two = entered[0] <= 2
            if first_two:
                try:
                    meet.wait()
                    met.append(True)
                except threading.BrokenBarrierError:
                    met.append(False)
            return torch.zeros(tokens.shape[0], 3)

    model, pool = Model(), StepPool(wait=30.0, join_rows=64, parallel=parallel)

    def search_like() -> None:
        with pool.member():
            for _ in range(3):
                pool.step(model, None, torch.zeros(64, dtype=torch.long))

    threads = [threading.Thread(target=search_like) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert met == ([True, True] if parallel == 2 else [False, False]) and pool.steps == 6 and pool.joined == 0
