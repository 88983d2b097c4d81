"""`nmt score` (forced decoding): against the teacher-forced log-probabilities computed here from
`model.forward`, and against beam search's own `log_prob` for the hypotheses it produced."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from nmt.config import decode_config
from nmt.translation.torch_engine import TorchEngine
from nmt.errors import UserError
from nmt.commands.score import ScoreOptions, score_command
from nmt.translation.score import score_pairs
from nmt.translation.translate import translate_nbest

from helpers import make_pairs
from helpers import make_tiny_checkpoint
from helpers import ROOT

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("score") / "tiny.pt")  # the table its counts were set with:
    return TorchEngine.load(make_tiny_checkpoint(path, positions="sinusoidal", position_offset=0), "cpu")


def reference(engine, src: str, tgt: str) -> tuple[float, int]:
    """sum log p(y_t | y_<t, x) over y + EOS, from one full forward pass of the plain model."""
    tok, model = engine.tokenizer, engine.model
    x = tok.encode_src([src])[0][: engine.max_positions - 1] + [3]
    y = tok.encode_tgt([tgt])[0][: engine.max_positions - 1]
    with torch.no_grad():
        logits = model(torch.tensor([x]), torch.ones(1, len(x), dtype=torch.bool), torch.tensor([[2] + y]))
    logp = F.log_softmax(logits.double(), dim=-1)[0]
    return float(sum(logp[t, w] for t, w in enumerate(y + [3]))), len(y) + 1


def test_scores_equal_the_teacher_forced_log_probability(engine):
    pairs = make_pairs(20, 3) + [("", "the sun"), ("el sol", ""), ("", "")]
    src, tgt = [p[0] for p in pairs], [p[1] for p in pairs]
    for workers in (1, 2):  # batching and workers do not change a score
        decode = decode_config(engine.decode, dict(batch_tokens=40, workers=workers))
        scores = score_pairs(engine, src, tgt, decode)
        assert not any(s.truncated for s in scores) and len(scores) == len(pairs)
        for s, (a, b) in zip(scores, pairs):
            lp, n = reference(engine, a, b)
            assert s.n_tokens == n and s.log_prob == pytest.approx(lp, abs=1e-4)
            assert s.per_token == pytest.approx(lp / n, abs=1e-4)


def test_scores_equal_beam_search_log_probs_of_its_own_hypotheses(engine):
    lines = [p[0] for p in make_pairs(15, 8)]
    decode = decode_config(engine.decode, dict(beam_size=4, nbest=4, max_len_a=1.0, max_len_b=6))
    nbests = translate_nbest(engine, lines, decode)
    src, tgt, want = [], [], []
    for line, hyps in zip(lines, nbests):
        for h in hyps:
            if h.finished:  # ended with EOS: its log_prob counts EOS, as a score does
                src.append(line), tgt.append(h.text), want.append(h.log_prob)
    assert len(want) >= 10
    scores = score_pairs(engine, src, tgt)
    close = [s.log_prob == pytest.approx(w, abs=1e-4) for s, w in zip(scores, want)]
    # a hypothesis whose text re-encodes to other tokens (rare with a word model) cannot match
    assert sum(close) >= 0.95 * len(want), list(zip([s.log_prob for s in scores], want))


@pytest.mark.slow
def test_command_output_errors_and_truncation(engine, tmp_path):
    pairs = make_pairs(6, 9)
    src, tgt = tmp_path / "s.es", tmp_path / "t.en"
    src.write_text("".join(p[0] + "\n" for p in pairs) + "\n" + " ".join(["el gato"] * 20) + "\n", encoding="utf-8")
    tgt.write_text("".join(p[1] + "\n" for p in pairs) + "the sun\n" + "the cat\n", encoding="utf-8")
    ckpt = engine_path = tmp_path / "ckpt.pt"
    make_tiny_checkpoint(str(ckpt), positions="sinusoidal", position_offset=0)  # the fixture's model (seed 0)
    out = tmp_path / "scores.tsv"
    proc = subprocess.run([sys.executable, "-m", "nmt", "score", "-c", str(engine_path), "--src", str(src),
                           "--tgt", str(tgt), "-o", str(out), "-q", "--batch-tokens", "30"], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    rows = [line.split("\t") for line in out.read_text().splitlines()]
    assert len(rows) == 8 and all(len(r) == 3 for r in rows)
    for (lp, per, n), (a, b) in zip(rows, pairs + [("", "the sun")]):
        want, want_n = reference(engine, a, b)
        assert float(lp) == pytest.approx(want, abs=1e-4) and int(n) == want_n
        assert float(per) == pytest.approx(want / want_n, abs=1e-4)
    tgt.write_text("one\ntwo\n", encoding="utf-8")
    with pytest.raises(UserError, match="line counts differ: 8 lines .* but 2"):
        score_command(ScoreOptions(str(ckpt), str(src), str(tgt), None))
    long = make_pairs(1, 1)[0][0]
    scores = score_pairs(engine, [" ".join([long] * 5)], ["the sun"])
    assert scores[0].truncated and scores[0].n_tokens == 3
