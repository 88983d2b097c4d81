"""nmt.Translator, the public Python API: the same outputs as the pipeline `nmt translate` uses,
per-call options validated like the flags, frozen results, thread-safe calls, both engines."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading
import time

import pytest

from nmt.config import ConfigError, decode_config
from nmt.errors import UserError
from nmt.translation.score import score_pairs
from nmt.translation.torch_engine import TorchEngine
from nmt.translation.translate import translate_nbest

from helpers import make_pairs, make_tiny_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def lines() -> list[str]:
    return [p[0] for p in make_pairs(12, 5)] + ["", "  "]


def test_import_from_the_package_and_translate_equals_the_pipeline(ckpt, lines):
    from nmt import Translator

    translator = Translator(ckpt)
    assert translator.engine == "torch" and translator.decode.beam_size == 2  # the checkpoint's decode section
    engine = TorchEngine.load(ckpt)
    for options in ({}, {"beam_size": 1}, {"beam_size": 2, "nbest": 2, "length_penalty_type": "average"},
                    {"sampling": "topk", "topk": 3, "nbest": 2, "seed": 4}):
        got = translator.translate(lines, **options)
        want = translate_nbest(engine, lines, decode_config(engine.decode, options), warn=lambda m: None)
        assert len(got) == len(lines)
        assert [[(h.text, h.score, h.log_prob) for h in r.hypotheses] for r in got] == \
            [[(h.text, h.score, h.log_prob) for h in nbest] for nbest in want]
        assert [r.text for r in got] == [nbest[0].text for nbest in want]
    assert got[-1].text == "" and got[-2].text == ""  # empty lines stay empty


def test_results_are_frozen_and_options_are_validated(ckpt, lines):
    from nmt import Translator

    translator = Translator(ckpt)
    result = translator.translate(lines[:2])[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.hypotheses = ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.hypotheses[0].text = "x"
    with pytest.raises(ConfigError, match="nbest"):
        translator.translate(lines, nbest=5)  # > beam_size 2
    with pytest.raises(ConfigError, match="unknown key 'decode.beam'"):
        translator.translate(lines, beam=3)
    with pytest.raises(ConfigError, match="beam_size"):
        Translator(ckpt, beam_size=0)  # checked before the model loads
    with pytest.raises(UserError, match="checkpoint not found"):
        Translator(ckpt + ".missing")
    with pytest.raises(UserError, match="2 prefixes for 3 lines"):
        translator.translate(lines[:3], prefixes=["a", "b"])


def test_prefixes_first_line_and_line_numbers(ckpt, lines):
    from nmt import Translator

    translator = Translator(ckpt)
    out = translator.translate(lines[:4], prefixes=["the", "", "the cat", ""])
    assert out[0].text.startswith("the") and out[2].text.startswith("the cat")
    sampled = dict(sampling="topp", topp=0.9, seed=2)
    whole = translator.translate(lines[:6], **sampled)
    tail = translator.translate(lines[3:6], first_line=3, **sampled)  # a line's sample depends on its number
    assert [r.text for r in whole[3:]] == [r.text for r in tail]
    # line_numbers: each line's own number (lines of several inputs in one call, as nmt serve gathers them)
    gathered = translator.translate(lines[3:6] + lines[:2], line_numbers=[3, 4, 5, 0, 1], **sampled)
    assert [r.text for r in gathered] == [r.text for r in whole[3:6] + whole[:2]]
    with pytest.raises(UserError, match="2 line numbers for 3 lines"):
        translator.translate(lines[:3], line_numbers=[0, 1])


def test_a_translation_counts_the_tokens_the_search_wrote(ckpt, lines):
    """`Translation.tokens`: every output forced to 3 tokens (EOS forbidden before 3, at most 3) holds 3, every
    hypothesis of the n-best list too; a line without tokens holds 0; at a limit of 5, a line that ends with EOS
    holds at most 4 (EOS not counted), one cut at the limit 5."""
    from nmt import Translator

    translator = Translator(ckpt)
    forced = translator.translate(lines, beam_size=2, nbest=2, min_len=3, max_len_a=0, max_len_b=3)
    assert [[h.tokens for h in r.hypotheses] for r in forced] == [[3, 3]] * (len(lines) - 2) + [[0, 0]] * 2
    assert not any(r.finished for r in forced[:-2])
    free = translator.translate(lines[:-2], beam_size=1, max_len_a=0, max_len_b=5)
    assert all(r.hypotheses[0].tokens <= 4 if r.finished else r.hypotheses[0].tokens == 5 for r in free)


def test_texts_must_be_lists_of_strings(ckpt):
    """translate("Hola") translated four characters as four lines, and a None line raised sentencepiece's
    TypeError from deep inside; now a one-line TypeError names the argument (and the item)."""
    from nmt import Translator

    translator = Translator(ckpt)
    calls = {"lines": lambda v: translator.translate(v),
             "prefixes": lambda v: translator.translate(["a", "b"], prefixes=v),
             "sources": lambda v: translator.score(v, ["a", "b"]), "targets": lambda v: translator.score(["a", "b"], v)}
    for name, call in calls.items():
        for value, message in (("ab", f"{name} must be a list of strings, one per line, not a str"),
                               (b"ab", f"{name} must be a list of strings, one per line, not a bytes"),
                               (["a", None], f"{name}[1] must be a string, not NoneType"),
                               ([b"a", "b"], f"{name}[0] must be a string, not bytes"),
                               (7, f"{name} must be a list of strings, one per line, not a int")):
            with pytest.raises(TypeError) as e:
                call(value)
            assert str(e.value).startswith(message) and "\n" not in str(e.value), (name, value, str(e.value))
    # sequences that are not lists still work, as before
    assert [r.text for r in translator.translate(("el gato", "el perro"))] == \
        [r.text for r in translator.translate(["el gato", "el perro"])]
    assert len(translator.score(iter(["el gato"]), ("the cat",))) == 1


def test_lines_and_line_numbers_are_checked_naming_the_argument(ckpt):
    """Issue 59 item 10: a line with a line break was translated as one line (the server refuses it), a lone
    surrogate gave sentencepiece's TypeError, line_numbers=["a"] a TypeError from inside, a dict or a set
    was taken for its keys in no set order. Now each is a one-line TypeError or ValueError naming the
    argument and the item."""
    from nmt import Translator

    translator = Translator(ckpt)
    calls = {"lines": lambda v: translator.translate(v),
             "prefixes": lambda v: translator.translate(["a", "b"], prefixes=v),
             "sources": lambda v: translator.score(v, ["a", "b"]), "targets": lambda v: translator.score(["a", "b"], v)}
    for name, call in calls.items():
        for value, error, message in (
                ({"a": 1, "b": 2}, TypeError, f"{name} must be a list of strings, one per line, not a dict"),
                ({"a", "b"}, TypeError, f"{name} must be a list of strings, one per line, not a set"),
                ({"a": 1, "b": 2}.keys(), TypeError, f"{name} must be a list of strings, one per line, not a dict_keys"),
                (["a", "b\nc"], ValueError, f"{name}[1] contains a line break (one line per item)"),
                (["a\r", "b"], ValueError, f"{name}[0] contains a line break (one line per item)"),
                (["a", "b\ud800"], ValueError, f"{name}[1] is not Unicode text: a lone surrogate U+D800 at character 1")):
            with pytest.raises(error) as e:
                call(value)
            assert str(e.value) == message, (name, value, str(e.value))
    for value, error, message in ((["a", "b"], TypeError, "line_numbers[0] must be an int, not str"),
                                  ([0, 1.0], TypeError, "line_numbers[1] must be an int, not float"),
                                  ([True, 1], TypeError, "line_numbers[0] must be an int, not bool"),
                                  ("01", TypeError, "line_numbers must be a list of ints, one per line, not a str"),
                                  ({0, 1}, TypeError, "line_numbers must be a list of ints, one per line, not a set"),
                                  (7, TypeError, "line_numbers must be a list of ints, one per line, not a int")):
        with pytest.raises(error) as e:
            translator.translate(["el gato", "el perro"], line_numbers=value)
        assert str(e.value) == message, (value, str(e.value))
    import numpy as np

    assert [r.text for r in translator.translate(["el gato", "el perro"], line_numbers=np.arange(2))] == \
        [r.text for r in translator.translate(["el gato", "el perro"], line_numbers=(0, 1))]


def test_concurrent_calls_from_threads_equal_sequential_calls(ckpt, lines):
    from nmt import Translator

    translator = Translator(ckpt, workers=2)
    chunks = [lines[i:i + 4] for i in range(0, len(lines), 4)] * 3
    want = [[r.text for r in translator.translate(c, beam_size=b)] for c, b in zip(chunks, [1, 2] * len(chunks))]
    got: list = [None] * len(chunks)

    def work(i: int) -> None:
        got[i] = [r.text for r in translator.translate(chunks[i], beam_size=[1, 2][i % 2])]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(chunks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == want


@pytest.mark.parametrize("options", [{"beam_size": 1}, {"beam_size": 3, "nbest": 2},
                                     {"sampling": "topk", "topk": 4, "nbest": 2, "seed": 5}],
                         ids=["greedy", "beam", "sampling"])
def test_cancel_is_checked_at_every_step_and_stops_the_call(tmp_path, options):
    """Translator.translate(cancel=...): with min_len = max_len_b = 30 (and max_len_a 0) every search
    runs exactly 30 steps, so cancel() is called 30 times for one line and changes nothing while
    it says False; True at its 7th call raises Cancelled there (no 8th call), and the translator
    keeps working."""
    from nmt import Translator
    from nmt.errors import Cancelled

    translator = Translator(make_tiny_checkpoint(str(tmp_path / "long.pt"), max_positions=64), workers=1)
    steps = dict(min_len=30, max_len_a=0, max_len_b=30, **options)
    line = [make_pairs(1, 5)[0][0]]
    calls: list[int] = []

    def cancel_at(n: int):
        return lambda: calls.append(1) or len(calls) >= n

    plain = translator.translate(line, **steps)
    assert translator.translate(line, cancel=cancel_at(10**9), **steps) == plain
    assert len(calls) == 30 and len(plain[0].hypotheses[0].text.split()) == 30
    calls.clear()
    with pytest.raises(Cancelled):
        translator.translate(line, cancel=cancel_at(7), **steps)
    assert len(calls) == 7
    assert translator.translate(line, **steps) == plain


def test_score_equals_score_pairs(ckpt):
    from nmt import Translator

    pairs = make_pairs(7, 9)
    src, tgt = [p[0] for p in pairs], [p[1] for p in pairs]
    got = Translator(ckpt).score(src, tgt, batch_tokens=20)
    want = score_pairs(TorchEngine.load(ckpt), src, tgt)
    assert [s.n_tokens for s in got] == [s.n_tokens for s in want]
    assert [s.log_prob for s in got] == pytest.approx([s.log_prob for s in want])


@pytest.mark.slow
def test_a_ctranslate2_directory_gives_the_same_greedy_outputs(ckpt, lines, tmp_path):
    pytest.importorskip("ctranslate2", reason="CTranslate2 is an optional extra (pip install -e '.[ct2]')")
    from nmt import Translator

    out = tmp_path / "ct2"
    subprocess.run([sys.executable, "-m", "nmt", "export", "-c", ckpt, "-o", str(out)], check=True,
                   capture_output=True)
    ct2 = Translator(str(out), workers=1)
    assert ct2.engine == "ctranslate2"
    assert [r.text for r in ct2.translate(lines, beam_size=1)] == \
        [r.text for r in Translator(ckpt).translate(lines, beam_size=1)]
    with pytest.raises(UserError, match="alignment is not supported"):
        ct2.translate(lines, alignment=True)


@pytest.mark.slow
def test_a_ctranslate2_directory_refuses_sampling_as_the_readme_says(ckpt, tmp_path):
    """The README said sampling with --engine ctranslate2 works (reproducible with --workers 1); the engine
    refuses it. The README's sampling paragraph now says so."""
    pytest.importorskip("ctranslate2", reason="CTranslate2 is an optional extra (pip install -e '.[ct2]')")
    import os
    import re

    from nmt import Translator

    out = tmp_path / "ct2"
    subprocess.run([sys.executable, "-m", "nmt", "export", "-c", ckpt, "-o", str(out)], check=True,
                   capture_output=True)
    with pytest.raises(UserError, match="--sampling is not supported by the ctranslate2 engine"):
        Translator(str(out), sampling="topk", topk=3)
    with pytest.raises(UserError, match="--sampling is not supported by the ctranslate2 engine"):
        Translator(str(out)).translate(["el gato"], sampling="topp")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        paragraph = re.search(r"^- \*\*Sampling\*\*.*?(?=^- )", f.read(), re.S | re.M).group(0)
    paragraph = " ".join(paragraph.split())
    assert "`--engine ctranslate2` refuses `--sampling`" in paragraph, paragraph
    assert "reproducible with" not in paragraph, paragraph


@pytest.mark.slow
def test_import_nmt_does_not_import_torch():
    """`import nmt` and `from nmt import Translator` stay light: torch loads with the first model."""
    code = "import sys; from nmt import Translator; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("options", [{"beam_size": 1}, {"beam_size": 3, "nbest": 2},
                                     {"sampling": "topk", "topk": 4, "nbest": 2, "seed": 5}],
                         ids=["greedy", "beam", "sampling"])
def test_on_line_hands_each_line_over_as_soon_as_it_is_final(ckpt, options):
    """Translator.translate(on_line=...) (issue 58: streamed answers): each line's result once, equal to the
    one returned; with EOS held back (min_len) every sentence runs to its own limit (max_len_a 1), so the
    short lines come while the longest is still being searched (counted in cancel() calls, one per step)."""
    from nmt import Translator

    translator = Translator(ckpt, workers=1)
    words = make_pairs(40, 7)[0][0].split() * 3
    lines = [" ".join(words[:12]), words[0], "", " ".join(words[:6]), " ".join(words[:3])]
    steps, got = [], {}
    options = dict(min_len=100, max_len_a=1.0, max_len_b=1, batch_tokens=1000, max_batch_size=16, **options)

    def on_line(i, result):
        assert i not in got
        got[i] = (result, len(steps))

    results = translator.translate(lines, cancel=lambda: steps.append(1) and False, on_line=on_line, **options)
    assert results == translator.translate(lines, **options)
    assert sorted(got) == list(range(len(lines))) and all(got[i][0] == results[i] for i in got)
    assert got[2][1] == 0 and got[1][1] < got[4][1] < got[3][1] < got[0][1] == len(steps)  # by length


@pytest.mark.parametrize("constrain", ["always", "missing"])
def test_on_line_with_a_glossary_gives_each_line_once_as_returned(ckpt, lines, constrain):
    """on_line through a glossary's searches (nmt/translation/line_terms.py): lines without terms as they
    leave the free search, lines with terms as they leave the constrained one (or, kept by `missing`, after
    the free search): each once, equal to the result returned."""
    from nmt import Translator

    translator = Translator(ckpt, workers=1)
    glossary = [(lines[0].split()[0], "moon"), (lines[3].split()[-1], "sun")]
    got: dict = {}
    results = translator.translate(lines, glossary=glossary, glossary_constrain=constrain, beam_size=2,
                                   on_line=lambda i, r: got.setdefault(i, []).append(r))
    assert results == translator.translate(lines, glossary=glossary, glossary_constrain=constrain, beam_size=2)
    assert sorted(got) == list(range(len(lines))) and all(got[i] == [results[i]] for i in got)


def test_calls_made_while_another_is_mid_search_join_its_steps_and_give_what_they_give_alone(tmp_path, lines):
    """Translator calls with one decode worker, from several threads, join their decoding steps (issue 58;
    nmt/search/joining.py): a long call runs 40 steps; at its 3rd step, calls with beam search and prefixes,
    sampling and a glossary start. Every call gives the texts (and, to rounding, the scores) it gives alone,
    and the pool ran steps that served several calls at once."""
    from nmt import Translator

    translator = Translator(make_tiny_checkpoint(str(tmp_path / "long.pt"), max_positions=64), workers=1)
    calls = {"beam": dict(lines=lines[:5], prefixes=["the", "", "a", "", "el"], beam_size=3, nbest=2),
             "sample": dict(lines=lines[5:], line_numbers=range(5, 5 + len(lines[5:])), sampling="topk", topk=4,
                            seed=3),
             "glossary": dict(lines=lines, glossary=[(lines[0].split()[0], "moon")], beam_size=2)}
    long_call = dict(lines=lines[:2], min_len=40, max_len_a=0, max_len_b=40)
    alone = {k: translator.translate(**kw) for k, kw in {**calls, "long": long_call}.items()}
    translator._engine.steps.wait = 30.0  # (a step waits for every call in the pool: the joins do not depend on timing)
    got, threads, steps = {}, [], []

    def run(k: str) -> None:
        got[k] = translator.translate(**calls[k])

    def at_step() -> bool:
        steps.append(1)
        if len(steps) == 3:
            threads.extend(threading.Thread(target=run, args=(k,)) for k in calls)
            for t in threads:
                t.start()
            deadline = time.monotonic() + 30
            while translator._engine.steps.members < 2 and time.monotonic() < deadline:  # one of them joined
                time.sleep(0.001)
        return False

    got["long"] = translator.translate(**long_call, cancel=at_step)
    for t in threads:
        t.join()
    for k, results in alone.items():
        assert [[h.text for h in r.hypotheses] for r in got[k]] == [[h.text for h in r.hypotheses] for r in results], k
        assert [r.score for r in got[k]] == pytest.approx([r.score for r in results], abs=1e-4), k
    assert translator._engine.steps.joined > 0 and translator._engine.steps.members == 0


@pytest.mark.parametrize("options", [{"beam_size": 3, "nbest": 2},
                                     {"sampling": "topk", "topk": 4, "nbest": 2, "seed": 5}], ids=["beam", "sampling"])
def test_a_call_of_more_rows_than_a_step_joins_is_searched_in_parts_at_once(ckpt, options, monkeypatch):
    """With parallel steps (`Translator.parallel_steps`, `nmt serve` on CPU), a call whose batch has more rows
    than a step joins (40 lines x 3 beams or 2 samples > 64 rows) is searched in two parts at once, each in its own
    thread and a member of the pool of its own: both are in the pool together (each waits at its 2nd step, at
    most 30 s, for the other), the results and on_line's lines are those of the call without parallel steps
    (texts; scores to rounding) and on_line's come from the parts' threads; when one part fails its error is the
    call's, not the other part's stop, and both leave the pool."""
    from nmt import Translator

    translator = Translator(ckpt, workers=1)
    pool = translator._engine.steps
    src = [p[0] for p in make_pairs(40, 11)]
    options = dict(min_len=8, max_len_a=0, max_len_b=8, batch_tokens=10_000, max_batch_size=64, **options)
    want = translator.translate(src, **options)
    assert translator.parallel_steps(2)
    calls: dict[int, int] = {}
    seen: list[int] = []

    def at_step() -> bool:
        me = threading.get_ident()
        calls[me] = calls.get(me, 0) + 1
        if calls[me] == 2:  # a member now (after its first step): wait for the other part
            deadline = time.monotonic() + 30
            while pool.members < 2 and time.monotonic() < deadline:
                time.sleep(0.001)
        seen.append(pool.members)
        return False

    got: dict = {}
    threads: set[int] = set()

    def on_line(i, result) -> None:
        threads.add(threading.get_ident())
        got.setdefault(i, []).append(result)

    results = translator.translate(src, cancel=at_step, on_line=on_line, **options)
    assert [[h.text for h in r.hypotheses] for r in results] == [[h.text for h in r.hypotheses] for r in want]
    assert [h.score for r in results for h in r.hypotheses] == \
        pytest.approx([h.score for r in want for h in r.hypotheses], abs=1e-4)  # (other batches: rounding)
    assert len(calls) == 2 and max(seen) == 2
    assert sorted(got) == list(range(len(src))) and all(got[i] == [results[i]] for i in got)
    assert threading.get_ident() not in threads and threads <= set(calls)  # (as each part's sentences end)
    search = TorchEngine.search
    lengths = [len(ids) for ids in translator._engine.tokenizer.encode_src(src)]
    first = lengths.index(max(lengths))  # the first line of the batch (longest first, then in input order)
    for in_first_part in (True, False):  # one part fails at its 4th step; the other is stopped at its 5th
        raised = threading.Event()

        def failing(engine, src_ids, options, inputs, cancel, on_final, in_first_part=in_first_part):
            fails, steps = (first in inputs.keys) == in_first_part, []

            def stop() -> bool:
                steps.append(1)
                at_step()  # (at its 2nd step each part waits for the other to be in the pool)
                if fails and len(steps) == 4:
                    raised.set()
                    raise RuntimeError("boom")
                if not fails and len(steps) == 5:  # the other part: once it failed, stopped here (Cancelled)
                    raised.wait(30)
                    deadline = time.monotonic() + 30
                    while not cancel() and time.monotonic() < deadline:
                        time.sleep(0.001)
                return cancel()
            return search(engine, src_ids, options, inputs, stop, on_final)

        seen.clear()
        calls.clear()
        monkeypatch.setattr(TorchEngine, "search", failing)
        with pytest.raises(RuntimeError, match="boom"):
            translator.translate(src, **options)
        monkeypatch.undo()
        assert max(seen) == 2 and pool.members == 0  # (both parts were in the pool, and left it)
    assert translator.parallel_steps(1) and translator.translate(src, **options) == want  # (the same batches)
