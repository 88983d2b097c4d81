"""scripts/extract_glossary.py: the glossary of a corpus, as nmt.text.terms.extract_dictionary finds it, in a
file nmt reads back (run as a command, with nmt imported as installed: PYTHONPATH, no sys.path edits)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from nmt.text.glossary import Entry, read_glossary
from nmt.text.terms import extract_dictionary

from helpers import EN, ES, corpus, write

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "extract_glossary.py"


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True)


def test_writes_the_extracted_glossary(tmp_path):
    src, tgt = corpus(800, seed=5)
    s, t = write(tmp_path / "train.es.gz", src, gz=True), write(tmp_path / "train.en", tgt)
    test = write(tmp_path / "test.es", ["casa grande", "nada", "el perro y el gato"])
    out = tmp_path / "g.tsv"
    done = run("--src", s, "--tgt", t, "--out", out, "--apply", test)
    assert done.returncode == 0, done.stderr
    entries = read_glossary(str(out))
    assert entries == extract_dictionary(zip(src, tgt))
    assert set(entries) <= {Entry(a, b) for a, b in zip(ES, EN)} and len(entries) >= len(ES) - 2
    assert out.read_text(encoding="utf-8").startswith(f"# {len(entries)} entries from {s} / {t}")
    assert "test.es: 2 of 3 lines hold a term" in done.stderr
    done = run("--src", s, "--tgt", t, "--max-entries", 3)
    assert done.returncode == 0 and done.stdout.splitlines()[1:] == [f"{e.source}\t{e.target}" for e in entries[:3]]
    same = write(tmp_path / "same.en", [x.replace("house", "casa") for x in tgt])
    done = run("--src", s, "--tgt", same, "--no-identical")
    kept = [line.split("\t")[0] for line in done.stdout.splitlines()[1:]]
    assert done.returncode == 0 and "casa" not in kept and "perro" in kept
    assert "casa" in [line.split("\t")[0] for line in run("--src", s, "--tgt", same).stdout.splitlines()[1:]]


def test_errors_are_one_line(tmp_path):
    s = write(tmp_path / "a.es", ["uno", "dos"])
    t = write(tmp_path / "a.en", ["one"])
    for args, problem in [(("--src", s, "--tgt", t), "different numbers of lines"),
                          (("--src", s, "--tgt", tmp_path / "none"), "file not found"),
                          (("--src", s, "--tgt", t, "--out", s), "refusing to overwrite")]:
        done = run(*args)
        assert done.returncode == 2 and problem in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert run("--src", s, "--tgt", t, "--min-share", 0).returncode == 2
    bad = tmp_path / "apply.txt"
    bad.write_bytes(b"caf\xe9\n")  # read before the output is written: an invalid --apply file leaves no output
    done = run("--src", s, "--tgt", s, "--out", tmp_path / "g.tsv", "--apply", bad)
    assert done.returncode == 2 and "invalid UTF-8" in done.stderr and not (tmp_path / "g.tsv").exists()
