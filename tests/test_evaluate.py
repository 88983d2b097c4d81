"""nmt.evaluation.metrics and `nmt evaluate`: scores equal the `sacrebleu` command's on the same files; errors name both files."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys

import pytest

from nmt.errors import UserError
from nmt.commands.evaluate import EvaluateOptions, evaluate_command
from nmt.evaluation.metrics import corpus_metrics
from nmt.textio import read_lines
from helpers import make_pairs, one_line_error, run_nmt, write

# Hand-made pairs: punctuation, casing, Unicode, an empty line, trailing spaces, a CRLF line.
REF = ("The cat sat on the mat.\n"
       "Hello, world! How are you today?\n"
       "\n"
       "Über den Wolken muss die Freiheit wohl grenzenlos sein.\n"
       "It's 3.5% cheaper -- isn't it?   \n"
       "A line ending in CRLF.\r\n"
       "Numbers: 1,000,000 and 2.5e-3.\n")
HYP = ("The cat sat on a mat .\n"
       "hello world, how are you today\n"
       "something\n"
       "Über den Wolken muss die Freiheit grenzenlos sein.\n"
       "It is 3.5 % cheaper, isn't it?\n"
       "A line ending in CRLF.\n"
       "Numbers : 1,000,000 and 2.5e-3\n")
HYP2 = "x\ny\nz\nw\nv\nu\nt\n"  # nearly no overlap: BLEU 0, tiny chrF


def _write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8"))
    return str(path)


def _sacrebleu_json(ref: str, hyp: str, metrics: list[str]) -> list[dict]:
    """The `sacrebleu` command's JSON output, 4 decimals."""
    cmd = [sys.executable, "-m", "sacrebleu", ref, "-i", hyp, "-m", *metrics, "-w", "4", "-f", "json"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    result = json.loads(out)
    return result if isinstance(result, list) else [result]


@pytest.mark.slow
@pytest.mark.parametrize("hyp_text", [HYP, HYP2], ids=["close", "far"])
def test_scores_match_sacrebleu_command(tmp_path, hyp_text):
    ref, hyp = _write(tmp_path, "ref.txt", REF), _write(tmp_path, "hyp.txt", hyp_text)
    expected = {e["name"]: e for e in _sacrebleu_json(ref, hyp, ["bleu", "chrf", "ter"])}
    ours = corpus_metrics(read_lines(hyp), read_lines(ref), ("bleu", "chrf", "ter"))
    assert list(ours) == ["bleu", "chrf", "ter"]
    assert {e["name"] for e in ours.values()} == set(expected) == {"BLEU", "chrF2", "TER"}
    for entry in ours.values():
        ref_entry = expected[entry["name"]]
        assert float(f"{entry['score']:.4f}") == ref_entry["score"], entry["name"]
        assert entry["signature"] == ref_entry["signature"]
    assert ours["bleu"]["verbose"] == expected["BLEU"]["verbose_score"]
    assert "tok:13a" in ours["bleu"]["signature"] and "nc:6" in ours["chrf"]["signature"]


def test_default_metrics_and_text(tmp_path):
    ours = corpus_metrics(["The cat sat on the mat."], ["The cat sat on the mat."])
    assert list(ours) == ["bleu", "chrf"]
    assert ours["bleu"]["score"] == pytest.approx(100.0) and ours["chrf"]["score"] == pytest.approx(100.0)
    assert ours["bleu"]["text"].startswith("BLEU = 100.00 100.0/100.0/100.0/100.0 (BP = 1.000")
    assert ours["bleu"]["text"].endswith(f"[{ours['bleu']['signature']}]")
    assert ours["bleu"]["hyp_len"] == ours["bleu"]["ref_len"] == 7  # 13a splits off the period


@pytest.mark.slow
def test_evaluate_command_text_and_json(tmp_path):
    ref, hyp = _write(tmp_path, "ref.txt", REF), _write(tmp_path, "hyp.txt", HYP)
    expected = {e["name"]: e for e in _sacrebleu_json(ref, hyp, ["bleu", "chrf"])}

    out = io.StringIO()
    assert evaluate_command(EvaluateOptions(hyp, ref), stdout=out) == 0
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and lines[2].startswith("degeneration (7 lines; lengths against the reference): loops")
    assert lines[0].startswith(f"BLEU = {expected['BLEU']['score']:.2f} ")
    assert lines[0].endswith(f"[{expected['BLEU']['signature']}]")
    assert lines[1] == f"chrF2 = {expected['chrF2']['score']:.2f} [{expected['chrF2']['signature']}]"

    out = io.StringIO()
    assert evaluate_command(EvaluateOptions(hyp, ref, json_out=True, metrics=("chrf", "bleu")), stdout=out) == 0
    obj = json.loads(out.getvalue())
    assert obj["n_sentences"] == 7 and obj["hyp"] == hyp and obj["ref"] == ref
    assert float(f"{obj['bleu']['score']:.4f}") == expected["BLEU"]["score"]
    assert float(f"{obj['chrf']['score']:.4f}") == expected["chrF2"]["score"]
    assert obj["chrf"]["signature"] == expected["chrF2"]["signature"]


def test_stdin_and_gzip_and_save(tmp_path):
    ref = str(tmp_path / "ref.txt.gz")
    with gzip.open(ref, "wt", encoding="utf-8") as f:
        f.write(REF)
    hyp = _write(tmp_path, "hyp.txt", HYP)
    from_file, from_stdin = io.StringIO(), io.StringIO()
    evaluate_command(EvaluateOptions(hyp, ref, json_out=True), stdout=from_file)
    saved = tmp_path / "saved.txt"
    evaluate_command(EvaluateOptions(None, ref, json_out=True, save_hyps=str(saved)), stdin=io.BytesIO(HYP.encode()),
                     stdout=from_stdin)
    a, b = json.loads(from_file.getvalue()), json.loads(from_stdin.getvalue())
    assert a["bleu"]["score"] == b["bleu"]["score"] and a["chrf"] == b["chrf"]
    assert saved.read_text(encoding="utf-8").splitlines() == read_lines(hyp)


def test_line_count_mismatch_names_counts_and_files(tmp_path):
    ref = _write(tmp_path, "ref.txt", "a\nb\nc\n")
    hyp = _write(tmp_path, "hyp.txt", "a\nb\n")
    with pytest.raises(UserError) as e:
        evaluate_command(EvaluateOptions(hyp, ref), stdout=io.StringIO())
    msg = str(e.value)
    assert "2" in msg and "3" in msg and hyp in msg and ref in msg
    with pytest.raises(UserError, match="2 hypotheses but 3 references"):
        corpus_metrics(["a", "b"], ["a", "b", "c"])


def test_missing_file_and_bad_input(tmp_path):
    ref = _write(tmp_path, "ref.txt", "a\n")
    with pytest.raises(UserError, match="file not found"):
        evaluate_command(EvaluateOptions(str(tmp_path / "nope.txt"), ref), stdout=io.StringIO())
    with pytest.raises(UserError, match="file not found"):
        evaluate_command(EvaluateOptions(ref, str(tmp_path / "nope.txt")), stdout=io.StringIO())
    with pytest.raises(UserError, match="unknown metric"):
        corpus_metrics(["a"], ["a"], ("meteor",))
    with pytest.raises(UserError, match="nothing to score"):
        corpus_metrics([], [])
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe\n")
    with pytest.raises(UserError, match="line 1: invalid UTF-8"):
        read_lines(str(bad))
    with pytest.raises(UserError, match="line 2: invalid UTF-8"):
        evaluate_command(EvaluateOptions(None, ref), stdin=io.BytesIO(b"ok\n\xff\n"), stdout=io.StringIO())
    with pytest.raises(UserError, match="--src"):
        evaluate_command(EvaluateOptions(None, ref, checkpoint="x.pt"), stdout=io.StringIO())


# --------------------------------------------------------------------------- tokenize / lowercase

@pytest.mark.slow
@pytest.mark.parametrize("tokenize", ["13a", "intl", "zh", "char", "none"])
@pytest.mark.parametrize("lowercase", [False, True])
def test_tokenize_and_lowercase_match_the_sacrebleu_command(tmp_path, tokenize, lowercase):
    """Chinese text is scored per character with zh (13a sees one word per sentence); every option
    gives the same BLEU and chrF as `sacrebleu -tok T [-lc --chrf-lowercase]` on the same files."""
    refs = ["我们今天去公园散步。", "他说：“这本书很好看！”", "The Cat sat on the mat, and SMILED.", "天气预报说明天会下雨",
            "Ça coûte 3,5 €; c'est «cher».", "北京是中国的首都。"]
    hyps = ["我们今天去公园。", "他说：“这本书好看！”", "the cat sat on the mat and smiled.", "天气预报说明天下雨",
            "Ça coûte 3,5 € c'est cher.", "北京是首都。"]
    ref = _write(tmp_path, "ref.txt", "".join(r + "\n" for r in refs))
    hyp = _write(tmp_path, "hyp.txt", "".join(h + "\n" for h in hyps))
    out = io.StringIO()
    evaluate_command(EvaluateOptions(hyp, ref, metrics=("bleu", "chrf"), tokenize=tokenize, lowercase=lowercase,
                                     json_out=True), stdout=out)
    got = json.loads(out.getvalue())
    cmd = [sys.executable, "-m", "sacrebleu", ref, "-i", hyp, "-m", "bleu", "chrf", "-w", "6", "-f", "json",
           "-tok", tokenize] + (["-lc", "--chrf-lowercase"] if lowercase else [])
    want = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    assert round(got["bleu"]["score"], 6) == pytest.approx(want[0]["score"], abs=1e-6)
    assert round(got["chrf"]["score"], 6) == pytest.approx(want[1]["score"], abs=1e-6)
    assert got["bleu"]["signature"] == want[0]["signature"] and got["chrf"]["signature"] == want[1]["signature"]
    assert f"tok:{tokenize}" in got["bleu"]["signature"]
    assert ("case:lc" in got["bleu"]["signature"]) == lowercase


def test_tokenize_errors(tmp_path):
    from nmt.evaluation.metrics import check_tokenize

    ref = _write(tmp_path, "ref.txt", "a\n")
    with pytest.raises(UserError, match="unknown BLEU tokenizer 'spaces'"):
        evaluate_command(EvaluateOptions(ref, ref, tokenize="spaces"), stdout=io.StringIO())
    try:
        import MeCab  # noqa: F401
    except ImportError:  # without the optional MeCab packages: a one-line install hint
        with pytest.raises(UserError, match=r'pip install "sacrebleu\[ja\]"'):
            check_tokenize("ja-mecab")


# --------------------------------------------------------------------------- --langid

def test_an_explicit_langid_that_cannot_count_off_target_is_an_error(tmp_path):
    """`nmt evaluate --langid X` with a checkpoint X that has no language identifier gave `off_target: null`
    without a word. An explicit --langid that cannot be honoured is now a one-line error (no identifier, no
    language to check, a language it does not know), before any work; one that can counts off-target lines."""
    from helpers import make_pairs, make_tiny_checkpoint

    from nmt.model import checkpoint as ckpt
    from nmt.text.langid import LanguageIdentifier

    plain = make_tiny_checkpoint(str(tmp_path / "plain.pt"))  # a bilingual model into "en": no identifier
    state = ckpt.load_checkpoint(plain)
    english = [p[1] for p in make_pairs(200, 1)]
    state["langid"] = LanguageIdentifier.train({"en": english, "xx": [s[::-1] for s in english]}).to_dict()
    for key in ("format", "version"):
        state.pop(key)
    with_langid = str(tmp_path / "langid.pt")
    ckpt.save_checkpoint(state, with_langid)
    hyps = [p[1] for p in make_pairs(10, 2)]
    ref = _write(tmp_path, "ref.en", "".join(h + "\n" for h in hyps))
    hyp = _write(tmp_path, "hyp.xx", "".join(h[::-1] + "\n" for h in hyps))  # all in the wrong language

    def run(langid, **overrides):
        out = io.StringIO()
        evaluate_command(EvaluateOptions(hyp, ref, json_out=True, langid=langid,
                                         overrides=overrides), stdout=out, stderr=io.StringIO())
        return json.loads(out.getvalue())["off_target"]

    with pytest.raises(UserError) as e:
        run(plain)
    assert str(e.value) == (f"--langid {plain}: off-target outputs cannot be counted: it has no language "
                            "identifier (multilingual models trained by nmt carry one)")
    with pytest.raises(UserError, match=f"^--langid {with_langid}: off-target outputs cannot be counted: the "
                                        "language identifier knows en, xx, not fr$"):
        run(with_langid, tgt_lang="fr")
    assert run(with_langid)["count"] == 10  # the hypotheses' language: the --langid model's (en)
    assert run(with_langid, tgt_lang="xx")["count"] == 0
    assert run(None) is None  # none asked for, none counted


@pytest.mark.slow
def test_compare_with_langid_is_an_error(tmp_path):
    """--compare does not count off-target outputs: a --langid with it was ignored without a word."""
    import os

    ref, hyp = _write(tmp_path, "ref.txt", REF), _write(tmp_path, "hyp.txt", HYP)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-m", "nmt", "evaluate", "--ref", ref, "--compare", hyp, ref, "--langid", ref],
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": root}, timeout=300)
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert r.stderr == "nmt evaluate: error: --compare does not count off-target outputs: give it without --langid\n"


def test_compare_with_save_hyps_and_an_empty_glossary_say_what_they_do(tmp_path, capsys):
    """`--compare A B --save-hyps F` wrote no F without a word; `--glossary EMPTY` dropped the terms report (an empty
    Glossary is falsy) where a glossary that matches nothing reports "no glossary entry matches"."""
    from nmt.cli import main

    ref, hyp = _write(tmp_path, "ref.txt", REF), _write(tmp_path, "hyp.txt", HYP)
    assert main(["evaluate", "--ref", ref, "--compare", hyp, ref, "--save-hyps", str(tmp_path / "s.txt")]) == 2
    assert "give it without --save-hyps" in capsys.readouterr().err and not (tmp_path / "s.txt").exists()
    empty = _write(tmp_path, "empty.tsv", "")
    assert main(["evaluate", "--ref", ref, "--hyp", hyp, "--src", ref, "--glossary", empty, "--json"]) == 0
    assert "term_use" in json.loads(capsys.readouterr().out)


# --------------------------------------------------------------------------- nmt evaluate: output paths and options

@pytest.mark.slow
def test_save_hyps_into_a_missing_directory_fails_before_translating(ckpt, tmp_path):
    src = write(tmp_path / "src.es", ["el sol"])
    proc = run_nmt("evaluate", "-c", ckpt, "--src", src, "--ref", src, "--save-hyps", str(tmp_path / "no" / "h.txt"))
    one_line_error(proc, 2, "does not exist")


@pytest.mark.slow
def test_evaluate_rejects_nbest_and_uses_batch_size(ckpt, tmp_path, monkeypatch):
    from nmt.commands.evaluate import EvaluateOptions, evaluate_command

    src = write(tmp_path / "src.es", [p[0] for p in make_pairs(9, 4)])
    one_line_error(run_nmt("evaluate", "-c", ckpt, "--src", src, "--ref", src, "--nbest", "2", "--beam", "2"),
                   2, "--nbest must be 1")
    import nmt.translation.batching as batching

    seen = []
    real = batching.make_batches
    monkeypatch.setattr(batching, "make_batches", lambda lengths, bt, mbs: seen.append(mbs) or real(lengths, bt, mbs))
    evaluate_command(EvaluateOptions(None, src, checkpoint=ckpt, src=src, overrides={"max_batch_size": "2"},
                                     quiet=True), stdout=io.StringIO())
    assert seen == [2]
