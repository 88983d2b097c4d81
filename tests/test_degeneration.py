"""The degeneration report (nmt/evaluation/degeneration.py): each category against hand-made lines, and
through `nmt evaluate` (text and --json with flagged line numbers)."""

from __future__ import annotations

import io
import json
import os

import pytest

from nmt.evaluation.degeneration import degeneration, format_report, loops, scalars
from nmt.commands.evaluate import EvaluateOptions, evaluate_command

SRC = ["el perro ve la casa", "la luna", "uno dos tres cuatro cinco seis", "hola", "el sol ve el rio", ""]
REF = ["the dog sees the house", "the moon", "one two three four five six", "hello", "the sun sees the river", ""]
HYP = ["the dog sees the house", "the moon the moon the moon the moon", "one", "hola", "", ""]


def test_each_category_flags_the_right_lines():
    r = degeneration(HYP, REF, SRC, finished=[True, False, True, True, True, True])
    assert r["lines"] == 6 and r["against"] == "reference"
    assert r["loops"]["lines"] == [2]  # "the moon" x4: the 3-grams occur 3+ times
    assert r["long"]["lines"] == [2] and r["short"]["lines"] == [3, 5]  # 1/6 words; empty output counts as short
    assert r["copies"]["lines"] == [4] and r["empty"]["lines"] == [5]  # line 6 (all empty) is not judged
    assert r["at_limit"]["lines"] == [2] and r["at_limit"]["share"] == pytest.approx(1 / 6)
    assert scalars(r)["degenerate_loops"] == pytest.approx(1 / 6)
    line = format_report(r)
    assert line.startswith("degeneration (6 lines; lengths against the reference): loops 16.7% (1)")
    assert "at limit 16.7% (1)" in line


def test_without_references_lengths_are_judged_against_the_source_and_unknowns_are_none():
    r = degeneration(HYP, srcs=SRC)
    assert r["against"] == "source" and r["at_limit"] is None and r["short"]["lines"] == [3, 5]
    r = degeneration(HYP, REF)
    assert r["copies"] is None and "copies" not in format_report(r)


def test_loops_and_tokenizer():
    assert loops("a b c a b c a b c".split()) and not loops("a b c a b c".split())
    assert not loops("a a".split()) and loops("x y z x y z x y z q".split())
    zh = degeneration(["我们我们我们我们我们我们", "今天天气很好"], ["我们走吧", "今天天气很好"], tokenize="zh")
    assert zh["loops"]["lines"] == [1] and zh["long"]["lines"] == [1]  # characters are words with zh


def test_evaluate_prints_and_lists_the_report(tmp_path):
    paths = {}
    for name, lines in (("src", SRC), ("ref", REF), ("hyp", HYP)):
        paths[name] = str(tmp_path / name)
        with open(paths[name], "w", encoding="utf-8") as f:
            f.write("".join(x + "\n" for x in lines))
    out = io.StringIO()
    evaluate_command(EvaluateOptions(paths["hyp"], paths["ref"], src=paths["src"], json_out=True), stdout=out)
    obj = json.loads(out.getvalue())
    assert obj["degeneration"]["loops"]["lines"] == [2] and obj["degeneration"]["copies"]["lines"] == [4]
    out = io.StringIO()
    evaluate_command(EvaluateOptions(paths["hyp"], paths["ref"]), stdout=out)
    assert out.getvalue().splitlines()[-1].startswith("degeneration (6 lines")
    assert os.path.exists(paths["src"])
