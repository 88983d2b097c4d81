"""Decoding controls in the search (issue 18): repetition blocking, forced target prefixes and
sampling, against independent references (a scripted looping model, brute-force distributions,
teacher-forced scores)."""

from __future__ import annotations

import collections
import math

import pytest
import torch
import torch.nn.functional as F

from nmt.search.sampling import uniform_noise
from nmt.search import SearchInputs, SearchOptions, beam_search, greedy_search, sample_search
from nmt.text.tokenizer import BOS_ID, EOS_ID, PAD_ID

from helpers import FakeCache, FakeModel, fake_batch

V = 8


class LoopingModel:
    """Wants to loop: after token a it strongly prefers a+1 (cycling over 4..7), EOS is unlikely.
    Without blocking, every output is 4 5 6 7 4 5 6 7 ... up to the length limit."""

    max_positions = 64

    def encode(self, src, src_mask):
        return src.float()[..., None]

    def init_cache(self, memory, src_mask, max_len, cache_cls=None):
        return FakeCache(memory[..., 0].long(), torch.empty(memory.shape[0], 0, dtype=torch.long))

    def decode_step(self, tokens, cache):
        cache.prefix = torch.cat([cache.prefix, tokens[:, None]], dim=1)
        logits = torch.zeros(tokens.shape[0], V)
        nxt = torch.where(tokens >= 4, 4 + (tokens - 3) % 4, torch.full_like(tokens, 4))
        logits.scatter_(1, nxt[:, None], 6.0)
        logits[:, EOS_ID] = -2.0
        logits[:, 4:] += torch.arange(4) * 0.1  # ties broken, alternatives ranked
        return logits


def ngrams(tokens, n):
    return [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]


def run(kind, model, src, mask, prefixes=None, **kw):
    common, inputs = dict(max_len_a=0.0, max_len_b=14), SearchInputs(prefixes=prefixes)
    if kind == "greedy":
        return greedy_search(model, src, mask, SearchOptions(**common, **kw), inputs)
    if kind == "beam":
        return beam_search(model, src, mask, SearchOptions(beam_size=3, nbest=3, **common, **kw), inputs)
    return sample_search(model, src, mask, SearchOptions(nbest=4, sampling="topk", topk=3, seed=7, **common, **kw),
                         inputs)


@pytest.mark.parametrize("kind", ["greedy", "beam", "sample"])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_no_repeat_ngram_blocks_every_repeat(kind, n):
    model = LoopingModel()
    src, mask = fake_batch([3, 5])
    looping = run(kind, model, src, mask)
    assert any(len(set(ngrams(h.tokens, n))) < len(ngrams(h.tokens, n)) for hyps in looping for h in hyps)
    blocked = run(kind, model, src, mask, no_repeat_ngram=n)
    for hyps in blocked:
        for h in hyps:
            grams = ngrams(h.tokens, n)
            assert len(set(grams)) == len(grams), h.tokens
            assert PAD_ID not in h.tokens and BOS_ID not in h.tokens
    if n >= 2:  # with n >= 2 there is room: outputs stay long instead of ending at once
        assert max(len(h.tokens) for hyps in blocked for h in hyps) >= 6


def test_block_repeats_against_a_plain_loop():
    from nmt.search.rules import block_repeats

    g = torch.Generator().manual_seed(0)
    for n in (1, 2, 3, 4):
        history = torch.randint(4, 8, (6, 10), generator=g)
        logp = torch.zeros(6, V)
        block_repeats(logp, history, n)
        for r in range(6):
            h = history[r].tolist()
            banned = {h[i + n - 1] for i in range(len(h) - n + 1) if n == 1 or h[i:i + n - 1] == h[len(h) - n + 1:]}
            assert {t for t in range(V) if logp[r, t] == -math.inf} == banned


@pytest.mark.parametrize("kind", ["greedy", "beam", "sample"])
def test_prefix_is_forced_and_scored(kind):
    """Every output starts with its sentence's prefix (an empty prefix forces nothing), and
    log_prob is the model's teacher-forced log-probability of the whole output."""
    model = FakeModel(seed=3)
    src, mask = fake_batch([3, 4, 2], seed=3)
    prefixes = [[5, 5, 6], [], [7]]
    out = run(kind, model, src, mask, prefixes=prefixes)
    free = run(kind, model, src, mask)
    for i, (hyps, prefix) in enumerate(zip(out, prefixes)):
        s = FakeModel._src(src[i])
        for h in hyps:
            assert h.tokens[: len(prefix)] == prefix
            seq = [BOS_ID] + h.tokens + ([EOS_ID] if h.finished else [])
            lp = sum(float(model.log_probs(s, tuple(seq[: j + 1]))[seq[j + 1]]) for j in range(len(seq) - 1))
            assert h.log_prob == pytest.approx(lp, abs=1e-4)
        if not prefix:
            assert [h.tokens for h in hyps] == [h.tokens for h in free[i]]


def test_prefix_longer_than_the_limit_still_fits_and_may_end():
    model = FakeModel(seed=4)
    src, mask = fake_batch([2], seed=4)
    prefix = [4, 5, 6, 7, 4, 5]
    (h,) = greedy_search(model, src, mask, SearchOptions(max_len_a=0.0,
                                                         max_len_b=2), SearchInputs(prefixes=[prefix]))[0]
    assert h.tokens[:6] == prefix and len(h.tokens) <= 7


def exact_distribution(logp: torch.Tensor, sampling: str, k: int, p: float, temperature: float) -> torch.Tensor:
    """Brute force: the distribution the sampler should draw from, computed token by token."""
    x = (logp / temperature).double()
    probs = torch.softmax(x, dim=0)
    order = sorted(range(len(probs)), key=lambda t: -float(probs[t]))
    keep, total = [], 0.0
    for rank, t in enumerate(order):
        if sampling == "topk" and rank >= k:
            break
        if sampling == "topp" and total >= p:
            break
        if probs[t] > 0:
            keep.append(t)
            total += float(probs[t])
    out = torch.zeros_like(probs)
    out[keep] = probs[keep] / probs[keep].sum()
    return out


@pytest.mark.parametrize("sampling,k,p,temperature", [("topk", 3, 1.0, 1.0), ("topk", 2, 1.0, 0.7),
                                                      ("topp", 8, 0.6, 1.0), ("topp", 8, 0.9, 1.5)])
def test_sampling_draws_from_the_filtered_distribution(sampling, k, p, temperature):
    """First-token frequencies of 6,000 samples against the exact top-k / nucleus distribution
    (chi-square test at a level no correct sampler fails in practice)."""
    model = FakeModel(seed=5, scale=1.0)
    src, mask = fake_batch([3], seed=5)
    n = 6000
    out = sample_search(model, src, mask, SearchOptions(nbest=n, sampling=sampling, topk=k, topp=p,
                                                        temperature=temperature, seed=11, max_len_a=0.0, max_len_b=1))[0]
    first = collections.Counter(h.tokens[0] if h.tokens else EOS_ID for h in out)
    logp = F.log_softmax(model.logits(FakeModel._src(src[0]), (BOS_ID,)), dim=-1)
    logp[[PAD_ID, BOS_ID]] = -math.inf
    want = exact_distribution(logp, sampling, k, p, temperature)
    support = [t for t in range(V) if want[t] > 0]
    assert set(first) <= set(support)  # nothing outside the top-k / nucleus
    chi2 = sum((first[t] - n * float(want[t])) ** 2 / (n * float(want[t])) for t in support)
    assert chi2 < 30, (first, want)  # chi-square, <= 7 degrees of freedom: p < 1e-4


def test_sampling_is_reproducible_per_sentence_key():
    model = FakeModel(seed=6, scale=0.5)
    src, mask = fake_batch([3, 4, 2, 5], seed=6)
    kw = dict(nbest=3, sampling="topp", topp=0.95, max_len_a=1.0, max_len_b=3)
    keys = SearchInputs(keys=[10, 11, 12, 13])
    a = sample_search(model, src, mask, SearchOptions(seed=1, **kw), keys)
    b = sample_search(model, src, mask, SearchOptions(seed=1, **kw), keys)
    c = sample_search(model, src, mask, SearchOptions(seed=2, **kw), keys)
    assert a == b and a != c
    alone = sample_search(model, src[2:3], mask[2:3], SearchOptions(seed=1, **kw),
                          SearchInputs(keys=[12]))  # batch companions do not matter
    assert alone[0] == a[2]
    assert len({tuple(h.tokens) for h in a[3]}) > 1  # the samples of one sentence differ


def test_uniform_noise_is_uniform_and_independent():
    keys = torch.tensor([1, 2, 3, -5], dtype=torch.long)
    u = uniform_noise(keys, 3, 50_000)
    assert u.min() > 0 and u.max() < 1 and abs(float(u.mean()) - 0.5) < 0.005
    assert abs(float(torch.corrcoef(torch.stack([u[0], u[1]]))[0, 1])) < 0.02
    assert not torch.equal(uniform_noise(keys, 4, 10), uniform_noise(keys, 3, 10))


# --------------------------------------------------------------------------- through the pipeline and the CLI

import re

from nmt.config import decode_config
from nmt.translation.torch_engine import TorchEngine
from nmt.commands.translate import TranslateOptions, translate_command
from nmt.translation.translate import translate_nbest
from helpers import make_pairs
from helpers import run_nmt as cli



@pytest.fixture(scope="module")
def engine(ckpt):
    return TorchEngine.load(ckpt, "cpu")


def test_sampled_translations_are_reproducible_and_independent_of_batching(engine):
    lines = [p[0] for p in make_pairs(10, 12)]
    decode = decode_config(engine.decode, dict(sampling="topp", topp=0.9, nbest=3, seed=5))
    a = translate_nbest(engine, lines, decode)
    b = translate_nbest(engine, lines, decode_config(decode, dict(batch_tokens=12, workers=2)))
    c = translate_nbest(engine, lines, decode_config(decode, dict(seed=6)))
    text = lambda r: [[h.text for h in hyps] for hyps in r]
    assert text(a) == text(b) and text(a) != text(c)
    assert all(len(hyps) == 3 for hyps in a)
    assert any(len({h.text for h in hyps}) > 1 for hyps in a)  # samples, not copies of one output
    assert all(hyps[0].score >= hyps[-1].score for hyps in a)


@pytest.mark.slow
def test_prefixes_are_kept_verbatim(engine, ckpt, tmp_path):
    lines = [p[0] for p in make_pairs(6, 13)]
    prefixes = ["the red cat", "", "the", "the big river eats", "sees", "the moon"]
    for beam in (1, 3):
        decode = decode_config(engine.decode, dict(beam_size=beam, nbest=beam))
        out = translate_nbest(engine, lines, decode, prefixes=prefixes)
        free = translate_nbest(engine, lines, decode)
        for hyps, prefix, ref in zip(out, prefixes, free):
            assert all(h.text.startswith(prefix) for h in hyps)
            if not prefix:
                assert [h.text for h in hyps] == [h.text for h in ref]
    src, pre, outp = tmp_path / "in.es", tmp_path / "prefix.en", tmp_path / "out.en"
    src.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    pre.write_text("".join(x + "\n" for x in prefixes), encoding="utf-8")
    translate_command(TranslateOptions(ckpt, str(src), str(outp), prefix=str(pre), device="cpu", quiet=True))
    got = outp.read_text(encoding="utf-8").splitlines()
    assert len(got) == len(lines) and all(g.startswith(p) for g, p in zip(got, prefixes))
    pre.write_text("only one\n", encoding="utf-8")
    r = cli("translate", "-c", ckpt, "-i", str(src), "--prefix", str(pre))
    assert r.returncode == 2 and "line counts differ" in r.stderr and len(r.stderr.splitlines()) == 1


@pytest.mark.slow
def test_no_repeat_ngram_through_the_command(ckpt, tmp_path):
    """The tiny word-level model loops when untrained; with --no-repeat-ngram 2 no word bigram repeats."""
    lines = [p[0] for p in make_pairs(20, 14)]
    r = cli("translate", "-c", ckpt, "--beam", "2", "--max-len-a", "3", "--no-repeat-ngram", "2", "-q",
            stdin="".join(x + "\n" for x in lines))
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert len(out) == len(lines)
    for line in out:
        grams = ngrams(line.split(), 2)
        assert len(set(grams)) == len(grams), line


@pytest.mark.slow
def test_alignment_output(engine, ckpt, tmp_path):
    lines = [p[0] for p in make_pairs(5, 15)] + [""]
    decode = decode_config(engine.decode, dict(alignment=True, beam_size=2))
    out = translate_nbest(engine, lines, decode)
    for line, (h,) in zip(lines, out):
        if not line:
            assert h.text == "" and h.alignment is None
            continue
        x = engine.tokenizer.encode_src([line])[0]
        y = engine.tokenizer.encode_tgt([h.text])[0]
        assert [j for _, j in h.alignment] == list(range(len(y)))
        assert all(0 <= i < len(x) for i, _ in h.alignment)
        with torch.no_grad():  # the reference: argmax of the model's own alignment weights
            src = torch.tensor([x + [EOS_ID]])
            w = engine.model.alignment(src, torch.ones_like(src, dtype=torch.bool), torch.tensor([[BOS_ID] + y[:-1]]))
        assert [i for i, _ in h.alignment] == w[0, : len(y), : len(x)].argmax(dim=1).tolist()
    r = cli("translate", "-c", ckpt, "--alignment", "--beam", "1", "-q", stdin="".join(x + "\n" for x in lines))
    rows = r.stdout.splitlines()
    assert len(rows) == len(lines) and rows[-1] == " ||| "
    for row, (h,) in zip(rows, out):
        text, align = row.split(" ||| ")
        assert len(align.split()) == len(text.split())  # a word model: one pair per output word
        assert all(re.fullmatch(r"\d+-\d+", a) for a in align.split())
    r = cli("translate", "-c", ckpt, "--alignment", "--nbest", "2", "--beam", "2", "-q", stdin="el sol\n")
    assert all(re.fullmatch(r"0 \|\|\| .* \|\|\| -?\d+\.\d{4} \|\|\| .*", x) for x in r.stdout.splitlines())


def test_alignment_weights_are_the_attention_sdpa_computes():
    from nmt.config import ModelConfig
    from nmt.masks import attention_mask
    from nmt.model.transformer import Transformer

    torch.manual_seed(0)
    for norm in ("pre", "post"):
        model = Transformer(ModelConfig(d_model=16, n_heads=4, layers=2, ffn_dim=32, dropout=0.0, norm=norm,
                                        max_positions=32), 30, 30).eval()
        src = torch.randint(4, 30, (2, 7))
        src[1, 4:] = PAD_ID
        mask = src != PAD_ID
        x = torch.randn(2, 5, 16)
        memory = model.encode(src, mask)
        layer = model.decoder.layers[-1]
        w = layer.cross_attn.weights(x, memory, attention_mask(mask))  # [B,H,T,S]
        _, v = layer.cross_attn.project_kv(memory)
        manual = layer.cross_attn.out_proj((w @ v).transpose(1, 2).reshape(2, 5, 16))
        torch.testing.assert_close(manual, layer.cross_attn(x, memory, attention_mask(mask)), atol=1e-5, rtol=0)
        assert torch.all(w[1, :, :, 4:] == 0)  # padding gets no weight
        a = model.alignment(src, mask, torch.randint(4, 30, (2, 5)))
        torch.testing.assert_close(a.sum(-1), torch.ones(2, 5))


@pytest.mark.slow
@pytest.mark.parametrize("flags,message", [
    (["--sampling", "beam"], "decode.sampling.method"), (["--topp", "0"], "decode.sampling.topp"), (["--topp", "1.5"], "decode.sampling.topp"),
    (["--topk", "0"], "decode.sampling.topk"), (["--temperature", "0"], "decode.sampling.temperature"),
    (["--no-repeat-ngram", "-1"], "decode.no_repeat_ngram"), (["--seed", "x"], "decode.sampling.seed"),
    (["--protect-pattern", "(a"], "not a regular expression"), (["--protect"], "data.protect: true"),
    (["--nbest", "3", "--beam", "2"], "decode.nbest")])
def test_bad_values_are_one_line_errors(ckpt, flags, message):
    r = cli("translate", "-c", ckpt, *flags, stdin="el sol\n")
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stdout == ""
