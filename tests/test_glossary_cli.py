"""Glossaries end to end (issue 37) on a tiny checkpoint: `Translator.translate(glossary=)`,
`nmt translate --glossary`, `nmt evaluate --glossary`, `POST /translate` with "glossary".

The reference for "every output holds every matched term" is nmt.text.glossary's own matching rule
(`Glossary.targets` on the source line, `appears` on the output); lines no entry matches must be
what a run without the glossary gives (text and score); the untrained model writes the terms by
itself on too few lines for the checks to pass without the constrained search.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from nmt import cli
from nmt.api import Translator
from nmt.errors import UserError
from nmt.text.glossary import Entry, Glossary, appears, check_entries

from helpers import ROOT, make_pairs

LINES = [s for s, _ in make_pairs(14, 5)] + ["", "y el perro"]
GLOSSARY = [("perro", "moon"), ("gato grande", "big river"), ("mesa", "sun")]


@pytest.fixture(scope="module")
def translator(ckpt) -> Translator:
    return Translator(ckpt, device="cpu")


def _targets(line: str) -> list[str]:
    return Glossary(check_entries(GLOSSARY)).targets(line)


def test_lines_split_between_matched_and_not():
    assert 0 < sum(bool(_targets(line)) for line in LINES) < len(LINES) - 2


@pytest.mark.parametrize("options", [{"beam_size": 1}, {"beam_size": 2}, {"beam_size": 3, "nbest": 2},
                                     {"beam_size": 2, "no_repeat_ngram": 1},
                                     {"beam_size": 2, "glossary_constrain": "missing"},
                                     {"beam_size": 3, "nbest": 2, "glossary_constrain": "missing"},
                                     {"beam_size": 2, "glossary_beam_size": 4, "glossary_length_penalty": 0.3},
                                     {"beam_size": 1, "glossary_beam_size": 3, "glossary_constrain": "missing"}])
def test_every_output_holds_every_matched_term(translator, options):
    with_terms = translator.translate(LINES, glossary=GLOSSARY, **options)
    plain = translator.translate(LINES, **options)
    missed_without = 0
    for line, got, base in zip(LINES, with_terms, plain):
        targets = _targets(line)
        for h in got.hypotheses:
            assert all(appears(t, h.text) for t in targets), (line, h.text, targets)
        if not targets:  # (with glossary settings of their own, lines without terms form batches of their own:
            # the same search, its scores up to float rounding of another padding)
            assert [h.text for h in got.hypotheses] == [h.text for h in base.hypotheses]
            assert [h.score for h in got.hypotheses] == pytest.approx([h.score for h in base.hypotheses], rel=1e-5)
        missed_without += any(not appears(t, base.text) for t in targets)
    assert missed_without >= 3  # without the glossary the model misses terms: the check can fail


@pytest.mark.parametrize("constrain", ["always", "missing"])
def test_lines_with_terms_get_the_glossary_beam_and_penalty(translator, constrain):
    """decode.glossary_beam_size / glossary_length_penalty: a line with a term that the constrained search
    takes is searched as with beam_size / length_penalty set to them; every other line as without them."""
    own = {"beam_size": 2, "length_penalty": 1.0, "glossary_constrain": constrain}
    got = translator.translate(LINES, glossary=GLOSSARY, glossary_beam_size=4, glossary_length_penalty=0.2, **own)
    free = translator.translate(LINES, **own)
    same = translator.translate(LINES, glossary=GLOSSARY, **own)
    wide = translator.translate(LINES, glossary=GLOSSARY, **{**own, "beam_size": 4, "length_penalty": 0.2})
    changed = 0
    for line, g, f, s, w in zip(LINES, got, free, same, wide):
        searched = bool(_targets(line)) and (constrain == "always" or not all(appears(t, f.text) for t in _targets(line)))
        want = w if searched else f
        assert g.text == want.text and g.score == pytest.approx(want.score, rel=1e-5), line  # (batches: see above)
        changed += searched and (s.text, s.score) != (w.text, w.score)
    assert changed >= 2  # the settings change those lines: the check can fail


@pytest.mark.parametrize("options", [{"glossary_constrain": "missing"}, {"glossary_constrain": "always"},
                                     {"glossary_constrain": "missing", "glossary_beam_size": 3, "max_batch_size": 3}])
def test_progress_counts_each_line_once(ckpt, options):
    """`missing` searches the lines that miss a term a second time: progress still counts each line once."""
    from nmt.config import decode_config
    from nmt.text.glossary import Glossary
    from nmt.translation.torch_engine import TorchEngine
    from nmt.translation.translate import translate_chunk

    engine = TorchEngine.load(ckpt, "cpu")
    done: list[int] = []
    results = translate_chunk(engine, LINES, decode_config(engine.decode, {"beam_size": 2, **options}),
                              on_batch=done.append, glossary=Glossary(check_entries(GLOSSARY)))
    assert sum(done) == len(LINES) == len(results) and len(done) >= 2
    assert all(all(appears(t, r.text) for t in _targets(line)) for line, r in zip(LINES, results))


@pytest.mark.parametrize("beam_size", [1, 2])
def test_missing_searches_again_only_the_lines_whose_free_output_misses_a_term(translator, beam_size):
    """decode.glossary_constrain: missing: a line whose output without the glossary holds
    its terms keeps that output (text and score); a line whose output misses one gets the constrained
    search's output (`always`). Per line, with an entry made from its own free output."""
    kept = searched = 0
    for line in LINES[:14]:
        free = translator.translate([line], beam_size=beam_size)[0]
        word = re.search(r"\w+", free.text)
        if word is None:
            continue
        source = line.split()[0]
        got = translator.translate([line], glossary=[(source, word.group())], beam_size=beam_size,
                                   glossary_constrain="missing")[0]
        assert (got.text, got.score) == (free.text, free.score), line
        kept += 1
        if appears("moon", free.text):
            continue
        missing = translator.translate([line], glossary=[(source, "moon")], beam_size=beam_size,
                                       glossary_constrain="missing")[0]
        always = translator.translate([line], glossary=[(source, "moon")], beam_size=beam_size,
                                      glossary_constrain="always")[0]
        assert appears("moon", missing.text) and (missing.text, missing.score) == (always.text, always.score), line
        searched += 1
    assert kept >= 10 and searched >= 10


def test_prefixes_and_ignore_case(translator):
    lines = ["el Perro come la mesa", "la casa ve el gato grande"]
    prefixes = ["the", ""]
    got = translator.translate(lines, prefixes=prefixes, glossary=GLOSSARY, glossary_ignore_case=True)
    assert got[0].text.startswith("the") and appears("moon", got[0].text) and appears("sun", got[0].text)
    assert appears("big river", got[1].text)
    line = ["el Perro come la casa"]  # "Perro" is not "perro": no match, the plain output
    assert translator.translate(line, glossary=GLOSSARY)[0].text == translator.translate(line)[0].text
    assert appears("moon", translator.translate(line, glossary=GLOSSARY, glossary_ignore_case=True)[0].text)


def test_a_glossary_beam_that_patience_would_stop_before_nbest_is_a_one_line_error(translator):
    """glossary_beam_size with patience: round(3 * 0.4) = 1 finished hypothesis < nbest 2 (an error only
    where a glossary is used: the lines without one never take that search)."""
    options = {"beam_size": 5, "nbest": 2, "patience": 0.4, "glossary_beam_size": 3}
    with pytest.raises(UserError, match=r"glossary_beam_size 3 with patience 0.4 .* fewer than nbest 2"):
        translator.translate(LINES, glossary=GLOSSARY, **options)
    assert len(translator.translate(LINES, **options)) == len(LINES)
    with pytest.raises(UserError, match=r"= 0 finished hypotheses"):  # greedy ignores patience; a beam of 3 does not
        translator.translate(LINES, glossary=GLOSSARY, beam_size=1, patience=0.1, glossary_beam_size=3)
    assert len(translator.translate(LINES, beam_size=1, patience=0.1, glossary_beam_size=3)) == len(LINES)


def test_api_errors_are_one_line(translator):
    with pytest.raises(UserError, match=r"glossary\[1\]"):
        translator.translate(LINES, glossary=[("perro", "moon"), ("gato",)])
    with pytest.raises(UserError, match="sampling"):
        translator.translate(LINES, glossary=GLOSSARY, sampling="topk")
    with pytest.raises(UserError, match="cannot be written"):
        translator.translate(["el perro"], glossary=[("perro", "zebra ✓")])
    with pytest.raises(TypeError, match="glossary_ignore_case"):
        translator.translate(LINES, glossary=GLOSSARY, glossary_ignore_case="yes")


@pytest.mark.parametrize("term, written", [("ｍｏｏｎ", "moon"), ("moon\u200b", "moon"), ("ﬁeld", None),
                                           ("sun ﬁeld", None)])
def test_a_target_term_the_tokenizer_would_change_is_refused_when_loaded(translator, term, written):
    """Issue 59 item 3: a target term the tokenizer normalises (full-width letters, a zero-width space; NFKC:
    ™, ligatures) would be written otherwise than given (or not at all): a one-line error that names it, when
    the glossary is loaded (the entry need not match), never an output without the term."""
    for lines in (["el perro come"], ["la casa"]):  # the entry matches / matches no line
        with pytest.raises(UserError) as e:
            translator.translate(lines, glossary=[("perro", term), ("gato", "sun")])
        message = str(e.value)
        assert repr(term) in message and "\n" not in message, message
        if written is not None:
            assert f"would be written {written!r}" in message, message


def test_every_target_term_is_checked_when_the_glossary_is_loaded(translator, ckpt, tmp_path, capsys):
    """Issue 59 item 4: a target term the model cannot write, or too long for its positions, is an error
    when the glossary is loaded, whether or not (and wherever) its entry matches, not when a chunk
    with a line it matches comes up."""
    from nmt.commands.translate import TranslateOptions, translate_command

    long_term = " ".join(["moon"] * 30)  # 30 tokens: more than the tiny model's 24 positions
    for target, message in (("zebra ✓", "cannot be written"), (long_term, "output tokens")):
        glossary = [("perro", "moon"), ("cebra", target)]  # "cebra" occurs in no line
        with pytest.raises(UserError, match=message):
            translator.translate(LINES, glossary=glossary)
        src = _write(tmp_path / "in.txt", LINES)
        tsv = _write(tmp_path / "terms.tsv", [f"{s}\t{t}" for s, t in glossary])
        out = tmp_path / "out.txt"
        with pytest.raises(UserError, match=message) as e:
            translate_command(TranslateOptions(ckpt, src, str(out), glossary=tsv, quiet=True, chunk_lines=2,
                                               device="cpu"))
        assert "cebra" in str(e.value) and not out.exists()


def test_a_lone_surrogate_in_a_term_is_a_one_line_error(translator):
    """Issue 59 item 5: a lone surrogate (not Unicode text; JSON's \\ud800 escape) in a source or target term:
    a one-line UserError naming the entry (the server: 400), never sentencepiece's TypeError or a 500."""
    from nmt.commands.serve_request import RequestError, parse_glossary

    for pair in (("perro", "mo\ud800on"), ("pe\udfffrro", "moon")):
        with pytest.raises(UserError, match=r"glossary\[1\]: .*surrogate U\+D[8F]"):
            translator.translate(["el perro come"], glossary=[("gato", "sun"), pair])
        with pytest.raises(UserError, match="surrogate"):
            translator.translate(["el perro come"], glossary=Glossary([Entry(*pair)]))
        with pytest.raises(RequestError, match=r"glossary\[0\]: .*surrogate") as e:
            parse_glossary({"glossary": [list(pair)]})
        assert e.value.status == 400


def _write(path, lines) -> str:
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))
    return str(path)


def test_translate_command_equals_the_api(translator, ckpt, tmp_path, capsys):
    src = _write(tmp_path / "in.txt", LINES)
    tsv = _write(tmp_path / "terms.tsv", ["# a comment", ""] + [f"{s}\t{t}" for s, t in GLOSSARY])
    out = str(tmp_path / "out.txt")
    assert cli.main(["translate", "-c", ckpt, "-i", src, "-o", out, "--glossary", tsv, "--beam", "2", "-q"]) == 0
    with open(out, encoding="utf-8") as f:
        assert f.read().splitlines() == [r.text for r in translator.translate(LINES, glossary=GLOSSARY, beam_size=2)]


def test_ignore_case_from_the_command_line_and_the_server(ckpt, translator, tmp_path, capsys):
    """Issue 59 item 2: --glossary-ignore-case (nmt translate, nmt evaluate) and "glossary_ignore_case": true
    (POST /translate) match as the API's glossary_ignore_case=True does (they failed: the compiled
    Glossary's ignore_case was taken for a conflict with the API's default)."""
    lines = ["el Perro come la mesa", "la casa ve el gato GRANDE"] + LINES[:4]
    want = [r.text for r in translator.translate(lines, glossary=GLOSSARY, glossary_ignore_case=True)]
    assert appears("moon", want[0]) and appears("big river", want[1])
    src = _write(tmp_path / "in.txt", lines)
    ref = _write(tmp_path / "ref.txt", ["the dog eats the table", "the house sees the big cat"] + LINES[:4])
    tsv = _write(tmp_path / "terms.tsv", [f"{s}\t{t}" for s, t in GLOSSARY])
    out = str(tmp_path / "out.txt")
    code = cli.main(["translate", "-c", ckpt, "-i", src, "-o", out, "--glossary", tsv, "--glossary-ignore-case", "-q"])
    assert code == 0, capsys.readouterr().err
    with open(out, encoding="utf-8") as f:
        assert f.read().splitlines() == want
    code = cli.main(["evaluate", "-c", ckpt, "--src", src, "--ref", ref, "--glossary", tsv, "--glossary-ignore-case",
                     "--json", "-q"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert json.loads(captured.out)["term_use"] == 100.0
    pytest.importorskip("starlette", reason="nmt serve's stack is the serve extra")
    import asyncio

    from nmt.commands.batcher import Settings
    from nmt.commands.serve_app import Service

    service = Service(translator, Settings(), "tiny")

    async def answer():
        async with service.lifespan(None):
            loop = asyncio.get_running_loop()
            body = json.dumps({"text": lines, "glossary": [list(e) for e in GLOSSARY], "glossary_ignore_case": True})
            job, _ = service.accept(body.encode())
            return await service.answer(job, loop.time(), loop.time() + 60, loop.create_future())

    assert [t["text"] for t in asyncio.run(answer())["translations"]] == want


def test_translate_command_reports_the_glossary(ckpt, tmp_path, capsys):
    """Without -q, `nmt translate --glossary` ends with how many entries matched on how many lines and
    how many target terms the outputs hold (all: the guarantee); a glossary that matches nothing says
    so, with the hint about case."""
    src = _write(tmp_path / "in.txt", LINES)
    tsv = _write(tmp_path / "terms.tsv", [f"{s}\t{t}" for s, t in GLOSSARY])
    out = str(tmp_path / "out.txt")
    capsys.readouterr()
    assert cli.main(["translate", "-c", ckpt, "-i", src, "-o", out, "--glossary", tsv, "--beam", "2"]) == 0
    last = capsys.readouterr().err.strip().splitlines()[-1]
    matched = sum(len(_targets(line)) for line in LINES)
    lines = sum(bool(_targets(line)) for line in LINES)
    assert last == (f"glossary: {matched} entries matched on {lines} of {len(LINES)} lines; the outputs hold "
                    f"{matched} of their target terms (100.00%)")
    none = _write(tmp_path / "none.tsv", ["PERRO\tmoon"])
    assert cli.main(["translate", "-c", ckpt, "-i", src, "-o", out, "--glossary", none]) == 0
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"glossary: no entry matched any of the {len(LINES)} input lines; matching is case-sensitive: "
        "--glossary-ignore-case")


def test_translate_command_errors(ckpt, tmp_path, capsys):
    src = _write(tmp_path / "in.txt", LINES)
    bad = _write(tmp_path / "bad.tsv", ["perro\tmoon", "gato grande big river"])
    for args, message in ((["--glossary", bad], r"bad\.tsv line 2: expected 'source term<TAB>target term'"),
                          (["--glossary-ignore-case"], "needs --glossary"),
                          (["--glossary", str(tmp_path / "none.tsv")], "none.tsv")):
        out = tmp_path / "out.txt"
        code = cli.main(["translate", "-c", ckpt, "-i", src, "-o", str(out), "-q", *args])
        err = capsys.readouterr().err.strip()
        assert code == 2 and re.search(message, err) and "\n" not in err and not out.exists(), (code, err)


def test_evaluate_reports_term_use(ckpt, translator, tmp_path, capsys):
    src = _write(tmp_path / "src.txt", LINES)
    ref = _write(tmp_path / "ref.txt", [t for _, t in make_pairs(14, 5)] + ["", "and the dog"])
    tsv = _write(tmp_path / "terms.tsv", [f"{s}\t{t}" for s, t in GLOSSARY])
    hyp = _write(tmp_path / "hyp.txt", [r.text for r in translator.translate(LINES)])
    assert cli.main(["evaluate", "--hyp", hyp, "--src", src, "--ref", ref, "--glossary", tsv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    pairs = [(t, h) for line, h in zip(LINES, open(hyp, encoding="utf-8").read().splitlines())
             for t in _targets(line)]
    used = sum(appears(t, h) for t, h in pairs)
    assert report["terms"]["term_matches"] == len(pairs) and report["terms"]["terms_used"] == used
    assert report["term_use"] == pytest.approx(100.0 * used / len(pairs)) and used < len(pairs)
    assert cli.main(["evaluate", "-c", ckpt, "--src", src, "--ref", ref, "--glossary", tsv, "--json", "-q"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["term_use"] == 100.0 and report["terms"]["term_lines"] == sum(bool(_targets(x)) for x in LINES)
    assert report["terms"]["term_lines_bleu"] is not None
    assert cli.main(["evaluate", "--hyp", hyp, "--ref", ref, "--glossary", tsv]) == 2
    assert "needs --src" in capsys.readouterr().err


def test_ctranslate2_refuses_a_glossary(ckpt, tmp_path, capsys):
    pytest.importorskip("ctranslate2", reason="CTranslate2 is an optional extra (pip install -e '.[ct2]')")
    out = str(tmp_path / "ct2")
    assert cli.main(["export", "-c", ckpt, "-o", out]) == 0
    src = _write(tmp_path / "in.txt", LINES)
    tsv = _write(tmp_path / "terms.tsv", [f"{s}\t{t}" for s, t in GLOSSARY])
    assert cli.main(["translate", "--model", out, "-i", src, "--glossary", tsv, "-q"]) == 2
    assert "constrained search" in capsys.readouterr().err
    with pytest.raises(UserError, match="constrained search"):
        Translator(out).translate(LINES, glossary=GLOSSARY)


def _post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url + "/translate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


@pytest.mark.slow
def test_server_glossary_equals_the_api(ckpt, translator):
    pytest.importorskip("uvicorn", reason="nmt serve needs the optional extra: pip install -e '.[serve]'")
    proc = subprocess.Popen([sys.executable, "-m", "nmt", "serve", "-c", ckpt, "--port", "0"], text=True,
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            env=dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1"))
    try:
        url = re.search(r"http://[^/ ]+", proc.stderr.readline()).group(0)
        status, data = _post(url, {"text": LINES, "glossary": [list(e) for e in GLOSSARY], "options": {"beam_size": 2}})
        assert status == 200, data
        want = translator.translate(LINES, glossary=GLOSSARY, beam_size=2)
        assert [t["text"] for t in data["translations"]] == [r.text for r in want]
        status, data = _post(url, {"text": LINES, "glossary": [[f"w{i}", "moon"] for i in range(1001)]})
        assert status == 413 and "1001 glossary entries" in data["error"]
        for glossary, message in (([["perro"]], r"glossary\[0\]"), ({"perro": "moon"}, "list of"),
                                  ([["perro", "moon"], ["perro", "sun"]], "already has the target")):
            status, data = _post(url, {"text": LINES, "glossary": glossary})
            assert status == 400 and re.search(message, data["error"]), data
        status, data = _post(url, {"text": LINES, "glossary": [["perro", "moon"]], "options": {"sampling": "topk"}})
        assert status == 400 and "sampling" in data["error"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_bench_glossary_quick(ckpt, tmp_path):
    """scripts/bench_glossary.py end to end on the tiny model (as plain and as terms model): the
    constrained systems use every term, the report's counts are the glossary's own."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_glossary", os.path.join(ROOT, "scripts", "bench_glossary.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    pairs = make_pairs(300, 1)
    files = {name: _write(tmp_path / f"{name}.txt", lines) for name, lines in (
        ("train-src", [s for s, _ in pairs]), ("train-tgt", [t for _, t in pairs]),
        ("test-src", LINES), ("test-tgt", [t for _, t in make_pairs(14, 5)] + ["", "and the dog"]))}
    out = tmp_path / "out"
    args = [x for name, path in files.items() for x in (f"--{name}", path)]
    assert bench.main(args + ["--plain", ckpt, "--terms", ckpt, "--out", str(out), "--quick", "--beam", "2"]) == 0
    result = json.loads((out / "results.json").read_text())
    entries = [line.split("\t") for line in (out / "glossary.tsv").read_text().splitlines()[1:]]
    assert entries and ["perro", "dog"] in entries  # the corpus' own translation of "perro"
    glossary = Glossary(check_entries(entries))
    term_lines = [line for line in LINES if glossary.targets(line)]
    assert result["glossary"]["term_lines"] == len(term_lines) > 0
    for name in ("plain+glossary", "terms+glossary"):
        assert result["systems"][name]["term_use"] == 100.0
    assert result["systems"]["plain"]["term_use"] < 100.0
    assert set(result["speed"]) == {"all", "no_term_lines"} and (out / "results.md").exists()
    # --consistent: per line only the entries whose target the reference holds (Dinu et al.'s test glossaries)
    out2 = tmp_path / "consistent"
    refs = [""] * 4 + [t for _, t in make_pairs(14, 5)][4:] + ["", "and the dog"]  # 4 lines whose reference has no term
    args[args.index("--test-tgt") + 1] = _write(tmp_path / "test-tgt2.txt", refs)
    assert bench.main(args + ["--plain", ckpt, "--out", str(out2), "--quick", "--beam", "2", "--consistent",
                              "--parts", "systems", "--glossary", str(out / "glossary.tsv")]) == 0
    kept = json.loads((out2 / "results.json").read_text())
    per_line = [[t for t in glossary.targets(src) if appears(t, ref)] for src, ref in zip(LINES, refs)]
    assert kept["glossary"]["consistent"] and kept["glossary"]["term_lines"] == sum(map(bool, per_line))
    assert kept["glossary"]["term_matches"] == sum(map(len, per_line)) < result["glossary"]["term_matches"]
    assert kept["systems"]["plain+glossary"]["term_use"] == 100.0
    hyps = (out2 / "plain+glossary.txt").read_text(encoding="utf-8").splitlines()
    assert all(appears(t, h) for h, ts in zip(hyps, per_line) for t in ts)


@pytest.fixture(scope="module")
def terms_ckpt(tmp_path_factory) -> str:
    """A tiny checkpoint of a model trained with data.terms: its vocabulary has the term markers."""
    from helpers import make_tiny_checkpoint
    from nmt.text.terms import TERM_SYMBOLS
    from nmt.text.tokenizer import tag_symbol

    return make_tiny_checkpoint(str(tmp_path_factory.mktemp("terms") / "terms.pt"),
                                symbols=tuple(tag_symbol(t) for t in TERM_SYMBOLS))


@contextlib.contextmanager
def _searches(engine, record):
    """Within: every `engine.search_batch` call appends record(srcs, inputs) to the yielded list."""
    calls: list = []
    search = engine.search_batch
    engine.search_batch = lambda srcs, options, inputs, cancel=None, on_final=None: (
        calls.append(record(srcs, inputs)), search(srcs, options, inputs, cancel=cancel, on_final=on_final))[1]
    try:
        yield calls
    finally:
        del engine.search_batch


@pytest.mark.parametrize("constrain", ["missing", "always"])
def test_a_terms_model_searches_the_source_as_written(terms_ckpt, constrain):
    """A model trained with data.terms gets its source as given (no translate-time annotation), with the
    terms as constraints; with glossary_constrain: missing the line is first searched as without the
    glossary (no constraints). Its outputs hold the terms."""
    translator = Translator(terms_ckpt, device="cpu")
    engine = translator._engine
    plain = engine.tokenizer.encode_src(["el perro come", "la casa"])
    with _searches(engine, lambda srcs, inputs: (sorted(srcs), inputs.constraints is not None)) as calls:
        result = translator.translate(["el perro come", "la casa"], glossary=GLOSSARY, glossary_constrain=constrain)
        free = translator.translate(["el perro come"])[0]
    assert not appears("moon", free.text)  # so the constrained search runs in both modes
    assert calls[0] == (sorted(plain), constrain == "always")
    if constrain == "missing":
        assert calls[1] == ([plain[0]], True)
    assert len(calls) == 2 + (constrain == "missing")  # (the last: `free`)
    assert appears("moon", result[0].text)
