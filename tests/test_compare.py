"""nmt evaluate --compare: the p-values and confidence intervals are the `sacrebleu` command's
(paired bootstrap and approximate randomization), wins/losses are sentence chrF's, errors are one line."""

from __future__ import annotations

import io
import json
import os
import random
import re
import subprocess
import sys

import pytest

from nmt.commands.evaluate import EvaluateOptions, compare_command
from nmt.evaluation.compare import compare
from nmt.errors import UserError

from helpers import ROOT

WORDS = "the cat sat on mat a dog ran in park house big red and of".split()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A reference and three systems of 80 lines: a (50% words replaced), b (45%: close to a), c (20%)."""
    d = tmp_path_factory.mktemp("cmp")
    rng = random.Random(0)
    refs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 14))) for _ in range(80)]

    def noisy(p):
        return [" ".join(w if rng.random() > p else rng.choice(WORDS) for w in r.split()) for r in refs]
    paths = {}
    for name, lines in (("ref", refs), ("a", noisy(0.5)), ("b", noisy(0.45)), ("c", noisy(0.2))):
        paths[name] = str(d / f"{name}.txt")
        with open(paths[name], "w", encoding="utf-8") as f:
            f.write("".join(x + "\n" for x in lines))
    return paths


def _sacrebleu(ref, hyps, test, fmt):
    cmd = [sys.executable, "-m", "sacrebleu", ref, "-i", *hyps, f"--paired-{test}", "-m", "bleu", "chrf", "-f", fmt]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


@pytest.mark.slow
def test_p_values_and_intervals_are_the_sacrebleu_commands(files):
    out = io.StringIO()
    compare_command(EvaluateOptions(None, files["ref"], compare=(files["a"], files["b"], files["c"]),
                                    json_out=True), stdout=out)
    ours = json.loads(out.getvalue())
    ar = json.loads(_sacrebleu(files["ref"], [files["a"], files["b"], files["c"]], "ar", "json"))
    for i, system in enumerate(ours["systems"]):
        for metric, key in (("bleu", "BLEU"), ("chrf", "chrF2")):
            assert system[metric]["score"] == pytest.approx(ar[i][key]["score"], abs=1e-9)
            if i:
                assert system[metric]["p_ar"] == pytest.approx(ar[i][key]["p_value"], abs=1e-12)
    # bootstrap: the command prints a table (its JSON writer fails on float32), 4 decimals for p
    table = _sacrebleu(files["ref"], [files["a"], files["b"], files["c"]], "bs", "text")
    p_values = [float(x) for x in re.findall(r"p = ([0-9.]+)", table)]
    means = [float(x) for pair in re.findall(r"\(([0-9.]+) ± ([0-9.]+)\)", table) for x in pair]
    got_p = [s[m]["p_bootstrap"] for s in ours["systems"][1:] for m in ("bleu", "chrf")]
    got_mean = [s[m][k] for s in ours["systems"] for m in ("bleu", "chrf") for k in ("mean", "ci")]
    assert got_p == pytest.approx(p_values, abs=5e-5)
    assert got_mean == pytest.approx(means, abs=0.051)
    assert ours["systems"][2]["chrf"]["p_ar"] < 0.001 < ours["systems"][1]["chrf"]["p_ar"]  # c differs much more


def test_line_wins_by_sentence_chrf_and_identical_systems(files):
    from sacrebleu.metrics import CHRF

    from nmt.textio import read_lines

    refs, a, c = read_lines(files["ref"]), read_lines(files["a"]), read_lines(files["c"])
    result = compare([("a", a), ("c", c), ("a again", a)], refs)
    chrf = CHRF()
    diffs = [chrf.sentence_score(y, [r]).score - chrf.sentence_score(x, [r]).score for x, y, r in zip(a, c, refs)]
    lines = result["systems"][1]["lines"]
    assert (lines["wins"], lines["losses"]) == (sum(d > 1e-9 for d in diffs), sum(d < -1e-9 for d in diffs))
    assert lines["wins"] + lines["ties"] + lines["losses"] == len(refs)
    same = result["systems"][2]
    assert same["lines"] == {"wins": 0, "ties": len(refs), "losses": 0, "by": "sentence chrF"}
    assert same["bleu"]["p_bootstrap"] == same["bleu"]["p_ar"] == 1.0  # no difference is never significant
    assert all(v == 0 for v in same["degeneration_delta"].values())


def test_degeneration_deltas():
    refs = ["one two three four five six", "a b c d e f"]
    base = ["one two three four five six", "a b c d e f"]
    loopy = ["one two three one two three one two three", "a"]
    result = compare([("base", base), ("loopy", loopy)], refs)
    delta = result["systems"][1]["degeneration_delta"]
    assert delta["loops"] == 1 and delta["short"] == 1 and delta["long"] == 0


@pytest.mark.slow
def test_errors_are_one_line(files, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("only one line\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"line counts differ: 1 lines in .*short.txt but 80 in"):
        compare_command(EvaluateOptions(None, files["ref"], compare=(files["a"], str(short))), stdout=io.StringIO())
    with pytest.raises(UserError, match="at least two"):
        compare_command(EvaluateOptions(None, files["ref"], compare=(files["a"],)), stdout=io.StringIO())
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.run([sys.executable, "-m", "nmt", "evaluate", "--ref", files["ref"], "--compare", files["a"],
                           str(short)], capture_output=True, text=True, env=env, cwd=ROOT)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    proc = subprocess.run([sys.executable, "-m", "nmt", "evaluate", "--ref", files["ref"], "--compare", files["a"],
                           files["b"], "--hyp", files["a"]], capture_output=True, text=True, env=env, cwd=ROOT)
    assert proc.returncode == 2 and "without --hyp" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "nmt", "evaluate", "--ref", files["ref"], "--compare", files["a"],
                           files["c"]], capture_output=True, text=True, env=env, cwd=ROOT)
    assert proc.returncode == 0 and "p(AR)" in proc.stdout and "better" in proc.stdout
