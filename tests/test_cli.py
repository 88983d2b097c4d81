"""The CLI through its real parser and as a subprocess: help, dispatch, one-line errors."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from helpers import ROOT, run_nmt, write_yaml



def test_help_lists_commands():
    r = run_nmt("--help")
    assert r.returncode == 0
    for cmd in ("train", "translate", "evaluate", "average", "export", "serve"):
        assert cmd in r.stdout


@pytest.mark.parametrize("cmd,options", [
    ("train", ["--config", "--set", "--resume", "--device", "--quiet"]),
    ("translate", ["--checkpoint", "--input", "--output", "--beam", "--nbest", "--batch-tokens", "--device"]),
    ("evaluate", ["--hyp", "--ref", "--checkpoint", "--src", "--json", "--save-hyps"]),
    ("serve", ["--checkpoint", "--model", "--engine", "--host", "--port", "--max-lines", "--max-chars", "--max-beam",
               "--max-queue", "--timeout", "--batch-window-ms", "--batch-lines", "--no-batching", "--beam"]),
])
def test_command_help_explains_every_option(cmd, options):
    from nmt.cli import build_parser
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[cmd]
    for action in sub._actions:
        if action.dest != "help":
            assert action.help, f"{cmd} {action.option_strings} has no help"
    text = sub.format_help()
    for opt in options:
        assert opt in text


def test_export_choices_come_from_the_export_command_and_the_exporter():
    """--format lists the formats registered with the export command, --quantization the CTranslate2
    exporter's QUANTIZATIONS (the CLI kept its own list, which lacked int8_bfloat16)."""
    from nmt.cli import build_parser
    from nmt.commands.export import FORMATS
    from nmt.ct2_export import QUANTIZATIONS

    export = next(a for a in build_parser()._actions if a.dest == "command").choices["export"]
    choices = {a.dest: tuple(a.choices) for a in export._actions if a.choices is not None}
    assert choices == {"format": tuple(FORMATS), "quantization": QUANTIZATIONS}
    assert "int8_bfloat16" in choices["quantization"] and set(FORMATS) == {"ctranslate2", "hf"}


def test_help_does_not_import_torch():
    code = ("import sys; from nmt.cli import build_parser; build_parser().format_help(); "
            "import nmt.config; print('torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.stdout.strip() == "False", r.stderr


def test_no_command_prints_help_and_fails():
    r = run_nmt()
    assert r.returncode == 2 and "train" in r.stdout


def _cfg(tmp_path):
    for n in ("a.src", "a.tgt"):
        (tmp_path / n).write_text("x\n", encoding="utf-8")
    corpus = {"src": str(tmp_path / "a.src"), "tgt": str(tmp_path / "a.tgt")}
    return {"data": {"src_lang": "x", "tgt_lang": "y", "train": corpus, "valid": dict(corpus)}}


@pytest.mark.parametrize("mutate,message", [
    (lambda c: c.setdefault("train", {}).update(warmup=10),
     "nmt train: error: unknown key 'train.warmup' - did you mean 'train.warmup_steps'?"),
    (lambda c: c["data"]["train"].update(src="/nonexistent/x.src"),
     "nmt train: error: data file not found: 'data.train.src': /nonexistent/x.src"),
    (lambda c: c.setdefault("model", {}).update(dropout=2),
     "nmt train: error: invalid value for 'model.dropout': 2.0 (must be <= 1)"),
])
def test_bad_config_one_line_exit_2(tmp_path, mutate, message):
    raw = _cfg(tmp_path)
    mutate(raw)
    r = run_nmt("train", "--config", write_yaml(tmp_path / "c.yaml", raw))
    assert r.returncode == 2
    assert r.stderr.strip() == message
    assert "Traceback" not in r.stderr


def test_check_prints_resolved_config_with_overrides(tmp_path):
    r = run_nmt("train", "--config", write_yaml(tmp_path / "c.yaml", _cfg(tmp_path)), "--set", "train.lr=5e-4",
                "--set", "model.layers=4", "--check")
    assert r.returncode == 0, r.stderr
    resolved = yaml.safe_load(r.stdout)
    assert resolved["train"]["lr"] == 5e-4 and resolved["model"]["layers"] == 4
    r = run_nmt("train", "--config", write_yaml(tmp_path / "c.yaml", _cfg(tmp_path)), "--set", "model.layers=four")
    assert r.returncode == 2 and r.stderr.strip() == "nmt train: error: invalid value for 'model.layers': 'four' (expected an integer)"


def test_missing_files_are_one_line_errors(tmp_path):
    r = run_nmt("train", "--config", str(tmp_path / "none.yaml"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "config file not found" in r.stderr
    r = run_nmt("evaluate", "--hyp", str(tmp_path / "h.txt"), "--ref", str(tmp_path / "r.txt"))
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.count("\n") == 1
    r = run_nmt("translate", "--checkpoint", str(tmp_path / "none.pt"), stdin="hola\n")
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.count("\n") == 1
