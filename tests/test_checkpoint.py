"""Atomic checkpoint files, safe loading, RNG round trips, averaging."""

import math
import os
import random
import re

import numpy as np
import pytest
import torch

from nmt.model import checkpoint as ckpt
from nmt.model.checkpoint import load_checkpoint, save_checkpoint
from nmt.config import ModelConfig, to_dict
from nmt.errors import UserError
from nmt.model.transformer import Transformer
from helpers import one_line_error, run_nmt, write

TINY = ModelConfig(d_model=16, n_heads=2, layers=1, ffn_dim=32, max_positions=32)


def _state(seed: int, model_cfg: ModelConfig = TINY, vocab: int = 20) -> dict:
    torch.manual_seed(seed)
    model = Transformer(model_cfg, vocab, vocab)
    return {"model": model.state_dict(), "config": {"model": to_dict(model_cfg)},
            "tokenizer": {"joint": True, "model": b"spm-bytes"}, "vocab": {"src": vocab, "tgt": vocab},
            "step": seed, "epoch": 1}


def test_save_load_round_trip_and_no_temp_left(tmp_path):
    state = _state(0)
    path = tmp_path / "c" / "latest.pt"
    ckpt.save_checkpoint(state, str(path))
    loaded = ckpt.load_checkpoint(str(path))
    assert loaded["format"] == ckpt.FORMAT and loaded["step"] == 0
    for k, v in state["model"].items():
        assert torch.equal(loaded["model"][k], v)
    assert os.listdir(path.parent) == ["latest.pt"]


def test_failed_write_keeps_old_file(tmp_path, monkeypatch):
    path = str(tmp_path / "latest.pt")
    ckpt.save_checkpoint(_state(1), path)
    real_save = torch.save

    def crash(obj, f):
        real_save(obj, f)
        f.truncate(100)  # half-written, then the process "dies"
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        ckpt.save_checkpoint(_state(2), path)
    monkeypatch.setattr(torch, "save", real_save)
    assert ckpt.load_checkpoint(path)["step"] == 1
    assert os.listdir(tmp_path) == ["latest.pt"]


def test_bad_files_raise_user_error_naming_the_file(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    good = tmp_path / "good.pt"
    ckpt.save_checkpoint(_state(0), str(good))
    cut = tmp_path / "cut.pt"
    cut.write_bytes(good.read_bytes()[:500])
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(2)}, str(other))
    for p in (text, cut, other, tmp_path / "missing.pt"):
        with pytest.raises(UserError, match=str(p.name)):
            ckpt.load_checkpoint(str(p))


def test_rng_state_round_trip():
    state = ckpt.rng_state()
    a = (random.random(), np.random.rand(), torch.rand(3))
    ckpt.set_rng_state(state)
    b = (random.random(), np.random.rand(), torch.rand(3))
    assert a[0] == b[0] and a[1] == b[1] and torch.equal(a[2], b[2])


def test_link_checkpoint_survives_replacing_the_source(tmp_path):
    latest, best = str(tmp_path / "latest.pt"), str(tmp_path / "best.pt")
    ckpt.save_checkpoint(_state(3), latest)
    ckpt.link_checkpoint(latest, best)
    ckpt.save_checkpoint(_state(4), latest)
    assert ckpt.load_checkpoint(best)["step"] == 3
    assert ckpt.load_checkpoint(latest)["step"] == 4


def test_average_is_the_mean_and_keeps_ties(tmp_path):
    paths = []
    for seed in (1, 2, 3):
        paths.append(str(tmp_path / f"step_{seed}.pt"))
        ckpt.save_checkpoint(_state(seed), paths[-1])
    out = str(tmp_path / "avg.pt")
    ckpt.average_checkpoints(paths, out)
    avg = ckpt.load_checkpoint(out)
    states = [_state(s)["model"] for s in (1, 2, 3)]
    for k in states[0]:
        expected = (states[0][k] + states[1][k] + states[2][k]) / 3
        torch.testing.assert_close(avg["model"][k], expected, rtol=1e-6, atol=1e-7)
    assert avg["model"]["src_embed.weight"].data_ptr() == avg["model"]["output_proj.weight"].data_ptr()
    assert "train_state" not in avg and avg["averaged_from"] == [os.path.abspath(p) for p in paths]
    model = Transformer(TINY, 20, 20)
    model.load_state_dict(avg["model"])
    assert model.output_proj.weight is model.src_embed.weight


def test_average_rejects_different_architectures(tmp_path):
    a, b = str(tmp_path / "a.pt"), str(tmp_path / "b.pt")
    ckpt.save_checkpoint(_state(1), a)
    ckpt.save_checkpoint(_state(2, ModelConfig(d_model=16, n_heads=2, layers=2, ffn_dim=32, max_positions=32)), b)
    with pytest.raises(UserError, match="architecture"):
        ckpt.average_checkpoints([a, b], str(tmp_path / "avg.pt"))
    assert not os.path.exists(tmp_path / "avg.pt")


def test_unwrap_compiled_wrapper():
    model = Transformer(TINY, 20, 20)

    class Compiled(torch.nn.Module):  # stands in for torch.compile's OptimizedModule
        def __init__(self, m):
            super().__init__()
            self._orig_mod = m

    assert ckpt.unwrap(Compiled(model)) is model
    assert list(ckpt.unwrap(Compiled(model)).state_dict()) == list(model.state_dict())


@pytest.mark.parametrize("stored", [dict(positions="sinusoidal", position_offset=0), dict(positions="sinusoidal")],
                         ids=["full-config", "before-position_offset"])
def test_checkpoints_of_the_old_default_keep_their_positions(tmp_path, stored):
    """Models trained before `positions`/`position_offset` defaulted to the Hugging Face families' tables
    stored `positions: sinusoidal` (and, before position_offset existed, no offset): they load with the
    paper's interleaved table (computed here from its formula) at offset 0, and translate as a model built
    with exactly those settings."""
    from helpers import make_tiny_checkpoint

    from nmt import Translator

    path = make_tiny_checkpoint(str(tmp_path / "old.pt"))
    state = ckpt.load_checkpoint(path)
    for key in ("positions", "position_offset"):
        state["config"]["model"].pop(key)
    state["config"]["model"].update(stored)
    ckpt.save_checkpoint(state, path)
    model, _, cfg = ckpt.build_model_from_checkpoint(ckpt.load_record(path), path)
    assert (cfg.model.positions, cfg.model.position_offset) == ("sinusoidal", 0)
    D, P = cfg.model.d_model, cfg.model.max_positions
    table = torch.tensor([[math.sin(p / 10000 ** (i / D)) if i % 2 == 0 else math.cos(p / 10000 ** ((i - 1) / D))
                           for i in range(D)] for p in range(P)], dtype=torch.float32)
    assert torch.allclose(model.sinusoids, table, atol=1e-6)
    explicit = str(tmp_path / "explicit.pt")
    state["config"]["model"].update(positions="sinusoidal", position_offset=0)
    ckpt.save_checkpoint(state, explicit)
    lines = ["el perro come", "la casa grande ve el gato rojo", "el sol"]
    old, new = Translator(path, device="cpu"), Translator(explicit, device="cpu")
    assert [r.text for r in old.translate(lines)] == [r.text for r in new.translate(lines)]
    default = str(tmp_path / "default.pt")  # the same weights under today's default table translate differently
    state["config"]["model"].update(positions=None, position_offset=None)
    ckpt.save_checkpoint(state, default)
    assert [r.log_prob for r in Translator(default, device="cpu").score(lines, lines)] != \
        [r.log_prob for r in old.score(lines, lines)]


# --------------------------------------------------------------------------- the record

def docstring_keys() -> list[str]:
    """The keys nmt/model/checkpoint.py's docstring lists: a name indented four spaces, then its description."""
    return re.findall(r"^    (\w+) {2,}\S", ckpt.__doc__, re.M)


@pytest.mark.slow
def test_the_docstring_lists_the_keys_every_writer_writes(tmp_path, capsys):
    """Issue 35: the record had four writers that built the dict by hand (the Trainer, hf_io, tune, average),
    and the docstring's key list was wrong for the third time. Now nmt/model/checkpoint.py builds every record
    (`record`, `ModelRecord`); its docstring lists KEYS in order, and what `nmt train` (with a language
    identifier), `nmt tune`, `nmt import` and `nmt average` write holds those keys, in that order, and all
    of them together."""
    from helpers import tiny_config_dict

    from nmt import cli
    from nmt.config import config_from_dict
    from nmt.translation.torch_engine import TorchEngine
    from nmt.train import train
    from nmt.translation.tune import apply_to_checkpoint, tune

    pytest.importorskip("transformers", reason="nmt import's model is built by transformers (a test dependency)")
    import hf_fixtures

    assert docstring_keys() == list(ckpt.KEYS) and len(set(ckpt.KEYS)) == len(ckpt.KEYS)
    raw = tiny_config_dict(tmp_path, max_steps=4, warmup_steps=2, valid_every=4, valid_max_sentences=4)
    raw["data"]["langid"] = True
    train(config_from_dict(raw), quiet=True)
    latest = str(tmp_path / "runs" / "synthetic" / "checkpoints" / "latest.pt")
    dev = ["el gato come", "la casa"], ["the cat eats", "the house"]
    tuned, averaged = str(tmp_path / "tuned.pt"), str(tmp_path / "avg.pt")
    result = tune(TorchEngine.load(latest), *dev, max_time=5, max_loops=1.0, log=lambda m: None)
    apply_to_checkpoint(latest, tuned, result, "bleu", "dev")
    ckpt.average_checkpoints([latest, tuned], averaged)
    written = {"train": latest, "tune": tuned, "average": averaged}
    hf_fixtures.marian_model(str(tmp_path / "marian"))
    written["import"] = str(tmp_path / "imported.pt")
    assert cli.main(["import", str(tmp_path / "marian"), "-o", written["import"], "-q"]) == 0
    seen = set()
    for what, path in written.items():
        keys = list(ckpt.load_checkpoint(path, mmap=True))
        assert keys == [k for k in ckpt.KEYS if k in keys], what  # only listed keys, in the listed order
        seen.update(keys)
    assert seen == set(ckpt.KEYS)


# --------------------------------------------------------------------------- nmt average: one-line errors on bad checkpoints and outputs

@pytest.mark.slow
def test_average_into_a_directory_or_bad_checkpoints(ckpt, tmp_path):
    one_line_error(run_nmt("average", ckpt, "-o", str(tmp_path) + "/"), 2, "is a directory")
    text = write(tmp_path / "notes.txt", ["not a checkpoint"])
    one_line_error(run_nmt("average", text, "-o", str(tmp_path / "a.pt")), 2, "not a PyTorch checkpoint file")
    one_line_error(run_nmt("translate", "-c", text, "-i", text), 2, "not a PyTorch checkpoint file")
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    one_line_error(run_nmt("translate", "-c", str(empty), "-i", text), 2, "an empty file")
    state = load_checkpoint(ckpt)
    del state["model"]
    torch.save(state, tmp_path / "nomodel.pt")
    one_line_error(run_nmt("average", str(tmp_path / "nomodel.pt"), "-o", str(tmp_path / "a.pt")), 2, "no model")


# --------------------------------------------------------------------------- the checkpoint writer: a path the user gave, the umask

@pytest.mark.slow
def test_average_into_a_missing_directory_names_what_the_user_gave(ckpt, tmp_path):
    """`-o nodir/` said "Not a directory: /.../.tmp-bwyvw8y8.pt.tmp"."""
    one_line_error(run_nmt("average", ckpt, "-o", "nodir/", cwd=str(tmp_path)), 2,
                   "nmt average: error: --output nodir/ names a directory")
    with pytest.raises(OSError) as e:  # the writer too: an OSError names the path it was given
        save_checkpoint({"x": 1}, str(tmp_path / "nodir") + "/")
    assert e.value.filename == str(tmp_path / "nodir") + "/" and os.listdir(tmp_path) == []


def test_checkpoints_follow_the_umask(tmp_path):
    """Checkpoints were written 0600 whatever the umask (mkstemp's mode)."""
    old = os.umask(0o022)
    try:
        ckpt.save_checkpoint({"x": 1}, str(tmp_path / "a.pt"))
        os.umask(0o077)
        ckpt.save_checkpoint({"x": 1}, str(tmp_path / "b.pt"))
    finally:
        os.umask(old)
    assert oct(os.stat(tmp_path / "a.pt").st_mode & 0o777) == oct(0o644)
    assert oct(os.stat(tmp_path / "b.pt").st_mode & 0o777) == oct(0o600)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_weights_that_are_not_finite_are_a_one_line_error_at_load(tmp_path, capsys, value):
    """Issue 59 item 9: a NaN weight crashed beam search (IndexError), made greedy write `Da Da Da` with
    exit 0, `nmt score` print nan and `nmt average` write it on. Every command that loads weights refuses
    them in one line (exit 2), as import and export do (export_dir.check_finite), before any output."""
    from helpers import make_pairs, make_tiny_checkpoint

    from nmt.cli import main

    good = make_tiny_checkpoint(str(tmp_path / "good.pt"))
    state = ckpt.load_checkpoint(good)
    state["model"]["decoder.layers.0.ffn.fc2.weight"][1, 2] = value
    bad = str(tmp_path / "bad.pt")
    ckpt.save_checkpoint(state, bad)
    src = write(tmp_path / "src.es", [p[0] for p in make_pairs(3, 1)])
    ref = write(tmp_path / "ref.en", [p[1] for p in make_pairs(3, 1)])
    out = tmp_path / "out"
    for args in (["translate", "-c", bad, "-i", src, "-o", str(out), "--beam", "2"],
                 ["translate", "-c", bad, "-i", src, "-o", str(out), "--beam", "1"],
                 ["score", "-c", bad, "--src", src, "--tgt", ref, "-o", str(out)],
                 ["evaluate", "-c", bad, "--src", src, "--ref", ref, "--save-hyps", str(out)],
                 ["average", good, bad, "-o", str(out)]):
        code = main(args)
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, (args, err)
        assert f"checkpoint {bad}: weights that are not finite (NaN or infinite) in " \
               "decoder.layers.0.ffn.fc2.weight" in err, err
        assert not out.exists()


def test_weights_that_do_not_fit_the_model_are_named(tmp_path):
    """The message stopped at "Error(s) in loading state_dict for Transformer:": the key missing, unexpected or
    of the wrong shape is named, on one line."""
    from helpers import make_tiny_checkpoint

    state = ckpt.load_checkpoint(make_tiny_checkpoint(str(tmp_path / "good.pt")))
    weight = state["model"].pop("src_embed.weight")
    state["model"]["extra.weight"] = torch.zeros(1)
    for name, expected in [("missing.pt", ['Missing key(s) in state_dict: "src_embed.weight"',
                                           'Unexpected key(s) in state_dict: "extra.weight"']),
                           ("shape.pt", ["size mismatch for src_embed.weight: copying a param with shape"])]:
        if name == "shape.pt":
            state["model"].pop("extra.weight")
            state["model"]["src_embed.weight"] = weight[:3]
        save_checkpoint(state, str(tmp_path / name))
        with pytest.raises(UserError) as e:
            ckpt.load_for_inference(str(tmp_path / name))
        message = str(e.value)
        assert "\n" not in message and all(part in message for part in expected), message
