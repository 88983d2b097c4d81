"""Language-contrastive decoding (`decode.contrast`: `lang`, `weight`; Sennrich et al., 2024):
the search's distribution after the language token is p(y | x, target) - weight * sum_c p(y | x, c) over
the contrast languages c,
floored and renormalised.

- A tiny random Transformer with two language tokens: greedy search against a reference chain that runs
  the full forward pass (no cache) for both languages at every step, and beam search against brute
  force over every output, both scored by a copy of the rule written here.
- weight 0 is the plain search (same outputs, same log-probabilities).
- The multilingual checkpoint of tests/helpers.py: the Translator, `nmt translate --contrast-lang`
  and the decode config give the search's outputs; one-line errors for an unknown code, a bilingual
  model and the ctranslate2 engine; the server answers 400.
"""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from nmt import Translator
from nmt.config import ModelConfig
from nmt.errors import UserError
from nmt.layout import source_tensors
from nmt.model.transformer import Transformer
from nmt.search import SearchInputs, SearchOptions, beam_search, greedy_search
from nmt.text.tokenizer import BOS_ID, EOS_ID, PAD_ID
from nmt.translation.torch_engine import TorchEngine

from helpers import ENV, fake_batch, make_tiny_checkpoint, multilingual_checkpoint, one_line_error

pytestmark = pytest.mark.usefixtures("one_thread")
V = 10  # 4 specials, 3 words, three language tokens
TARGET, OTHER, THIRD = 7, 8, 9
ALLOWED = [t for t in range(V) if t not in (PAD_ID, BOS_ID, EOS_ID)]


@pytest.fixture(scope="module")
def model() -> Transformer:
    torch.manual_seed(3)
    cfg = ModelConfig(d_model=16, n_heads=2, layers=2, ffn_dim=32, dropout=0.0, max_positions=32, tie_output=False)
    m = Transformer(cfg, V, V).eval()
    with torch.no_grad():
        m.output_proj.weight.normal_(0.0, 0.4)
        m.tgt_embed.weight[[OTHER, THIRD]].normal_(0.0, 3.0)  # the languages' tokens lead to different distributions
    return m


def reference_step(model, src, mask, out: list[int], weight: float, others=(OTHER,)) -> torch.Tensor:
    """The search's log-distribution of the token after `out` (the output so far, language token
    first), from full forward passes: log_softmax(log(max(p - weight * sum(q), 1e-9 * p))), q for each
    contrast language in `others`; PAD and the start token at -inf after it."""
    with torch.no_grad():
        memory = model.encode(src[None], mask[None])
        p = F.softmax(model.decode(torch.tensor([[BOS_ID] + out]), memory, mask[None])[0, -1].float(), -1)
        q = sum(F.softmax(model.decode(torch.tensor([[BOS_ID, c] + out[1:]]), memory, mask[None])[0, -1].float(), -1)
                for c in others)
    logp = F.log_softmax(torch.maximum(p - weight * q, 1e-9 * p).log(), -1)
    logp[[PAD_ID, BOS_ID]] = float("-inf")
    return logp


def options(weight: float, others=(OTHER,), **kw) -> SearchOptions:
    return SearchOptions(max_len_a=0.0, contrast_tokens=others, contrast_weight=weight, free_prefix=1, **kw)


@pytest.mark.parametrize("weight,others", [(0.1, (OTHER,)), (0.5, (OTHER,)), (0.9, (OTHER,)), (0.4, (OTHER, THIRD))])
def test_greedy_search_follows_the_contrasted_distribution(model, weight, others):
    src, mask = fake_batch([5, 3, 6], seed=4)
    got = greedy_search(model, src, mask, options(weight, others, max_len_b=6), SearchInputs(prefixes=[[TARGET]] * 3))
    changed = 0
    for i, (h,) in enumerate(got):
        out, lp = [TARGET], 0.0
        while len(out) < 6:
            logp = reference_step(model, src[i], mask[i], out, weight, others)
            token = int(logp.argmax())
            lp += float(logp[token])
            if token == EOS_ID:
                break
            out.append(token)
        assert h.tokens == out and h.log_prob == pytest.approx(lp, abs=1e-4)
        plain = greedy_search(model, src[i:i + 1], mask[i:i + 1], SearchOptions(max_len_a=0.0, max_len_b=6),
                              SearchInputs(prefixes=[[TARGET]]))[0][0]
        changed += plain.tokens != h.tokens
    assert changed or weight < 0.4  # a strong contrast changes what is chosen (else this test could not fail)


@pytest.mark.parametrize("weight,others", [(0.3, (OTHER,)), (0.8, (OTHER,)), (0.3, (OTHER, THIRD))])
def test_beam_search_equals_brute_force(model, weight, others):
    max_len = 4  # the language token, then at most 3 tokens (EOS counted)
    src, mask = fake_batch([6, 4], seed=9)
    outputs = [(list(t), True) for n in range(0, max_len - 1) for t in itertools.product(ALLOWED, repeat=n)]
    outputs += [(list(t), False) for t in itertools.product(ALLOWED, repeat=max_len - 1)]
    wide = len(ALLOWED) ** (max_len - 2) * (len(ALLOWED) + 1)
    got = beam_search(model, src, mask, options(weight, others, max_len_b=max_len, beam_size=wide, nbest=3,
                                                length_penalty_type="none"), SearchInputs(prefixes=[[TARGET]] * 2))
    for i in range(2):
        steps = {}

        def score(tokens, eos):
            seq, lp = [TARGET] + tokens + ([EOS_ID] if eos else []), 0.0
            for j in range(1, len(seq)):
                key = tuple(seq[:j])
                if key not in steps:
                    steps[key] = reference_step(model, src[i], mask[i], list(key), weight, others)
                lp += float(steps[key][seq[j]])
            return lp
        first = reference_step(model, src[i], mask[i], [TARGET], weight, others)  # after a forced prefix only the best
        allowed = [(t, e) for t, e in outputs if t or int(first.argmax()) == EOS_ID]  # candidate may end (nmt/search/__init__.py)
        ref = sorted(((score(t, e), t) for t, e in allowed), key=lambda x: -x[0])
        assert [h.tokens for h in got[i]] == [[TARGET] + t for _, t in ref[:3]]
        assert [h.log_prob for h in got[i]] == pytest.approx([lp for lp, _ in ref[:3]], abs=1e-4)


def test_weight_zero_is_the_plain_search(model):
    src, mask = fake_batch([5, 2, 7, 4], seed=1)
    inputs = SearchInputs(prefixes=[[TARGET]] * 4)
    for kw in (dict(), dict(beam_size=3, nbest=2, length_penalty=1.0)):
        plain = (beam_search if kw else greedy_search)(model, src, mask, SearchOptions(max_len_a=1.0, max_len_b=3,
                                                                                       free_prefix=1, **kw), inputs)
        zero = (beam_search if kw else greedy_search)(model, src, mask, SearchOptions(
            max_len_a=1.0, max_len_b=3, free_prefix=1, contrast_tokens=(OTHER,), contrast_weight=0.0, **kw), inputs)
        assert [[h.tokens for h in n] for n in zero] == [[h.tokens for h in n] for n in plain]
        assert [h.log_prob for n in zero for h in n] == pytest.approx([h.log_prob for n in plain for h in n], abs=1e-5)


def test_the_cached_search_equals_the_uncached_one(model):
    src, mask = fake_batch([5, 2, 7, 4], seed=2)
    inputs = SearchInputs(prefixes=[[TARGET], [TARGET, 5], [TARGET], [TARGET, 6, 4]])  # a user prefix after it
    for kw in (dict(), dict(beam_size=3, nbest=2)):
        search = beam_search if kw else greedy_search
        cached = search(model, src, mask, options(0.4, max_len_b=5, **kw), inputs)
        uncached = search(model, src, mask, options(0.4, max_len_b=5, use_cache=False, **kw), inputs)
        assert [[h.tokens for h in n] for n in cached] == [[h.tokens for h in n] for n in uncached]
        assert all(h.log_prob > -1e6 for n in cached for h in n)  # forced prefix tokens stay possible (the floor)


def test_the_graphed_decoder_gives_the_plain_paths_contrasted_search(model):
    """The contrast's stacked rows through nmt/search/cuda_graphs.py's decoder (run eagerly on CPU over the static
    cache: rows compacted, padding) give the plain cache's hypotheses, greedy and beam, sentences ending
    at different steps."""
    from nmt.search.cuda_graphs import GraphedDecoder
    from nmt.search import SearchOps, search

    src, mask = fake_batch([5, 2, 7, 4, 6], seed=5)
    inputs = SearchInputs(prefixes=[[TARGET]] * 5)
    for kw in (dict(), dict(beam_size=3, nbest=2, length_penalty=1.0)):
        o = SearchOptions(max_len_a=1.0, max_len_b=2, contrast_tokens=(OTHER, THIRD), contrast_weight=0.3,
                          free_prefix=1, **kw)  # limits that differ with the source's length
        a = search(model, src, mask, o, inputs)
        b = search(model, src, mask, o, inputs, ops=SearchOps(decoder_cls=GraphedDecoder))
        assert [[h.tokens for h in n] for n in a] == [[h.tokens for h in n] for n in b]
        assert [h.score for n in a for h in n] == pytest.approx([h.score for n in b for h in n], abs=1e-5)
        assert len({len(h.tokens) for n in a for h in n}) > 1  # rows left the batch at different steps


def test_bad_weights():
    for w, others in ((-0.1, (OTHER,)), (1.0, (OTHER,)), (float("nan"), (OTHER,)), (0.5, (OTHER, THIRD))):
        with pytest.raises(ValueError, match="contrast_weight"):
            SearchOptions(max_len_a=1.0, max_len_b=1, contrast_tokens=others, contrast_weight=w)


# --------------------------------------------------------------------------- a multilingual checkpoint

@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> str:
    return multilingual_checkpoint(str(tmp_path_factory.mktemp("contrast") / "ml.pt"))


LINES = ["el perro rojo ve la casa", "la luna", "el gato come y el sol ve el rio"]


def test_translator_cli_and_config_give_the_contrasted_search(ckpt, tmp_path):
    engine = TorchEngine.load(ckpt, "cpu", fast=False)
    tok = engine.tokenizer
    src, mask = source_tensors(tok.encode_src(LINES))
    opts = SearchOptions(max_len_a=0.5, max_len_b=4, contrast_tokens=(tok.languages["fr"],), contrast_weight=0.5)
    ref = greedy_search(engine.model, src, mask, opts, SearchInputs(prefixes=[[tok.languages["de"]]] * len(LINES)))
    want = tok.decode_tgt([h.tokens[1:] for (h,) in ref])
    plain = [r.text for r in Translator(ckpt, tgt_lang="de").translate(LINES)]
    got = [r.text for r in Translator(ckpt, tgt_lang="de").translate(LINES, contrast_lang="fr", contrast_weight=0.5)]
    assert got == want and got != plain
    assert [r.text for r in Translator(ckpt, tgt_lang="de", contrast_lang="fr,de", contrast_weight=0.5)
            .translate(LINES)] == want  # (the target language left out of the list)
    r = subprocess.run([sys.executable, "-m", "nmt", "translate", "-c", ckpt, "-q", "--tgt-lang", "de",
                        "--contrast-lang", "fr", "--contrast-weight", "0.5"], input="\n".join(LINES) + "\n",
                       capture_output=True, text=True, env=ENV)
    assert r.returncode == 0 and r.stdout.splitlines() == want


def test_contrast_errors_are_one_line(ckpt, tmp_path):
    with pytest.raises(UserError, match="unknown contrast language 'xx' for this model \\(it knows: de, fr\\)"):
        Translator(ckpt, tgt_lang="de").translate(LINES, contrast_lang="xx")
    with pytest.raises(UserError, match="choose one with --tgt-lang"):  # (no target: nothing to leave out)
        Translator(ckpt, contrast_lang="fr").translate(LINES)
    later = Translator(ckpt, contrast_lang="fr,de", contrast_weight=0.6)  # the target comes with each call
    assert [r.text for r in later.translate(LINES, tgt_lang="de", contrast_weight=0.5)] == \
        [r.text for r in Translator(ckpt, tgt_lang="de").translate(LINES, contrast_lang="fr", contrast_weight=0.5)]
    bilingual = make_tiny_checkpoint(str(tmp_path / "bi.pt"))
    with pytest.raises(UserError, match="no target-language tokens"):
        Translator(bilingual, contrast_lang="de")
    for flags, message in ((["--contrast-lang", "xx"], "unknown contrast language"),
                           (["--contrast-lang", "fr", "--contrast-weight", "1"], "decode.contrast.weight")):
        r = subprocess.run([sys.executable, "-m", "nmt", "translate", "-c", ckpt, "-q", "--tgt-lang", "de", *flags],
                           input="la luna\n", capture_output=True, text=True, env=ENV)
        one_line_error(r, 2, message)
    from types import SimpleNamespace

    from nmt.translation.ct2 import Ct2Engine

    with pytest.raises(UserError, match="--contrast-lang is not supported by the ctranslate2 engine"):
        options = SearchOptions(max_len_a=1.0, max_len_b=2, contrast_tokens=(5,), contrast_weight=0.1)
        Ct2Engine.search_batch(SimpleNamespace(supports=Ct2Engine.supports), [[5]], options)


def test_several_contrast_languages_keep_their_weights_sum_below_one():
    from nmt.text.languages import contrast_tokens

    class Tok:  # what contrast_tokens reads of a tokenizer
        languages, default_tgt_lang, free_language_token = {"de": 5, "fr": 6, "en": 7}, "de", False

    assert contrast_tokens(Tok(), "fr, en,fr", None, 0.45) == (6, 7)
    with pytest.raises(UserError, match="the weight times their number must stay below 1.*at most 0.5"):
        contrast_tokens(Tok(), "fr,en", "de", 0.5)
    assert contrast_tokens(Tok(), "de,fr,en", None, 0.45) == (6, 7)  # the target (here the default) left out
    assert contrast_tokens(Tok(), "de,fr,en", "fr", 0.45) == (5, 7)  # one list for every direction
    assert contrast_tokens(Tok(), "de", "de", 0.9) == ()  # nothing left: plain search


def test_a_ctranslate2_export_leaves_the_contrast_out_of_its_defaults(ckpt, tmp_path):
    """A model whose decode section asks for contrastive decoding exports to CTranslate2 with a note, and
    the export translates with its other defaults (the PyTorch engine's plain outputs)."""
    pytest.importorskip("ctranslate2", reason="CTranslate2 is an optional extra (pip install -e '.[ct2]')")
    from nmt.model.checkpoint import load_checkpoint, save_checkpoint

    state = load_checkpoint(ckpt)
    state["config"]["decode"].update(contrast_lang="fr", contrast_weight=0.5)
    path, out = str(tmp_path / "contrast.pt"), tmp_path / "ct2"
    save_checkpoint(state, path)
    contrasted = [r.text for r in Translator(path, tgt_lang="de").translate(LINES)]
    plain = [r.text for r in Translator(ckpt, tgt_lang="de").translate(LINES)]
    assert contrasted == [r.text for r in Translator(ckpt, tgt_lang="de").translate(LINES, contrast_lang="fr",
                                                                                      contrast_weight=0.5)]
    r = subprocess.run([sys.executable, "-m", "nmt", "export", "-c", path, "-o", str(out)], capture_output=True,
                       text=True, env=ENV)
    assert r.returncode == 0 and "decode.contrast.lang (language-contrastive decoding) has no CTranslate2" in r.stderr
    assert [r.text for r in Translator(str(out), tgt_lang="de", workers=1).translate(LINES)] == plain
    r = subprocess.run([sys.executable, "-m", "nmt", "translate", "-c", path, "-q", "--tgt-lang", "de", "--contrast-lang",
                        ""], input="\n".join(LINES) + "\n", capture_output=True, text=True, env=ENV)
    assert r.returncode == 0 and r.stdout.splitlines() == plain  # an empty list turns the checkpoint's off


def test_the_server_refuses_an_unknown_contrast_language(ckpt):
    from nmt.commands.batcher import Settings
    from nmt.commands.serve_request import RequestError, check_options

    translator = Translator(ckpt, tgt_lang="de")
    assert check_options(translator, {"contrast_lang": "fr"}, Settings()).contrast.lang == "fr"
    with pytest.raises(RequestError, match="unknown contrast language") as e:
        check_options(translator, {"contrast_lang": "xx"}, Settings())
    assert e.value.status == 400
