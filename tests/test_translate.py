"""nmt.translation.translate: batching never changes results, order and alignment are kept,
truncation is counted once, n-best format, file/stdin/pipe modes, averaging.

The model is an untrained tiny Transformer saved with a real tokenizer through
checkpoint.py, so the whole load -> encode -> search -> decode path runs.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import re
import subprocess
import sys
import threading
import time

import pytest
import torch

from nmt.translation import batching
from nmt.translation import translate as tr
from nmt.model.checkpoint import load_checkpoint, load_for_inference
from nmt.commands import translate as tc
from nmt.commands.average import AverageOptions, average_command
from nmt.commands.evaluate import EvaluateOptions, evaluate_command
from nmt.config import ConfigError, DecodeConfig, decode_config
from nmt.device import resolve_workers
from nmt.translation.torch_engine import TorchEngine
from nmt.errors import UserError
from nmt.evaluation.metrics import corpus_metrics
from nmt.textio import read_lines
from nmt.search import SearchOptions, beam_search, greedy_search
from helpers import make_pairs, make_tiny_checkpoint
from helpers import ROOT

MAX_POSITIONS = 24  # sources longer than 23 tokens are truncated
NBEST_LINE = re.compile(r"^(\d+) \|\|\| (.*) \|\|\| (-?\d+\.\d{4})$")


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def loaded(ckpt):
    """The engine `nmt translate` uses (on CPU: with the CPU fast paths)."""
    return TorchEngine.load(ckpt)


def texts(results):
    """[(text, score)] per line, from translate_nbest's Translations."""
    return [[(t.text, t.score) for t in r] for r in results]


def long_line(n_words: int, seed: int) -> str:
    words = " ".join(p[0] for p in make_pairs(20, seed)).split()
    return " ".join(words[:n_words])


def mixed_lines() -> list[str]:
    """Shuffled lengths, empty and blank lines, lines over the model's maximum."""
    rng = random.Random(3)
    lines = [p[0] for p in make_pairs(14, 7)]
    lines += ["", "   ", long_line(40, 1), long_line(30, 2), "el sol", "la luna"]
    rng.shuffle(lines)
    return lines


def collect() -> tuple[list[str], callable]:
    messages: list[str] = []
    return messages, messages.append


# --------------------------------------------------------------------------- library

def test_make_batches_budget_cap_and_coverage():
    rng = random.Random(0)
    lengths = [rng.randint(1, 40) for _ in range(200)] + [100]
    batches = batching.make_batches(lengths, batch_tokens=64, max_batch_size=5)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(lengths)))  # every sentence exactly once
    assert [lengths[i] for i in flat] == sorted(lengths, reverse=True)  # longest first
    for b in batches:
        width = max(lengths[i] for i in b)
        assert len(b) <= 5
        assert len(b) * width <= 64 or len(b) == 1  # only a lone over-long sentence may exceed
    assert batches[0] == [len(lengths) - 1]


@pytest.mark.parametrize("beam", [1, 2])
def test_batching_and_order_do_not_change_results(loaded, beam):
    engine = loaded
    lines = mixed_lines()
    decode = decode_config(engine.decode, dict(beam_size=beam))
    batched = texts(tr.translate_nbest(engine, lines, decode, warn=lambda m: None))
    one_batch = texts(tr.translate_nbest(engine, lines, decode_config(decode, dict(batch_tokens=10**6)),
                                         warn=lambda m: None))
    alone = [texts(tr.translate_nbest(engine, [line], decode, warn=lambda m: None))[0] for line in lines]
    assert len(batched) == len(lines)
    scores = [r[0][1] for r, line in zip(alone, lines) if line.strip()]
    assert len(set(scores)) == len(scores)  # distinct per sentence: a misaligned output would show
    for got in (batched, one_batch):
        for line, g, a in zip(lines, got, alone):
            assert [t for t, _ in g] == [t for t, _ in a], line
            assert [s for _, s in g] == pytest.approx([s for _, s in a], abs=1e-4)
    for line, r in zip(lines, batched):
        if not line.strip():
            assert r == [("", 0.0)]
    assert tr.translate_lines(engine, lines, decode, warn=lambda m: None) == \
        [r[0][0] for r in batched]


@pytest.mark.parametrize("beam", [1, 2])
def test_workers_give_the_sequential_results(loaded, beam, monkeypatch):
    """decode.workers > 1 runs batches in a thread pool with torch threads / workers intra-op threads
    each: the same n-best texts and scores, in the same order, and the thread count is restored."""
    engine = loaded
    lines = mixed_lines() * 2
    decode = decode_config(engine.decode, dict(beam_size=beam, nbest=beam, workers=1))
    assert len(batching.make_batches([6] * len(lines), decode.batch_tokens, decode.max_batch_size)) >= 4
    seen = []  # (thread name, intra-op threads) of each batch
    real = engine.search_batch

    def spy(*args, **kwargs):
        seen.append((threading.current_thread().name, torch.get_num_threads()))
        return real(*args, **kwargs)

    monkeypatch.setattr(engine, "search_batch", spy)
    sequential = tr.translate_nbest(engine, lines, decode, warn=lambda m: None)
    assert {name for name, _ in seen} == {threading.current_thread().name}
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        seen.clear()
        parallel = tr.translate_nbest(engine, lines, decode_config(decode, dict(workers=2)), warn=lambda m: None)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert parallel == sequential
    assert all(name.startswith("nmt-decode") and threads == 1 for name, threads in seen)
    with pytest.raises(ConfigError, match="workers"):
        decode_config(decode, dict(workers=-1))


def test_auto_workers(loaded, monkeypatch):
    """decode.workers 0 (the default) = 2 workers on a CPU with at least 2 threads, else 1 (also on GPU)."""
    engine = loaded
    assert DecodeConfig().workers == 0
    assert resolve_workers(0, "cpu", threads=2) == 2 and resolve_workers(0, "cpu", threads=16) == 2
    assert resolve_workers(0, "cpu", threads=1) == 1 and resolve_workers(0, "cuda", threads=8) == 1
    assert resolve_workers(3, "cpu", threads=1) == 3
    lines = mixed_lines() * 2
    decode = decode_config(engine.decode, dict(workers=0))
    seen = []
    real = engine.search_batch
    monkeypatch.setattr(engine, "search_batch",
                        lambda *a, **k: seen.append(threading.current_thread().name) or real(*a, **k))
    before = torch.get_num_threads()
    try:
        for threads, pooled in ((1, False), (2, True)):
            torch.set_num_threads(threads)
            seen.clear()
            out = tr.translate_nbest(engine, lines, decode, warn=lambda m: None)
            assert all(name.startswith("nmt-decode") == pooled for name in seen) and len(seen) >= 4
            assert torch.get_num_threads() == threads
            if threads == 1:
                first = out
        assert out == first
        seen.clear()  # 5 lines in batches of at most 4: one batch of 4 and one of 1 cannot be shared out evenly
        five = [p[0] for p in make_pairs(5, 11)]
        tr.translate_nbest(engine, five, decode_config(decode, dict(max_batch_size=4, batch_tokens=10_000)), warn=lambda m: None)
        assert seen == [threading.current_thread().name] * 2
    finally:
        torch.set_num_threads(before)


def test_run_batches_shares_work_out_by_cost():
    """With costs, the pool takes the largest batches first, and batches that cannot be shared out
    evenly (one large, one small) run one at a time in the calling thread, with all threads."""
    assert not batching._balanced([97, 3], 2) and not batching._balanced([97, 97, 97, 3], 2)
    assert batching._balanced([5] * 16, 2) and batching._balanced([10, 9, 8, 7, 6, 5], 2) and batching._balanced([1], 1)
    lock, started = threading.Lock(), []

    def record(batch):
        with lock:
            started.append((batch[0], threading.current_thread().name))
        time.sleep(0.01)
        return batch[0]

    batches = [[i] for i in range(8)]
    costs = [10 + i for i in range(8)]  # the last batches are the largest
    assert list(batching.run_batches(record, batches, 2, costs=costs)) == [(b, b[0]) for b in batches]
    assert {i for i, _ in started[:2]} == {7, 6} and all(name.startswith("nmt-decode") for _, name in started)
    started.clear()
    assert list(batching.run_batches(record, [[0], [1]], 2, costs=[97, 3])) == [([0], 0), ([1], 1)]
    assert [name for _, name in started] == [threading.current_thread().name] * 2


def test_run_batches_keeps_order_and_propagates_errors():
    batches = [[i] for i in range(12)]

    def slow_first(batch):  # early batches finish last: results must still come back in order
        time.sleep(0.002 * (12 - batch[0]))
        return batch[0] * 10

    assert list(batching.run_batches(slow_first, batches, 3)) == [(b, b[0] * 10) for b in batches]
    assert list(batching.run_batches(slow_first, batches, 1)) == [(b, b[0] * 10) for b in batches]

    def fails(batch):
        if batch[0] == 2:
            raise RuntimeError("batch 2 failed")
        return batch[0]

    threads_before = threading.active_count()
    got = []
    with pytest.raises(RuntimeError, match="batch 2 failed"):
        with contextlib.closing(batching.run_batches(fails, batches, 2)) as done:
            for batch, result in done:
                got.append(result)
    assert got == [0, 1]
    assert threading.active_count() == threads_before  # the pool is shut down, nothing left running


def test_truncation_counted_once_and_equals_manual_truncation(loaded):
    engine = loaded
    tokenizer = engine.tokenizer
    lines = mixed_lines()
    limit = MAX_POSITIONS - 1
    n_long = sum(len(ids) > limit for ids in tokenizer.encode_src(lines))
    assert n_long == 2
    messages, warn = collect()
    out = tr.translate_lines(engine, lines, engine.decode, warn=warn)
    assert len(messages) == 1 and f"{n_long} input lines" in messages[0] and str(limit) in messages[0]
    # A truncated line translates like its first `limit` tokens (word model: one token per word).
    i = lines.index(long_line(40, 1))
    head = " ".join(lines[i].split()[:limit])
    assert len(tokenizer.encode_src([head])[0]) == limit
    messages, warn = collect()
    assert tr.translate_lines(engine, [head], engine.decode, warn=warn) == [out[i]]
    assert messages == []


def test_decode_config_overrides_and_errors(loaded):
    """One validated construction for every source of decode settings: command-line strings,
    library values, CTranslate2 metadata; errors name the key, all at once."""
    engine = loaded
    d = decode_config(engine.decode, dict(beam_size="4", nbest=3, batch_tokens="7", max_len_a="2", max_len_b=9,
                                          min_len=1, length_penalty="0.5", length_penalty_type="average"))
    assert (d.beam_size, d.nbest, d.batch_tokens, d.max_len_a, d.max_len_b, d.min_len, d.length_penalty,
            d.length_penalty_type) == (4, 3, 7, 2.0, 9, 1, 0.5, "average")
    assert decode_config(engine.decode) == engine.decode
    assert decode_config(engine.decode, dict(nbest=None)) == engine.decode  # None = not given
    with pytest.raises(ConfigError, match="nbest"):
        decode_config(engine.decode, dict(beam_size=1, nbest=2))
    with pytest.raises(ConfigError) as e:
        decode_config(engine.decode, dict(beam_size=0, length_penalty="nan", length_penalty_type="long", bogus=1))
    assert len(e.value.errors) == 4 and "decode.beam_size" in e.value.errors[0]
    assert decode_config({"beam_size": 3}).beam_size == 3  # a raw mapping (export metadata)


def test_translations_equal_direct_search(loaded):
    """The pipeline's output is the search's own result, detokenized: each sentence searched alone
    with greedy_search / beam_search on x + EOS (an independent reference for batching, workers,
    ordering, fast paths)."""
    engine = loaded
    lines = [p[0] for p in make_pairs(12, 5)]
    model, tok = engine.model, engine.tokenizer
    for beam in (1, 3):
        decode = decode_config(engine.decode, dict(beam_size=beam, nbest=beam, workers=2))
        got = tr.translate_nbest(engine, lines, decode)
        for line, hyps in zip(lines, got):
            src = torch.tensor([tok.encode_src([line])[0] + [3]])
            options = SearchOptions(beam_size=beam, nbest=beam, max_len_a=decode.max_len_a, max_len_b=decode.max_len_b)
            strategy = greedy_search if beam == 1 else beam_search
            ref = strategy(model, src, src != 0, options)[0]
            assert [h.text for h in hyps] == tok.decode_tgt([r.tokens for r in ref])
            assert [h.score for h in hyps] == pytest.approx([r.score for r in ref], abs=1e-5)
            assert [h.finished for h in hyps] == [r.finished for r in ref]


def test_output_lines_never_break():
    """Every character str.splitlines() splits on, and NUL, becomes a space (U+0085 NEL included)."""
    from nmt.textio import one_line

    breaks = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029\x00"
    text = "a" + "b".join(breaks) + "c"
    assert len(one_line(text).splitlines()) == 1 and "\x00" not in one_line(text)
    assert one_line("plain text") == "plain text"
    for ch in map(chr, range(0x3000)):  # any other splitting character would be caught here
        if len(("x" + ch + "y").splitlines()) > 1:
            assert ch in breaks


# --------------------------------------------------------------------------- command

def test_command_files_progress_and_warning(ckpt, loaded, tmp_path):
    engine = loaded
    lines = mixed_lines()
    src = tmp_path / "in.txt"
    src.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    expected = tr.translate_lines(engine, lines, engine.decode, warn=lambda m: None)
    for quiet in (False, True):
        out, err = tmp_path / f"out{quiet}.txt", io.StringIO()
        assert tc.translate_command(tc.TranslateOptions(ckpt, str(src), str(out), device="cpu",
                                                        quiet=quiet), stderr=err) == 0
        assert out.read_bytes().decode("utf-8").split("\n") == expected + [""]
        warnings = [x for x in err.getvalue().splitlines() if "truncated" in x]
        if quiet:
            assert err.getvalue() == ""
        else:
            assert len(warnings) == 1 and "2 input lines" in warnings[0]
            assert "sent" in err.getvalue()  # the tqdm bar (unit "sent") went to stderr


def test_a_stray_carriage_return_in_a_file_line_is_read_as_a_space(ckpt, tmp_path, capsys):
    """Lines are split on "\\n" only, so a file line may hold a stray "\\r"; nmt.Translator refuses line breaks
    in a line (issue 59 item 10), and the commands that read files pass it on as the space the tokenizer
    reads it as: the same outputs and scores as with a space, exit 0."""
    from nmt.cli import main

    files = {}
    for name, sep in (("cr", "\r"), ("space", " ")):
        files[name] = (tmp_path / f"{name}.es", tmp_path / f"{name}.en")
        files[name][0].write_bytes(f"el perro{sep}come\nla casa\n".encode())
        files[name][1].write_bytes(f"the dog{sep}eats\nthe house\n".encode())
    outputs = {}
    for name, (src, tgt) in files.items():
        for command in (["translate", "-c", ckpt, "-i", str(src), "-q"], ["score", "-c", ckpt, "--src", str(src),
                        "--tgt", str(tgt), "-q"], ["evaluate", "-c", ckpt, "--src", str(src), "--ref", str(tgt), "-q"]):
            code = main(command)
            captured = capsys.readouterr()
            assert code == 0, captured.err
            outputs.setdefault(name, []).append(captured.out.replace(str(src), "SRC").replace(str(tgt), "TGT"))
    assert outputs["cr"] == outputs["space"]


def test_command_reads_gzip_input(ckpt, loaded, tmp_path):
    import gzip

    engine = loaded
    lines = mixed_lines()
    src = tmp_path / "in.txt.gz"
    with gzip.open(src, "wt", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))
    expected = tr.translate_lines(engine, lines, engine.decode, warn=lambda m: None)
    out = tmp_path / "out.txt"
    assert tc.translate_command(tc.TranslateOptions(ckpt, str(src), str(out), device="cpu", quiet=True)) == 0
    assert out.read_text(encoding="utf-8").split("\n") == expected + [""]


def test_command_stdin_chunks_and_nbest_format(ckpt, loaded):
    engine = loaded
    lines = mixed_lines()
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    decode = decode_config(engine.decode, dict(beam_size=2, nbest=2))
    expected = texts(tr.translate_nbest(engine, lines, decode, warn=lambda m: None))
    outputs = []
    for chunk_lines in (3, tc.CHUNK_LINES):  # order and indices survive chunked streaming
        out, err = io.BytesIO(), io.StringIO()
        opts = tc.TranslateOptions(ckpt, device="cpu", overrides={"beam_size": "2", "nbest": "2"},
                                   chunk_lines=chunk_lines)
        tc.translate_command(opts, stdin=io.BufferedReader(io.BytesIO(data)), stdout=out, stderr=err)
        assert "sent" not in err.getvalue()  # no progress bar when reading stdin
        assert err.getvalue().count("truncated") == 1
        outputs.append(out.getvalue().decode("utf-8"))
    chunked, whole = (out.splitlines() for out in outputs)  # texts equal, scores to float rounding (padding)
    assert [NBEST_LINE.match(r).group(1, 2) for r in chunked] == [NBEST_LINE.match(r).group(1, 2) for r in whole]
    assert [float(NBEST_LINE.match(r).group(3)) for r in chunked] == pytest.approx(
        [float(NBEST_LINE.match(r).group(3)) for r in whole], abs=2e-4)
    rows = outputs[0].splitlines()
    assert len(rows) == 2 * len(lines)
    for k, row in enumerate(rows):
        m = NBEST_LINE.match(row)
        assert m, row
        i, j = divmod(k, 2)
        assert int(m.group(1)) == i
        assert m.group(2) == expected[i][j][0]
        assert float(m.group(3)) == pytest.approx(expected[i][j][1], abs=1e-4)
    for i in range(len(lines)):
        assert float(NBEST_LINE.match(rows[2 * i]).group(3)) >= float(NBEST_LINE.match(rows[2 * i + 1]).group(3))


def test_command_errors(ckpt, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes("uno\ndos\n".encode() + b"tr\xe9s\n")
    one = {"beam_size": 1}
    with pytest.raises(UserError, match="line 3: invalid UTF-8"):
        tc.translate_command(tc.TranslateOptions(ckpt, str(bad), str(tmp_path / "o.txt"), device="cpu", overrides=one))
    assert not os.path.exists(tmp_path / "o.txt") and os.listdir(tmp_path) == ["bad.txt"]  # no half output, no temp
    with pytest.raises(UserError, match="file not found"):
        tc.translate_command(tc.TranslateOptions(ckpt, str(tmp_path / "nope.txt"), None, overrides=one))
    with pytest.raises(UserError, match="not found"):
        tc.translate_command(tc.TranslateOptions(str(tmp_path / "nope.pt"), None, None, overrides=one))
    with pytest.raises(UserError, match="same file"):
        tc.translate_command(tc.TranslateOptions(ckpt, str(bad), str(bad), overrides=one))
    assert bad.read_bytes().endswith(b"tr\xe9s\n")  # the input was not clobbered
    with pytest.raises(ConfigError, match="decode.beam_size"):
        tc.translate_command(tc.TranslateOptions(ckpt, str(bad), None, overrides={"beam_size": "many"}))


@pytest.mark.slow
def test_cli_pipe_mode(ckpt, loaded):
    engine = loaded
    lines = [p[0] for p in make_pairs(6, 11)] + ["", "el sol ve la luna"]
    decode = decode_config(engine.decode, dict(beam_size=1))
    expected = tr.translate_lines(engine, lines, decode)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
    proc = subprocess.run([sys.executable, "-m", "nmt", "translate", "--checkpoint", ckpt, "--beam", "1",
                           "--device", "cpu"], input="".join(x + "\n" for x in lines).encode(),
                          capture_output=True, cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.decode("utf-8").split("\n") == expected + [""]
    assert b"sent" not in proc.stderr


# --------------------------------------------------------------------------- average, evaluate

def test_average_command_equals_manual_average(tmp_path):
    a = make_tiny_checkpoint(str(tmp_path / "a.pt"), seed=1)
    b = make_tiny_checkpoint(str(tmp_path / "b.pt"), seed=2)
    out = str(tmp_path / "avg.pt")
    assert average_command(AverageOptions([a, b], out, quiet=True)) == 0
    sa, sb, avg = (load_checkpoint(p)["model"] for p in (a, b, out))
    assert avg.keys() == sa.keys()
    differing = 0
    for k in sa:
        if sa[k].is_floating_point():
            expected = (sa[k].double() + sb[k].double()) / 2
            assert torch.allclose(avg[k].double(), expected, atol=1e-7), k
            differing += not torch.equal(sa[k], sb[k])
    assert differing > 0  # the two checkpoints really differ
    model, tokenizer, cfg = load_for_inference(out)
    assert len(tr.translate_lines(TorchEngine.load(out, "cpu"), ["el sol", ""])) == 2
    with pytest.raises(UserError, match="not found"):
        average_command(AverageOptions([a, str(tmp_path / "missing.pt")], out, quiet=True))


def test_evaluate_command_translates_then_scores(ckpt, loaded, tmp_path):
    engine = loaded
    pairs = make_pairs(8, 21)
    src, ref, saved = tmp_path / "src.es", tmp_path / "ref.en", tmp_path / "hyp.en"
    src.write_text("".join(p[0] + "\n" for p in pairs), encoding="utf-8")
    ref.write_text("".join(p[1] + "\n" for p in pairs), encoding="utf-8")
    out = io.StringIO()
    evaluate_command(EvaluateOptions(None, str(ref), checkpoint=ckpt, src=str(src), save_hyps=str(saved),
                                     json_out=True, device="cpu", overrides={"beam_size": 1}, quiet=True), stdout=out)
    hyps = read_lines(str(saved))
    assert hyps == tr.translate_lines(engine, [p[0] for p in pairs], decode_config(engine.decode, dict(beam_size=1)))
    obj = json.loads(out.getvalue())
    assert (obj["hyp"], obj["src"], obj["checkpoint"], obj["n_sentences"]) == (str(saved), str(src), ckpt, 8)
    expected = corpus_metrics(hyps, [p[1] for p in pairs])
    assert obj["bleu"]["score"] == expected["bleu"]["score"] and obj["chrf"]["score"] == expected["chrf"]["score"]
    ref.write_text("one line\n", encoding="utf-8")
    with pytest.raises(UserError, match=f"8 lines in {src}.* 1 in {ref}"):
        evaluate_command(EvaluateOptions(None, str(ref), checkpoint=ckpt, src=str(src), device="cpu",
                                         quiet=True), stdout=out)
