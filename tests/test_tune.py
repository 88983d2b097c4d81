"""nmt tune: the settings it scores are what the search gives under them, it writes only the decode
section (and its record), atomically in place, and train.tune_decode tunes best.pt."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml

from nmt.model import checkpoint as ckpt
from nmt.config import config_from_dict, decode_config
from nmt.errors import UserError
from nmt.evaluation.metrics import corpus_metrics
from nmt.textio import read_lines
from nmt.train import train

from helpers import tiny_config_dict
from helpers import ROOT

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(checkpoint, dev src, dev ref) of the synthetic task trained briefly (imperfect outputs: the
    settings matter)."""
    d = tmp_path_factory.mktemp("tune")
    raw = tiny_config_dict(str(d), max_steps=80, valid_every=1000, valid_bleu=False, metric="loss")
    cfg = config_from_dict(raw)
    train(cfg, quiet=True)
    return os.path.join(cfg.run_dir, "checkpoints", "latest.pt"), raw["data"]["valid"]["src"], raw["data"]["valid"]["tgt"]


@pytest.mark.slow
@pytest.mark.parametrize("patience", [0.0, 1.0])
def test_every_scored_setting_is_what_the_search_gives(trained, patience):
    """The race scores each penalty from one keep_all search per arm: the score of a setting must
    equal translating the same lines with that setting and scoring them with sacreBLEU (also under
    the checkpoint's patience, whose stop does not depend on the penalty)."""
    import dataclasses

    from nmt.translation.torch_engine import TorchEngine
    from nmt.translation.translate import translate_lines
    from nmt.translation.tune import Race, tune

    checkpoint, src, ref = trained
    engine = TorchEngine.load(checkpoint, "cpu")
    engine.decode = dataclasses.replace(engine.decode, patience=patience)
    src_lines, ref_lines = read_lines(src), read_lines(ref)
    result = tune(engine, src_lines, ref_lines, max_time=600, log=lambda m: None, beams=(1, 3), ngrams=(0, 2))
    assert result.lines == len(src_lines)  # the budget let the race reach the whole dev set
    final = [r for r in result.table if r.lines == len(src_lines) and r.round == max(x.round for x in result.table)]
    order = list(range(len(src_lines)))
    import random

    random.Random(1).shuffle(order)  # the race's fixed shuffle (its rows are over order[:lines])
    assert Race.__init__.__defaults__ == (1,)
    for row in final[:: max(1, len(final) // 6)] + [result.row]:
        decode = decode_config(engine.decode, {**row.setting.keys(), "min_len": 0})
        lines = [src_lines[i] for i in order[: row.lines]]
        hyps = translate_lines(engine, lines, decode)
        want = corpus_metrics(hyps, [ref_lines[i] for i in order[: row.lines]], ("bleu",))["bleu"]
        assert row.score == pytest.approx(want["score"], abs=1e-9), row.setting
        assert row.bp == pytest.approx(want["bp"]) and row.ratio == pytest.approx(want["ratio"])
    assert result.row.score == max(r.score for r in final if r.loops <= 0.02)


@pytest.mark.slow
def test_command_writes_only_the_decode_section(trained, tmp_path, capsys):
    from nmt.commands.tune import TuneOptions, tune_command

    checkpoint, src, ref = trained
    out = str(tmp_path / "tuned.pt")
    assert tune_command(TuneOptions(checkpoint, src, ref, output=out, max_time=30, device="cpu", quiet=True)) == 0
    printed = capsys.readouterr().out
    assert "tune: chose" in printed and "round 1" in printed
    before, after = ckpt.load_checkpoint(checkpoint), ckpt.load_checkpoint(out)
    chosen = after["tuned"]["settings"]
    assert {k: after["config"]["decode"][k] for k in chosen} == chosen
    assert {k: v for k, v in after["config"]["decode"].items() if k not in chosen} == \
        {k: v for k, v in before["config"]["decode"].items() if k not in chosen}
    assert {k: v for k, v in after["config"].items() if k != "decode"} == \
        {k: v for k, v in before["config"].items() if k != "decode"}
    assert set(after) == set(before) | {"tuned"}
    for k, v in before["model"].items():
        assert torch.equal(after["model"][k], v)
    assert after["tokenizer"] == before["tokenizer"] and after["step"] == before["step"]
    a, b = before["train_state"]["optimizer"]["state"], after["train_state"]["optimizer"]["state"]
    assert all(torch.equal(a[i]["exp_avg"], b[i]["exp_avg"]) for i in a)
    # in place: the same result, atomically (a new file renamed over the old one)
    copy = str(tmp_path / "copy.pt")
    with open(checkpoint, "rb") as f, open(copy, "wb") as g:
        g.write(f.read())
    inode = os.stat(copy).st_ino
    assert tune_command(TuneOptions(copy, src, ref, in_place=True, max_time=30, device="cpu", quiet=True)) == 0
    assert ckpt.load_checkpoint(copy)["config"]["decode"] == after["config"]["decode"]
    assert os.stat(copy).st_ino != inode
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".tmp-")]


@pytest.mark.slow
def test_errors_are_one_line(trained, tmp_path):
    from nmt.commands.tune import TuneOptions, tune_command

    checkpoint, src, ref = trained
    with pytest.raises(UserError, match="not both"):
        tune_command(TuneOptions(checkpoint, src, ref, output=str(tmp_path / "x.pt"), in_place=True))
    short = tmp_path / "short.en"
    short.write_text("one line\n", encoding="utf-8")
    with pytest.raises(UserError, match="line counts differ"):
        tune_command(TuneOptions(checkpoint, src, str(short), max_time=5, device="cpu", quiet=True))
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "nmt", "tune", "-c", checkpoint, "--src", src, "--ref", ref,
                        "--metric", "ter"], capture_output=True, text=True, cwd=ROOT, env=env)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = subprocess.run([sys.executable, "-m", "nmt", "tune", "-c", str(tmp_path / "missing.pt"), "--src", src, "--ref",
                        ref], capture_output=True, text=True, cwd=ROOT, env=env)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr


GLOSSARY = [("perro", "dog"), ("gato", "cat"), ("rojo", "red"), ("mesa", "sun")]  # the last one the refs never use


@pytest.mark.slow
@pytest.mark.parametrize("constrain", ["always", "missing"])
def test_with_a_glossary_every_scored_setting_is_what_translate_gives(trained, constrain, monkeypatch):
    """`nmt tune --glossary` scores each (glossary_beam_size, glossary_length_penalty) from one constrained
    keep_all search per beam size: each score must equal translating the dev lines with the glossary
    under those settings (nmt/translation/translate.py, lines without a term and, with `missing`, lines whose free
    output holds their terms searched as without the glossary) and scoring them with sacreBLEU."""
    import random

    from nmt.translation import tune as tuning
    from nmt.text.glossary import Glossary, check_entries
    from nmt.translation.torch_engine import TorchEngine
    from nmt.translation.translate import translate_chunk

    checkpoint, src, ref = trained
    monkeypatch.setattr(tuning, "PENALTIES", tuple(("gnmt", a / 10) for a in range(0, 31, 3)))  # (a penalty to tune)
    engine = TorchEngine.load(checkpoint, "cpu")
    engine.decode = decode_config(engine.decode, {"glossary_constrain": constrain})
    glossary = Glossary(check_entries(GLOSSARY))
    src_lines, ref_lines = read_lines(src), read_lines(ref)
    result = tuning.tune(engine, src_lines, ref_lines, max_time=600, log=lambda m: None, beams=(2,), ngrams=(0,),
                         glossary=glossary, max_loops=1.0)  # (the briefly trained model loops: the best score wins)
    assert result.lines == len(src_lines) and result.best.beam_size == 2
    assert {r.setting.beam_size for r in result.glossary} == {2, 4} and len(result.glossary) == 22
    assert len({round(r.score, 6) for r in result.glossary}) > 3  # the settings change the outputs: the check can fail
    order = list(range(len(src_lines)))
    random.Random(1).shuffle(order)
    lines, refs = [src_lines[i] for i in order], [ref_lines[i] for i in order]
    for row in result.glossary[::5] + [result.glossary_row]:
        decode = decode_config(engine.decode, {**result.best.keys(), "min_len": 0, "glossary_beam_size":
                                               row.setting.beam_size,
                                               "glossary_length_penalty": row.setting.length_penalty})
        hyps = [r.text for r in translate_chunk(engine, lines, decode, glossary=glossary)]
        want = corpus_metrics(hyps, refs, ("bleu",))["bleu"]
        assert row.score == pytest.approx(want["score"], abs=1e-9), row.setting
    assert result.glossary_row.score == max(r.score for r in result.glossary)
    g, own = result.glossary_row.setting, result.best  # written as None where the setting's own won
    assert result.keys() == {**own.keys(), "glossary_beam_size": g.beam_size if g.beam_size != 2 else None,
                             "glossary_length_penalty": g.length_penalty if g.length_penalty != own.length_penalty
                             else None}


@pytest.mark.slow
def test_command_with_a_glossary_writes_its_settings(trained, tmp_path, capsys, monkeypatch):
    import functools
    import re

    from nmt.translation import tune as tuning
    from nmt.commands.tune import TuneOptions, tune_command

    checkpoint, src, ref = trained
    monkeypatch.setattr(tuning, "PENALTIES", tuple(("gnmt", a / 10) for a in range(0, 31, 3)))
    monkeypatch.setattr(tuning, "tune", functools.partial(tuning.tune, beams=(2,), ngrams=(0,)))  # (a beam to tune)
    tsv = tmp_path / "glossary.tsv"
    tsv.write_text("".join(f"{s}\t{t}\n" for s, t in GLOSSARY), encoding="utf-8")
    out = str(tmp_path / "tuned.pt")
    assert tune_command(TuneOptions(checkpoint, src, ref, output=out, max_time=60, device="cpu", quiet=True,
                                    glossary=str(tsv), glossary_constrain="missing", max_loops=1.0)) == 0
    printed = capsys.readouterr().out
    assert "glossary round" in printed
    beam, alpha = re.search(r"with the glossary, beam (\d+) and length penalty ([\d.]+)", printed).groups()
    decode = ckpt.load_checkpoint(out)["config"]["decode"]
    assert decode["glossary"]["constrain"] == "missing" and decode["beam_size"] == 2
    assert decode["glossary"]["beam_size"] == (int(beam) if int(beam) != 2 else None)  # None: the setting's own won
    assert decode["glossary"]["length_penalty"] == (float(alpha) if float(alpha) != decode["length_penalty"] else None)
    with pytest.raises(UserError, match="go with --glossary"):
        tune_command(TuneOptions(checkpoint, src, ref, glossary_ignore_case=True))
    bad = tmp_path / "bad.tsv"
    bad.write_text("perro\tdog\ngato\n", encoding="utf-8")
    with pytest.raises(UserError, match="line 2"):
        tune_command(TuneOptions(checkpoint, src, ref, glossary=str(bad), device="cpu", quiet=True))
    with pytest.raises(UserError):
        tune_command(TuneOptions(checkpoint, src, ref, glossary=str(tmp_path / "none.tsv"), device="cpu", quiet=True))


def test_a_new_setting_drops_glossary_settings_chosen_for_the_old_one(trained, tmp_path):
    """apply_to_checkpoint: glossary_beam_size / glossary_length_penalty were chosen for the setting they
    were tuned with; a tune without --glossary that changes the setting resets them, one that keeps it
    keeps them."""
    from nmt.translation.tune import Row, Setting, TuneResult, apply_to_checkpoint

    checkpoint = trained[0]

    def result(setting: Setting) -> TuneResult:
        row = Row(1, 10, setting, 1.0, None, None, 0.0)
        return TuneResult(setting, row, [row], 10, 1.0)

    own = Setting(3, 0, "gnmt", 1.0)
    first = str(tmp_path / "first.pt")
    apply_to_checkpoint(checkpoint, first, result(own), "bleu", "dev", {**own.keys(), "glossary_beam_size": 6,
                                                                         "glossary_length_penalty": 0.4})
    for setting, kept in ((own, True), (Setting(3, 2, "gnmt", 1.0), True), (Setting(3, 0, "gnmt", 1.2), False),
                          (Setting(3, 0, "average", 1.0), False), (Setting(5, 0, "gnmt", 1.0), False),
                          (Setting(1, 0), False)):
        out = str(tmp_path / "out.pt")
        apply_to_checkpoint(first, out, result(setting), "bleu", "dev")
        decode = ckpt.load_checkpoint(out)["config"]["decode"]
        assert (decode["glossary"]["beam_size"], decode["glossary"]["length_penalty"]) == ((6, 0.4) if kept else (None, None)), setting


def test_glossary_keys_from_the_command_line():
    assert decode_config(None, {"glossary_beam_size": "4", "glossary_length_penalty": "0.5"}).glossary.beam_size == 4
    tuned = decode_config(None, {"glossary_beam_size": 4, "glossary_length_penalty": 0.5})
    back = decode_config(tuned, {"glossary_beam_size": "null", "glossary_length_penalty": "null"})
    assert (back.glossary.beam_size, back.glossary.length_penalty) == (None, None)
    for key, value in (("glossary_beam_size", "0"), ("glossary_beam_size", "x"), ("glossary_length_penalty", "-1")):
        with pytest.raises(Exception, match=f"decode.{key.replace('glossary_', 'glossary.')}"):
            decode_config(None, {key: value})


@pytest.mark.slow
def test_train_tune_decode_tunes_best_pt(tmp_path):
    raw = tiny_config_dict(str(tmp_path), max_steps=40, warmup_steps=20, valid_every=1000, valid_bleu=False,
                           metric="loss", tune_decode=True, tune_max_time=20)
    cfg = config_from_dict(raw)
    train(cfg, quiet=True)
    best = ckpt.load_checkpoint(os.path.join(cfg.run_dir, "checkpoints", "best.pt"))
    latest = ckpt.load_checkpoint(os.path.join(cfg.run_dir, "checkpoints", "latest.pt"))
    assert best["tuned"]["dev"] == "the validation set" and best["tuned"]["lines"] >= 100
    assert {k: best["config"]["decode"][k] for k in best["tuned"]["settings"]} == best["tuned"]["settings"]
    assert "tuned" not in latest  # best.pt alone is rewritten (it was a hard link of latest.pt)
    log = open(os.path.join(cfg.run_dir, "train.log"), encoding="utf-8").read()
    assert "tuning the decode settings of best.pt" in log and "tune: chose" in log


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_training_tunes_best_pt_stops_the_tuning(tmp_path, signum):
    """Ctrl-C or SIGTERM while train.tune_decode tuned best.pt was ignored: the tuning ran to its end (up to
    tune_max_time), wrote best.pt and `nmt train` exited 0. Now the tuning stops between two batches, best.pt
    stays as trained (byte for byte), and the exit code is 130 / 143."""
    import hashlib

    from helpers import make_pairs

    raw = tiny_config_dict(str(tmp_path), max_steps=20, warmup_steps=5, valid_every=1000, valid_bleu=False,
                           metric="loss", tune_decode=True, tune_max_time=600)
    valid = {}
    for side, col in (("src", 0), ("tgt", 1)):  # a dev set large enough that tuning it takes a while
        valid[side] = str(tmp_path / f"valid.{side}")
        with open(valid[side], "w", encoding="utf-8") as f:
            f.write("".join(p[col] + "\n" for p in make_pairs(3000, 5)))
    raw["data"]["valid"] = valid
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(raw), encoding="utf-8")
    run_dir = os.path.join(raw["output_dir"], raw["name"])
    log, best = os.path.join(run_dir, "train.log"), os.path.join(run_dir, "checkpoints", "best.pt")
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "nmt", "train", "--config", str(config), "--quiet"], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            if os.path.exists(log) and "tuning the decode settings of best.pt" in open(log, encoding="utf-8").read():
                break
            time.sleep(0.02)
        assert proc.poll() is None, "training ended before it tuned"
        with open(best, "rb") as f:
            trained = hashlib.sha256(f.read()).hexdigest()
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signum, err[-2000:]
    name = signal.Signals(signum).name
    assert f"received {name}: tuning stopped, best.pt keeps the decode settings it was trained with" in err, err
    assert "Traceback" not in err and "tune: chose" not in err, err
    with open(best, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == trained
    assert "tuned" not in ckpt.load_checkpoint(best)
    assert sorted(os.listdir(os.path.dirname(best))) == ["best.pt", "latest.pt", "step_20.pt"]


def test_when_no_setting_keeps_loops_within_the_limit_nothing_is_written(tmp_path, monkeypatch):
    """The README says settings that loop on more than --max-loops of the lines are not chosen; when none was
    within it, `nmt tune` wrote the one that looped least (89% of the lines) without a word. Now: a one-line
    error with the fewest loops found and the --max-loops that would accept it, and nothing written. (An
    untrained model, greedy without n-gram blocking: 7% of its outputs loop.)"""
    import functools

    import nmt.translation.tune
    from helpers import make_pairs, make_tiny_checkpoint
    from nmt.commands.tune import TuneOptions, tune_command
    from nmt.translation.torch_engine import TorchEngine

    checkpoint = make_tiny_checkpoint(str(tmp_path / "untrained.pt"))
    pairs = make_pairs(100, 3)
    src, ref = str(tmp_path / "dev.es"), str(tmp_path / "dev.en")
    for path, col in ((src, 0), (ref, 1)):
        with open(path, "w", encoding="utf-8") as f:
            f.write("".join(p[col] + "\n" for p in pairs))
    engine = TorchEngine.load(checkpoint, "cpu")
    found = nmt.translation.tune.tune(engine, read_lines(src), read_lines(ref), max_loops=1.0, beams=(1,), ngrams=(0,),
                          log=lambda m: None)
    assert 0.02 < found.row.loops < 1  # what the limit is tested against
    monkeypatch.setattr(nmt.translation.tune, "tune", functools.partial(nmt.translation.tune.tune, beams=(1,), ngrams=(0,)))
    before = open(checkpoint, "rb").read()
    out = str(tmp_path / "tuned.pt")
    for kw in (dict(output=out), dict(in_place=True)):
        with pytest.raises(UserError) as e:
            tune_command(TuneOptions(checkpoint, src, ref, max_time=60, device="cpu", quiet=True, **kw))
        msg = str(e.value)
        assert "\n" not in msg and f"{100 * found.row.loops:.1f}% of the 100 dev lines" in msg, msg
        assert "greedy, no-repeat 0" in msg and "nothing written" in msg
        assert f"--max-loops {found.row.loops:g} would accept it" in msg  # (k of 100 lines: exact at 0.1%)
    assert not os.path.exists(out) and open(checkpoint, "rb").read() == before
    # the limit it names accepts that setting
    assert tune_command(TuneOptions(checkpoint, src, ref, output=out, max_time=60, max_loops=found.row.loops,
                                    device="cpu", quiet=True)) == 0
    assert ckpt.load_checkpoint(out)["tuned"]["settings"] == {"beam_size": 1, "no_repeat_ngram": 0}


@pytest.mark.slow
@pytest.mark.parametrize("flag, value, message", [
    ("--max-time", "nan", "--max-time must be a number of seconds > 0, got nan"),
    ("--max-time", "inf", "--max-time must be a number of seconds > 0, got inf"),
    ("--max-time", "0", "--max-time must be a number of seconds > 0, got 0"),
    ("--max-loops", "nan", "--max-loops is a share of the lines, between 0 and 1; got nan"),
    ("--max-loops", "1.5", "--max-loops is a share of the lines, between 0 and 1; got 1.5"),
])
def test_budgets_that_are_not_numbers_are_one_line_errors(trained, flag, value, message):
    """--max-time nan was accepted (nan <= 0 is false)."""
    checkpoint, src, ref = trained
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "nmt", "tune", "-c", checkpoint, "--src", src, "--ref", ref, flag, value,
                        "-o", os.devnull], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert r.returncode == 2 and r.stderr.strip() == f"nmt tune: error: {message}", r.stderr


@pytest.mark.slow
def test_a_multilingual_checkpoint_is_tuned_in_the_language_of_tgt_lang(tmp_path):
    """On a multilingual checkpoint `nmt tune` said "choose one with --tgt-lang", a flag it did not have. Now
    it has it: the dev set is decoded into that language (the chosen row's BLEU on the whole dev set is what
    translating into it gives), the settings go into the decode section (one for every language: its
    tgt_lang is unchanged) and the `tuned` record names the language."""
    from helpers import multilingual_dict

    from nmt.api import Translator

    raw = multilingual_dict(str(tmp_path), max_steps=60, warmup_steps=10, valid_every=1000, valid_bleu=False,
                            metric="loss")
    cfg = config_from_dict(raw)
    train(cfg, quiet=True)
    checkpoint = os.path.join(cfg.run_dir, "checkpoints", "latest.pt")
    src, ref = raw["data"]["valid"][1]["src"], raw["data"]["valid"][1]["tgt"]  # es -> xx
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    out = str(tmp_path / "tuned.pt")
    base = [sys.executable, "-m", "nmt", "tune", "-c", checkpoint, "--src", src, "--ref", ref, "-o", out, "-q"]
    r = subprocess.run(base, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "choose one with --tgt-lang (en, xx)" in r.stderr
    r = subprocess.run(base + ["--tgt-lang", "xx", "--max-time", "300"], capture_output=True, text=True, cwd=ROOT,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    tuned, before = ckpt.load_checkpoint(out), ckpt.load_checkpoint(checkpoint)
    record = tuned["tuned"]
    assert record["tgt_lang"] == "xx" and record["lines"] == len(read_lines(src))
    assert tuned["config"]["decode"]["tgt_lang"] == before["config"]["decode"]["tgt_lang"]
    hyps = [x.text for x in Translator(out, device="cpu", tgt_lang="xx").translate(read_lines(src))]
    assert record["score"] == pytest.approx(corpus_metrics(hyps, read_lines(ref), ("bleu",))["bleu"]["score"],
                                            abs=1e-9)


def test_train_tune_decode_leaves_best_pt_when_no_setting_is_within_the_loop_limit(tmp_path, monkeypatch):
    """What `nmt tune` refuses, train.tune_decode does not write either: it logs why and best.pt stays as
    trained. (The tuning is narrowed to greedy without n-gram blocking and no looping line allowed: after
    20 steps some outputs loop.)"""
    import functools

    import nmt.translation.tune

    monkeypatch.setattr(nmt.translation.tune, "tune", functools.partial(nmt.translation.tune.tune, beams=(1,), ngrams=(0,), max_loops=0.0))
    raw = tiny_config_dict(str(tmp_path), max_steps=20, warmup_steps=5, valid_every=1000, valid_bleu=False,
                           metric="loss", tune_decode=True, tune_max_time=60)
    cfg = config_from_dict(raw)
    train(cfg, quiet=True)
    best = os.path.join(cfg.run_dir, "checkpoints", "best.pt")
    assert "tuned" not in ckpt.load_checkpoint(best)
    assert os.path.samefile(best, os.path.join(cfg.run_dir, "checkpoints", "latest.pt"))  # never rewritten
    log = open(os.path.join(cfg.run_dir, "train.log"), encoding="utf-8").read()
    assert "warning: tune: no setting kept looping outputs within 0% of the lines: the fewest, with greedy, " \
           "no-repeat 0, looped on" in log and "best.pt keeps its decode settings" in log


def test_a_directory_for_the_checkpoint_is_a_one_line_error(tmp_path, capsys):
    """Issue 59 item 12: `nmt tune -c CT2_DIR` said "is a directory, not a text file"; the error names the
    option, and says that tune takes the checkpoint file (a CTranslate2 export cannot be tuned); `nmt
    average` names the option of a directory too."""
    from nmt.cli import main

    export = tmp_path / "ct2"
    export.mkdir()
    (export / "nmt_export.json").write_text("{}")
    lines = tmp_path / "dev.txt"
    lines.write_text("el perro\n", encoding="utf-8")
    assert main(["tune", "-c", str(export), "--src", str(lines), "--ref", str(lines)]) == 2
    assert capsys.readouterr().err == (f"nmt tune: error: --checkpoint {export} is a directory: nmt tune takes a "
                                       "checkpoint file (a CTranslate2 export is tuned as the checkpoint it was "
                                       "exported from, then exported again)\n")
    assert main(["average", str(export), "-o", str(tmp_path / "avg.pt")]) == 2
    assert capsys.readouterr().err == f"nmt average: error: checkpoint 1 {export} is a directory, not a file\n"
