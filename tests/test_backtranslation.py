"""Back-translation end to end on the synthetic task (docs/backtranslation.md): a reverse model samples
sources for monolingual target text, and the forward model trains on real + tagged synthetic pairs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import sacrebleu
import yaml

from nmt.config import config_from_dict
from nmt.translation.torch_engine import TorchEngine
from nmt.translation.translate import translate_lines
from nmt.train import train

from helpers import NOUNS, ROOT, make_pairs, tiny_config_dict, write

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.slow
def test_back_translation_in_two_commands(tmp_path):
    d = str(tmp_path)
    # Robust by design (not by a margin that depends on the CPU's float sums): the few real pairs use
    # only half the nouns, so a model trained on them alone has never seen the others (its word
    # vocabulary lacks them) and cannot translate a test sentence that has one; the monolingual text
    # and the reverse model cover every noun, so back-translation supplies what real data lacks.
    real = make_pairs(100, 30, nouns=list(NOUNS)[:5])  # little real data for the forward direction ...
    mono = [t for _, t in make_pairs(3000, 31)]  # ... and a lot of monolingual target text
    test = make_pairs(200, 32)
    paths = {"real.es": write(tmp_path / "real.es", [s for s, _ in real]),
             "real.en": write(tmp_path / "real.en", [t for _, t in real]),
             "mono.en": write(tmp_path / "mono.en", mono)}
    # the reverse model (en -> es), trained where more parallel data was at hand
    other = make_pairs(2000, 33)
    paths["other.es"] = write(tmp_path / "other.es", [s for s, _ in other])
    paths["other.en"] = write(tmp_path / "other.en", [t for _, t in other])
    rev = tiny_config_dict(d, max_steps=300, valid_every=300)
    rev["name"], rev["data"]["src_lang"], rev["data"]["tgt_lang"] = "rev", "en", "es"
    for split in ("train", "valid", "test"):
        rev["data"][split] = {"src": rev["data"][split]["tgt"], "tgt": rev["data"][split]["src"]}
    rev["data"]["train"] = {"src": paths["other.en"], "tgt": paths["other.es"]}
    train(config_from_dict(rev), quiet=True)
    rev_ckpt = os.path.join(rev["output_dir"], "rev", "checkpoints", "best.pt")
    # command 1: sample the back-translations
    bt = str(tmp_path / "mono.bt.es")
    r = subprocess.run([sys.executable, "-m", "nmt", "translate", "-c", rev_ckpt, "-i", paths["mono.en"], "-o", bt,
                        "--sampling", "topp", "--topp", "0.9", "--seed", "1", "-q"], capture_output=True, text=True,
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert r.returncode == 0, r.stderr
    assert len(open(bt, encoding="utf-8").read().splitlines()) == len(mono)
    # command 2: the forward model on real + tagged synthetic pairs
    fwd = tiny_config_dict(d, max_steps=300, valid_every=300)
    fwd["name"] = "fwd_bt"
    fwd["data"]["train"] = [{"src": paths["real.es"], "tgt": paths["real.en"], "weight": 1},
                            {"src": bt, "tgt": paths["mono.en"], "src_tag": "<BT>", "weight": 1}]
    with open(tmp_path / "my-bt.yaml", "w") as f:
        yaml.safe_dump(fwd, f)
    r = subprocess.run([sys.executable, "-m", "nmt", "train", "--config", str(tmp_path / "my-bt.yaml"), "--quiet"],
                       capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "epoch mix of 2 corpora" in r.stderr
    real_only = dict(fwd, name="fwd_real", data={**fwd["data"], "train": fwd["data"]["train"][0]})
    train(config_from_dict(real_only), quiet=True)

    def test_bleu(name: str) -> float:
        engine = TorchEngine.load(os.path.join(fwd["output_dir"], name, "checkpoints", "best.pt"), "cpu")
        hyps = translate_lines(engine, [s for s, _ in test], engine.decode)
        return sacrebleu.corpus_bleu(hyps, [[t for _, t in test]]).score

    with_bt, without = test_bleu("fwd_bt"), test_bleu("fwd_real")
    engine = TorchEngine.load(os.path.join(fwd["output_dir"], "fwd_bt", "checkpoints", "best.pt"), "cpu")
    assert engine.tokenizer.is_target_symbol("▁<BT>") or len(engine.tokenizer.encode_src(["<BT>"])[0]) == 1
    # measured on a 2-core Intel Xeon: 88.2 vs 55.8; the gap is structural (half the nouns never seen)
    assert with_bt > without + 15, (with_bt, without)  # the synthetic pairs help when real data is scarce
    print(f"test BLEU with back-translation {with_bt:.1f}, real pairs only {without:.1f}")
