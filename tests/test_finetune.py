"""train.init_from (fine-tuning), train.init_reset, train.keep_best."""

from __future__ import annotations

import math
import os

import pytest
import sacrebleu
import torch

from nmt.model import checkpoint as ckpt
from nmt.model.checkpoint import unwrap
from nmt.config import ConfigError, config_from_dict
from nmt.translation.torch_engine import TorchEngine
from nmt.errors import UserError
from nmt.translation.translate import translate_lines
import nmt.training.trainer as train_mod
from nmt.train import train
from nmt.config import load_config

from helpers import make_pairs, one_line_error, run_nmt, tiny_config_dict, write_yaml

pytestmark = pytest.mark.usefixtures("one_thread")

SWAP = {"dog": "cat", "cat": "dog", "house": "tree", "tree": "house"}  # the shifted task: other nouns, same words


def shifted(directory: str, n: int, seed: int, name: str) -> tuple[str, str]:
    """A corpus of the synthetic task where four nouns translate differently."""
    pairs = [(s, " ".join(SWAP.get(w, w) for w in t.split())) for s, t in make_pairs(n, seed)]
    paths = []
    for side, col in (("es", 0), ("en", 1)):
        path = os.path.join(directory, f"{name}.{side}")
        with open(path, "w", encoding="utf-8") as f:
            f.write("".join(p[col] + "\n" for p in pairs))
        paths.append(path)
    return paths[0], paths[1]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("base"))
    raw = tiny_config_dict(d, max_steps=300, valid_every=150)
    cfg = config_from_dict(raw)
    train(cfg, quiet=True)
    return raw, os.path.join(cfg.run_dir, "checkpoints", "latest.pt")


def finetune_raw(base_raw: dict, source: str, directory: str, **train_kw) -> dict:
    os.makedirs(directory, exist_ok=True)
    raw = {**base_raw, "name": "ft", "output_dir": os.path.join(directory, "runs")}
    train_src, train_tgt = shifted(directory, 3000, 5, "train")
    valid_src, valid_tgt = shifted(directory, 100, 6, "valid")
    raw["data"] = {**base_raw["data"], "train": {"src": train_src, "tgt": train_tgt},
                   "valid": {"src": valid_src, "tgt": valid_tgt}}
    raw["train"] = {**base_raw["train"], "init_from": source, "max_steps": 150, "valid_every": 150,
                    "warmup_steps": 10, "lr": 1e-3, **train_kw}
    raw["model"] = {**base_raw["model"], "dropout": 0.2}  # dropout may change
    return raw


def bleu(checkpoint: str, src: str, tgt: str) -> float:
    engine = TorchEngine.load(checkpoint, "cpu")
    hyps = translate_lines(engine, open(src).read().splitlines(), engine.decode)
    return sacrebleu.corpus_bleu(hyps, [open(tgt).read().splitlines()]).score


@pytest.mark.slow
def test_finetuning_learns_the_shifted_task_and_starts_exactly_from_the_source(base, tmp_path, monkeypatch):
    base_raw, source = base
    raw = finetune_raw(base_raw, source, str(tmp_path))
    test_src, test_tgt = shifted(str(tmp_path), 200, 7, "test")
    before = bleu(source, test_src, test_tgt)
    first = {}
    real_step = train_mod.train_step

    def spy(model, batches, *args, **kwargs):  # the first forward pass equals the source model's
        if not first:
            m = unwrap(model).eval()
            ref, _, _ = ckpt.load_for_inference(source, "cpu")
            b = batches[0]
            with torch.no_grad():
                first["max_diff"] = (m(b.src, b.src_mask, b.tgt_in) - ref(b.src, b.src_mask, b.tgt_in)).abs().max().item()
            m.train()
        return real_step(model, batches, *args, **kwargs)

    monkeypatch.setattr(train_mod, "train_step", spy)
    result = train(config_from_dict(raw), quiet=True)
    assert first["max_diff"] == 0.0
    assert result["step"] == 150  # a new step counter
    run = os.path.join(raw["output_dir"], "ft")
    after = bleu(os.path.join(run, "checkpoints", "best.pt"), test_src, test_tgt)
    assert before < 80 and after > 95, (before, after)
    assert os.path.isfile(os.path.join(run, "spm.model"))  # the run directory is self-contained
    src_tok = ckpt.load_checkpoint(source)["tokenizer"]
    assert ckpt.load_checkpoint(os.path.join(run, "checkpoints", "latest.pt"))["tokenizer"] == src_tok
    state = ckpt.load_checkpoint(os.path.join(run, "checkpoints", "latest.pt"))["train_state"]
    assert state["best"] is not None and state["epoch"] >= 1


@pytest.mark.slow
def test_init_reset_carries_over_what_is_left_out(base, tmp_path):
    base_raw, source = base
    src_state = ckpt.load_checkpoint(source)["train_state"]
    raw = finetune_raw(base_raw, source, str(tmp_path), init_reset=[], max_steps=310, valid_every=1000,
                       valid_bleu=False, metric="loss")
    result = train(config_from_dict(raw), quiet=True)
    assert result["step"] == 310  # counters: 300 from the source + 10
    saved = ckpt.load_checkpoint(os.path.join(raw["output_dir"], "ft", "checkpoints", "latest.pt"))["train_state"]
    assert saved["scheduler"]["last_epoch"] == src_state["scheduler"]["last_epoch"] + 10
    assert saved["optimizer"]["state"][0]["step"] == src_state["optimizer"]["state"][0]["step"] + 10


@pytest.mark.slow
def test_averaged_checkpoints_are_sources_and_errors_are_one_line(base, tmp_path):
    base_raw, source = base
    avg = str(tmp_path / "avg.pt")
    ckpt.average_checkpoints([source, os.path.join(os.path.dirname(source), "step_150.pt")], avg)
    raw = finetune_raw(base_raw, avg, str(tmp_path), max_steps=5, warmup_steps=2, valid_bleu=False, metric="loss")
    assert train(config_from_dict(raw), quiet=True)["step"] == 5
    cases = [
        (dict(init_reset=["counters"]), "no training state"),
    ]
    for kw, message in cases:
        bad = finetune_raw(base_raw, avg, str(tmp_path / "x"), **kw)
        with pytest.raises(UserError, match=message):
            train(config_from_dict(bad), quiet=True)
    bad = finetune_raw(base_raw, source, str(tmp_path / "arch"))
    bad["model"] = {**bad["model"], "ffn_dim": 64, "layers": 3}
    with pytest.raises(UserError, match=r"architecture differs.*model.layers.*model.ffn_dim|model.ffn_dim.*model.layers"):
        train(config_from_dict(bad), quiet=True)
    bad = finetune_raw(base_raw, source, str(tmp_path / "tok"))
    bad["data"] = {**bad["data"], "tokenizer": {**bad["data"]["tokenizer"], "vocab_size": 100}}
    with pytest.raises(UserError, match="data.tokenizer.vocab_size differ.*copy the source's data.tokenizer"):
        train(config_from_dict(bad), quiet=True)
    bad = finetune_raw(base_raw, str(tmp_path / "missing.pt"), str(tmp_path / "m"))
    with pytest.raises(ConfigError, match="train.init_from"):
        config_from_dict(bad)
    inside = {**base_raw, "train": {**base_raw["train"], "init_from": source}}  # the source's own run directory
    with pytest.raises(UserError, match="already holds checkpoints|inside this run's directory"):
        train(config_from_dict(inside), quiet=True)
    assert ckpt.load_checkpoint(source)["step"] == 300  # untouched


def test_keep_best_keeps_the_best_step_checkpoints(tmp_path, monkeypatch):
    values = iter([3.0, 1.0, 2.5, 1.5, 2.8, 2.9])  # loss: best at validations 2 and 4

    def scripted(model, cfg, *args, **kwargs):
        v = next(values)
        return {"loss": v, "nll": v, "ppl": math.exp(v)}

    monkeypatch.setattr(train_mod, "validate", scripted)
    raw = tiny_config_dict(str(tmp_path), max_steps=12, warmup_steps=4, valid_every=2, keep_last=1, keep_best=2,
                           valid_bleu=False, metric="loss")
    result = train(config_from_dict(raw), quiet=True)
    names = sorted(os.listdir(os.path.join(result["run_dir"], "checkpoints")))
    assert names == ["best.pt", "latest.pt", "step_12.pt", "step_4.pt", "step_8.pt"]
    assert ckpt.load_checkpoint(os.path.join(result["run_dir"], "checkpoints", "best.pt"))["step"] == 4


# --------------------------------------------------------------------------- the fine-tuning lifecycle: init_from, resume, the step counter

@pytest.fixture(scope="module")
def source(tmp_path_factory) -> tuple[dict, str]:
    """(raw config, a training checkpoint at step 20) of the tiny task."""
    from nmt.train import train

    d = str(tmp_path_factory.mktemp("source"))
    raw = tiny_config_dict(d, max_steps=20, warmup_steps=5, valid_every=1000, valid_bleu=False, metric="loss")
    raw["name"] = "source"
    result = train(config_from_dict(raw), quiet=True)
    return raw, os.path.join(result["run_dir"], "checkpoints", "latest.pt")


def finetune_config(tmp_path, source: tuple[dict, str], init_from: str, **train) -> str:
    raw = dict(source[0], name="ft", output_dir=str(tmp_path / "runs"))
    raw["train"] = {**raw["train"], "init_from": init_from, **train}
    return write_yaml(tmp_path / "ft.yaml", raw)


@pytest.mark.slow
def test_resuming_a_finetune_does_not_need_its_source(source, tmp_path):
    """The docs say init_from is ignored on resume; once the source file was gone, --resume failed
    with "checkpoint not found: 'train.init_from'"."""
    import shutil

    copy = str(tmp_path / "source.pt")
    shutil.copy(source[1], copy)
    path = finetune_config(tmp_path, source, copy, max_steps=6, warmup_steps=2)
    assert run_nmt("train", "--config", path, "--quiet").returncode == 0
    os.remove(copy)
    proc = run_nmt("train", "--config", path, "--quiet", "--resume", "--set", "train.max_steps=9")
    assert proc.returncode == 0, proc.stderr
    latest = ckpt.load_checkpoint(str(tmp_path / "runs" / "ft" / "checkpoints" / "latest.pt"))
    assert latest["step"] == 9
    one_line_error(run_nmt("train", "--config", path, "--quiet", "--set", "name=ft2"), 2,  # a new run still needs it
                   "nmt train: error: 'train.init_from': checkpoint not found: " + copy)


@pytest.mark.slow
def test_carrying_the_counter_to_max_steps_or_beyond_is_one_line_error(source, tmp_path):
    """The source is at step 20: with the counters carried over, max_steps 20 trained 0 steps and
    exited 0; now a one-line error before anything is written."""
    path = finetune_config(tmp_path, source, source[1], init_reset=["optimizer"], max_steps=20, warmup_steps=2)
    one_line_error(run_nmt("train", "--config", path, "--quiet"), 2, "is at step 20", "train.max_steps=20",
                   "leaves no step to train")
    assert not os.path.exists(tmp_path / "runs" / "ft" / "checkpoints" / "latest.pt")
    proc = run_nmt("train", "--config", path, "--quiet", "--set", "train.max_steps=22")
    assert proc.returncode == 0 and "stopped at step 22" in proc.stderr, proc.stderr


@pytest.mark.slow
def test_init_from_a_directory_says_what_it_is(source, tmp_path):
    """init_from a CTranslate2 export said "checkpoint not found"."""
    export = tmp_path / "ct2-model"
    export.mkdir()
    (export / "model.bin").write_bytes(b"\0")
    (export / "config.json").write_text("{}")
    path = finetune_config(tmp_path, source, str(export))
    one_line_error(run_nmt("train", "--config", path, "--check"), 2,
                   f"'train.init_from': {export} is a CTranslate2 model directory (written by nmt export)")
    path = finetune_config(tmp_path, source, str(tmp_path))
    one_line_error(run_nmt("train", "--config", path, "--check"), 2, f"{tmp_path} is a directory, not a checkpoint file")
    from nmt.training import finetune

    with pytest.raises(Exception, match="is a CTranslate2 model directory"):  # the loader says the same
        finetune.load_source(load_config(finetune_config(tmp_path, source, str(export)), check_files=False),
                             str(tmp_path / "runs" / "ft"))
