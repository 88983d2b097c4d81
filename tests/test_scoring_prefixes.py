"""Issue 29.6: scoring and prefixes. `nmt score` sees protected spans as translation does; a
score and a log_prob differ exactly by the EOS a hypothesis cut at the length limit never
generated; an over-long prefix is reported, not cut silently; a prefix with characters the
vocabulary lacks comes back as written."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from nmt import Translator

from nmt.text import protect
from nmt.layout import source_tensors, target_tensors
from nmt.translation.torch_engine import TorchEngine

from helpers import MAX_POSITIONS, make_pairs, make_tiny_checkpoint
from helpers import ROOT

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def ph_ckpt(tmp_path_factory) -> str:
    """A tiny model whose vocabulary has the placeholders (as one trained with data.protect)."""
    return make_tiny_checkpoint(str(tmp_path_factory.mktemp("ph") / "ph.pt"), symbols=tuple(protect.PLACEHOLDERS))


def forced_log_prob(engine, src: str, tgt: str) -> float:
    """log p(tgt + EOS | src) from one teacher-forced pass, in float64."""
    tok = engine.tokenizer
    x, y = tok.encode_src([src]), tok.encode_tgt([tgt])
    s, m = source_tensors(x)
    tgt_in, tgt_out = target_tensors(y)
    with torch.no_grad():
        logp = F.log_softmax(engine.model(s, m, tgt_in)[0].double(), -1)
    return float(logp.gather(1, tgt_out[0][:, None]).sum())


@pytest.mark.slow
def test_a_protect_trained_model_scores_the_pair_as_translation_sees_it(ph_ckpt, tmp_path):
    engine = TorchEngine.load(ph_ckpt, "cpu", fast=False)
    src, tgt = "el gato %s ve la casa {0}", "the cat %s sees the house {0}"
    masked = ("el gato <ph_0> ve la casa <ph_1>", "the cat <ph_0> sees the house <ph_1>")
    assert protect.mask_for_scoring(src, tgt) == masked
    (s := tmp_path / "s.es").write_text(src + "\n", encoding="utf-8")
    (t := tmp_path / "t.en").write_text(tgt + "\n", encoding="utf-8")

    def score(*flags) -> float:
        r = subprocess.run([sys.executable, "-m", "nmt", "score", "-c", ph_ckpt, "--src", str(s), "--tgt", str(t),
                            "-q", *flags], capture_output=True, text=True, cwd=ROOT,
                           env={**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"})
        assert r.returncode == 0, r.stderr
        return float(r.stdout.split("\t")[0])

    assert score() == pytest.approx(forced_log_prob(engine, *masked), abs=1e-4)  # placeholders, by default
    assert score("--no-protect") == pytest.approx(forced_log_prob(engine, src, tgt), abs=1e-4)
    assert abs(score() - score("--no-protect")) > 1e-3
    translator = Translator(ph_ckpt, protect=True, beam_size=2, max_len_a=2.0)
    for h in translator.translate([src])[0].hypotheses:  # a protected translation scores its own log_prob
        if h.finished:
            assert translator.score([src], [h.text], protect=True)[0].log_prob == pytest.approx(h.log_prob, abs=1e-4)


def test_score_and_log_prob_differ_by_the_eos_a_cut_hypothesis_never_generated(ckpt):
    translator = Translator(ckpt, beam_size=1, max_len_a=0.0, max_len_b=3)  # every output cut at 3 tokens
    engine = TorchEngine.load(ckpt, "cpu", fast=False)
    lines = [p[0] for p in make_pairs(10, 2)]
    cut = [r for r in translator.translate(lines) if not r.finished]
    assert cut
    for line, r in zip(lines, translator.translate(lines)):
        if r.finished:
            continue
        tok = engine.tokenizer
        s, m = source_tensors(tok.encode_src([line]))
        y = tok.encode_tgt([r.text])[0]
        tgt_in, _ = target_tensors([y])
        with torch.no_grad():
            eos = float(F.log_softmax(engine.model(s, m, tgt_in)[0, len(y)].double(), -1)[tok.specials.eos])
        score = translator.score([line], [r.text])[0].log_prob
        assert score == pytest.approx(r.log_prob + eos, abs=1e-4) and eos < 0


@pytest.mark.slow
def test_an_over_long_prefix_is_reported_not_cut_silently(ckpt, tmp_path):
    words = " ".join(["the cat"] * MAX_POSITIONS)
    (inp := tmp_path / "in.es").write_text("el gato\nel perro\n", encoding="utf-8")
    (pre := tmp_path / "pre.en").write_text(words + "\nthe\n", encoding="utf-8")
    results = Translator(ckpt).translate(["el gato", "el perro"], prefixes=[words, "the"])
    assert [r.prefix_truncated for r in results] == [True, False]
    r = subprocess.run([sys.executable, "-m", "nmt", "translate", "-c", ckpt, "-i", str(inp), "--prefix", str(pre)],
                       capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 2
    assert f"warning: 1 prefix longer than {MAX_POSITIONS - 2} tokens (model.max_positions - 2) was truncated" \
        in r.stderr


def test_a_prefix_with_unknown_characters_comes_back_as_written(ckpt):
    translator = Translator(ckpt, beam_size=2)
    for prefix in ("the ☃ cat", "Ünïcödé the", "the cat ⁂"):
        out = translator.translate(["el gato ve la casa"], prefixes=[prefix])[0]
        assert out.text.startswith(prefix), (prefix, out.text)
        assert "⁇" not in out.text
    plain = translator.translate(["el gato"], prefixes=["the cat"])[0].text  # known words: unchanged path
    assert plain.startswith("the cat") and not math.isnan(translator.translate(["el gato"])[0].score)
