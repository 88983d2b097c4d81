"""The benchmark scripts that BENCHMARKS.md cites keep working: run them end to end on tiny
inputs and check what they count (not how fast anything is: timings are never asserted).

- bench_decode with --force-len N must decode exactly N tokens per sentence on every path
  (greedy, beam, cached, uncached and CTranslate2), since equal work is the point of the flag.
- bench_train must count exactly the real target tokens of the batches it timed.
- bench_data must generate exactly N pairs, each copy of the Bible text different from the
  original, and prepare all of them (every pair read and counted).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from helpers import tiny_config_dict
from helpers import make_pairs, make_tiny_checkpoint
from helpers import ROOT

SCRIPTS = os.path.join(ROOT, "scripts")


def run_script(name: str, *args: str) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run([sys.executable, os.path.join(SCRIPTS, name), *args], check=True, env=env, capture_output=True,
                   text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_bench_decode_forces_equal_work_on_every_path(tmp_path, workers):
    ckpt = make_tiny_checkpoint(str(tmp_path / "tiny.pt"))
    src = tmp_path / "in.es"
    src.write_text("el perro rojo ve la casa\nla luna\n\nel gato come y el sol ve el rio\nla flor\nel libro viejo\n",
                   encoding="utf-8")
    out = tmp_path / "out.json"
    args = ["--checkpoint", ckpt, "--input", str(src), "--sentences", "0", "--force-len", "5", "--batch-sizes", "2", "32",
            "--beams", "1", "3", "--uncached-sentences", "3", "--threads", str(workers), "--workers", str(workers),
            "--json", str(out)]
    if workers > 1:
        args.append("--whole-command")  # `nmt translate --workers 2` end to end
    try:
        import ctranslate2  # noqa: F401
        export_dir = tmp_path / "ct2"
        subprocess.run([sys.executable, "-m", "nmt", "export", "-c", ckpt, "-o", str(export_dir)], check=True,
                       capture_output=True, text=True, timeout=300)
        args += ["--ct2-model", str(export_dir)]
        ct2 = True
    except ImportError:  # the CTranslate2 rows are then absent (checked below)
        ct2 = False
    run_script("bench_decode.py", *args)
    res = json.loads(out.read_text())
    rows = res["results"]
    n = 5  # non-blank lines
    ct2_rows = [r for r in rows if r.get("engine", "").startswith("ctranslate2")]
    nmt_rows = [r for r in rows if r not in ct2_rows]
    # greedy/beam x cached at both batch sizes + uncached at 32 (the speed-up compares batch 32)
    assert sorted((r["beam"], r["cache"], r["batch"]) for r in nmt_rows) == \
        sorted([(b, True, bs) for b in (1, 3) for bs in (2, 32)] + [(b, False, 32) for b in (1, 3)])
    for r in nmt_rows:
        assert r["tokens"] == 5 * r["sentences"], r
        assert r["sentences"] == (n if r["cache"] else 3)
        assert r["sent_per_s"] > 0 and r["tok_per_s"] > 0
    assert len(ct2_rows) == (4 if ct2 else 0)
    for r in ct2_rows:
        assert r["tokens"] == 5 * n, r
    assert set(res["cache_speedup"]) == {"beam1", "beam3"}
    assert res["workers"] == workers and all(r["workers"] == workers for r in rows)
    assert set(res["whole_command"]) == ({"beam1", "beam3"} if workers > 1 else set())


@pytest.mark.slow
def test_bench_train_counts_the_real_target_tokens(tmp_path):
    raw = tiny_config_dict(tmp_path)
    cfg_path = tmp_path / "tiny.yaml"
    cfg_path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    out = tmp_path / "train.json"
    work = tmp_path / "work"
    run_script("bench_train.py", "--config", str(cfg_path), "--steps", "3", "--warmup", "1", "--threads", "1",
               "--workdir", str(work), "--json", str(out))
    res = json.loads(out.read_text())
    assert res["steps"] == 3 and res["cpu_tuning"] is True
    assert 0 < res["padding_efficiency"] <= 1 and 0 < res["mfu"] < 1.5

    # independent count: the same batches (epoch 1; one warm-up step, then 3 timed ones) from the
    # corpus' token lengths (+1 each for EOS), not from the collated tensors the script reads
    from nmt.config import load_config
    from nmt.data.batches import epoch_batches
    from helpers import prepare_data

    cfg = load_config(str(cfg_path))
    _, data = prepare_data(cfg, str(work), lambda m: None)
    batches = epoch_batches(data.train, cfg, 1)[1:4]
    real_tgt = sum(int(data.train.tgt_lens[b].sum()) + len(b) for b in batches)
    timed_tokens = res["tgt_tok_per_s"] * res["step_time_s"] * res["steps"]
    assert timed_tokens == pytest.approx(real_tgt, rel=1e-6)


@pytest.mark.slow
def test_bench_ct2_times_each_engine_in_its_own_process(tmp_path):
    pytest.importorskip("ctranslate2", reason="bench_ct2 needs the [ct2] extra")
    ckpt = make_tiny_checkpoint(str(tmp_path / "tiny.pt"))
    src = tmp_path / "in.es"
    src.write_text("el perro rojo ve la casa\nla luna\nel gato come y el sol ve el rio\nla flor\n", encoding="utf-8")
    out = tmp_path / "ct2.json"
    run_script("bench_ct2.py", "--checkpoint", ckpt, "--input", str(src), "--sentences", "0", "--beams", "1", "2",
               "--batch-sizes", "1", "3", "--force-len", "4", "--repeats", "1", "--threads", "1", "--patience", "0", "1",
               "--length-penalty-type", "average",
               "--json", str(out))
    res = json.loads(out.read_text())
    rows = res["results"]
    engines = [("nmt (PyTorch)", "fp32"), ("nmt (PyTorch)", "int8"), ("CTranslate2", "float32"), ("CTranslate2", "int8")]
    assert [(r["engine"], r["weights"]) for r in rows] == engines * 6
    assert [(r["beam"], r["batch"], r["patience"]) for r in rows[::4]] == \
        [(1, 1, None), (1, 3, None), (2, 1, 0.0), (2, 1, 1.0), (2, 3, 0.0), (2, 3, 1.0)]
    assert all(r["sentences"] == 4 and r["sent_per_s"] > 0 and r["peak_rss_mb"] > 0 for r in rows)
    assert all(r["same_as_nmt"] == 1.0 and r["vs_nmt"] == 1.0 for r in rows[::4])
    assert all(r["target_tokens"] == 16 for r in rows)  # forced: 4 tokens per sentence on every engine
    assert res["force_len"] == 4


@pytest.mark.slow
def test_bench_onnx_times_every_engine_on_the_same_work(tmp_path):
    """Six engines (nmt, CTranslate2, onnxruntime; fp32 and int8), each its own process: with --force-len every
    engine decodes exactly 4 tokens per line, and the fp32 ones give nmt's outputs."""
    pytest.importorskip("ctranslate2", reason="bench_onnx needs the [ct2] extra")
    pytest.importorskip("onnxruntime", reason="bench_onnx needs the [onnx] extra")
    ckpt = make_tiny_checkpoint(str(tmp_path / "tiny.pt"), norm="post")
    src = tmp_path / "in.es"
    src.write_text("el perro rojo ve la casa\nla luna\nel gato come y el sol ve el rio\nla flor\n", encoding="utf-8")
    out = tmp_path / "onnx.json"
    run_script("bench_onnx.py", "--checkpoint", ckpt, "--input", str(src), "--ref", str(src), "--sentences", "0",
               "--batch-size", "3", "--force-len", "4", "--repeats", "1", "--threads", "1", "--json", str(out))
    res = json.loads(out.read_text())
    rows = res["results"]
    assert [(r["engine"], r["weights"]) for r in rows] == [
        ("nmt (PyTorch)", "fp32"), ("nmt (PyTorch)", "int8"), ("CTranslate2", "float32"), ("CTranslate2", "int8"),
        ("onnxruntime", "fp32"), ("onnxruntime", "int8")]
    assert all(r["sentences"] == 4 and r["target_tokens"] == 16 and r["peak_rss_mb"] > 0 for r in rows)
    assert [r["same_as_nmt"] for r in rows[::2]] == [1.0, 1.0, 1.0]
    assert all(r["size_mib"] > 0 for r in rows)
    assert all(r["bleu"] is None for r in rows)  # (forced lengths: no BLEU)


@pytest.mark.slow
def test_bench_data_generates_varied_copies_and_prepares_them(tmp_path):
    import gzip

    out = tmp_path / "data.json"
    run_script("bench_data.py", "--pairs", "30000", "--dir", str(tmp_path), "--gzip", "--max-sentences", "3000",
               "--vocab-size", "500", "--steps", "1", "--skip", "first_step", "--json", str(out))
    res = json.loads(out.read_text())
    bible = {}
    for side in ("es", "en"):
        lines = gzip.open(tmp_path / f"train.{side}.gz", "rt", encoding="utf-8").read().split("\n")[:-1]
        bible[side] = gzip.open(os.path.join(ROOT, "data", "bible-es-en", f"train.{side}.gz"), "rt",
                                encoding="utf-8").read().split("\n")[:-1]
        n = len(bible[side])
        assert len(lines) == 30000 and lines[:n] == bible[side]  # copy 0 is the text itself
        copy1 = lines[n:]
        assert all(a != b.strip() for a, b in zip(copy1, bible[side]))  # copy 1 differs line by line
        assert all(x.endswith(" qb") for x in copy1)
    p = res["prepare"]
    assert p["pairs"] == 30000 and 0 < p["kept"] <= 30000 and p["src_tokens"] > 0
    assert p["peak_rss_gib"] > 0 and p["prepare_s"] >= p["tokenizer_s"] >= p["spm_train_s"] > 0
    assert res["steps"]["step_s"] > 0 and "first_step" not in res


def test_length_report_eos_statistics_match_an_unbatched_reference(tmp_path):
    """nmt.benchmarking.eos_statistics, what scripts/length_report.py reports (teacher-forced EOS
    statistics, BENCHMARKS.md "Quality per CPU-minute"), batched and padded, against each pair scored
    alone: log p(EOS) at the
    reference's end equals the engine's forced-decoding score of that EOS (nmt score's path), and
    the early-EOS figures equal a per-pair recount of the same model's forward pass."""
    import torch

    from nmt.benchmarking import eos_statistics  # what scripts/length_report.py prints
    from nmt.layout import source_tensors
    from nmt.text.tokenizer import BOS_ID, EOS_ID
    from nmt.translation.torch_engine import TorchEngine
    from helpers import make_pairs

    # the position table seed 3 was chosen with (an EOS argmax before the end of a reference)
    tiny = make_tiny_checkpoint(str(tmp_path / "tiny.pt"), seed=3, positions="sinusoidal", position_offset=0)
    engine = TorchEngine.load(tiny, "cpu", fast=False)
    pairs = make_pairs(23, 5)
    src, ref = [p[0] for p in pairs], [p[1] for p in pairs]
    stats = eos_statistics(engine, src, ref, batch=4)  # several padded batches
    xs, ys = engine.tokenizer.encode_src(src), engine.tokenizer.encode_tgt(ref)
    final, early, positions, sentences = [], 0, 0, 0
    with torch.inference_mode():
        for x, y in zip(xs, ys):
            final.append(engine.score_batch([x], [y])[0][-1])
            s, m = source_tensors([x])
            logits = engine.model(s, m, torch.tensor([[BOS_ID] + y]))[0].float()
            logits[:, [0, BOS_ID]] = float("-inf")
            hits = int((logits[:len(y)].argmax(-1) == EOS_ID).sum())
            early, positions, sentences = early + hits, positions + len(y), sentences + (hits > 0)
    assert stats["sentences"] == len(pairs) and 0 < early < positions, (stats, early)  # a case with EOS argmax
    assert abs(stats["final_eos_logp"] - sum(final) / len(final)) < 1e-4
    assert abs(stats["early_eos_argmax"] - early / positions) < 1e-9
    assert abs(stats["sentences_early_argmax"] - sentences / len(pairs)) < 1e-9


@pytest.mark.slow
def test_bench_cache_runs_every_variant_through_the_cache_api(tmp_path):
    """Each variant (including fairseq's torch.cat cache, as a DecoderCache subclass) decodes through
    the cache's own append/advance/reorder."""
    out = tmp_path / "cache.json"
    run_script("bench_cache.py", "--steps", "6", "--batch", "2", "--beam", "2", "--src-len", "5", "--threads", "1",
        "--repeats", "1", "--json", str(out))
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"cached", "cached-rows", "cat", "uncached"}
    assert all(results[v]["total_s"] > 0 for v in ("cached", "cached-rows", "cat"))


@pytest.mark.slow
def test_bench_int8_times_every_shape_on_every_path(tmp_path):
    """scripts/bench_int8.py (BENCHMARKS.md "Lean inference": why int8 does not pay on a small model)."""
    out = tmp_path / "int8.json"
    run_script("bench_int8.py", "--rows", "4", "32", "--calls", "3", "--threads", "1", "--json", str(out))
    res = json.loads(out.read_text())
    rows = res["results"]
    assert [(r["rows"], r["inputs"], r["outputs"]) for r in rows][:2] == [(4, 256, 768), (4, 256, 256)]
    assert len(rows) == 2 * 5 and {r["rows"] for r in rows} == {4, 32}
    assert all(r[k] > 0 for r in rows for k in ("fp32", "int_mm", "int8_linear"))


@pytest.mark.slow
def test_bench_add_language_runs_every_stage_and_variant(tmp_path):
    """The whole pipeline of bench_add_language --quick on a tiny gettext-layout corpus made from the
    shipped Bible text (the first 8 words of each verse; en and es as they are, de, fr, it letter
    substitutions of the Spanish): a base model trained with transformers, imported, four variants
    trained for the same steps, every model evaluated on every direction, the grow model exported to
    Hugging Face with transformers' greedy outputs equal to nmt's."""
    import gzip

    data = tmp_path / "gettext"
    data.mkdir()
    fake = {"de": str.maketrans("aeiou", "äëïöü"), "fr": str.maketrans("aeo", "éèô"), "it": str.maketrans("aeiou", "àèìòù")}
    for split, n in (("train", 200), ("dev", 10), ("test", 10)):
        lines = {}
        for side in ("es", "en"):
            with gzip.open(os.path.join(ROOT, "data", "bible-es-en", f"{split}.{side}.gz"), "rt", encoding="utf-8") as f:
                lines[side] = [" ".join(next(f).split()[:8]) for _ in range(n)]  # short, as messages are
        for lang in ("es", "de", "fr", "it"):
            (data / f"{split}.en-{lang}.en").write_text("\n".join(lines["en"]) + "\n", encoding="utf-8")
            text = lines["es"] if lang == "es" else [x.translate(fake[lang]) for x in lines["es"]]
            if split == "train" and lang in ("it", "es"):
                text[0] = lines["en"][0]  # an untranslated pair: --drop-identical (and, in es, the base) leave it out
            (data / f"{split}.en-{lang}.{lang}").write_text("\n".join(text) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    run_script("bench_add_language.py", "--data", str(data), "--out", str(out), "--quick", "--device", "cpu",
               "--replay-weight", "0.5", "--drop-identical", "--base-drop-identical")
    res = json.loads((out / "results.json").read_text())
    for name in ("grow", "nogrow", "noreplay", "scratch"):
        log = (out / "runs" / name / "train.log").read_text()
        corpora = 1 if name == "noreplay" else 2  # it alone, or it and es: one pair each
        assert log.count("1 with the target equal to the source") == corpora and "drop_identical: true" in \
            (out / "runs" / name / "config.yaml").read_text()
    assert res["runs"]["base"]["dropped_identical"] == {"es": 1, "de": 0, "fr": 0}
    assert res["runs"]["base"]["pairs"] == {"es": 199, "de": 200, "fr": 200}
    import yaml

    weights = {name: [(c["tgt_lang"], c.get("weight", 1.0)) for c in yaml.safe_load(
        (out / "runs" / name / "config.yaml").read_text())["data"]["train"]] for name in ("grow", "noreplay", "scratch")}
    replayed = [("spa_Latn", 0.5), ("deu_Latn", 0.5), ("fra_Latn", 0.5), ("ita_Latn", 1.0)]  # --replay-weight
    assert weights == {"grow": replayed, "noreplay": [("ita_Latn", 1.0)], "scratch": replayed}
    assert {name: r["steps"] for name, r in res["runs"].items()} == {"base": 30, "grow": 8, "nogrow": 8, "noreplay": 8,
                                                                     "scratch": 8}
    assert any(line.startswith("add_pieces:") for line in res["runs"]["grow"]["grown"])
    assert not any(line.startswith("add_pieces:") for line in res["runs"]["nogrow"]["grown"])
    assert res["runs"]["nogrow"]["grown"][0].startswith("add languages ita_Latn: language tokens ita_Latn")
    assert set(res["scores"]["imported"]) == {"es", "de", "fr"}
    assert all(set(res["scores"][name]) == {"es", "de", "fr", "it"} for name in ("grow", "nogrow", "noreplay", "scratch"))
    assert all(s["lines"] == 10 for scores in res["scores"].values() for s in scores.values())
    assert all(len((out / "test" / f"{name}.{lang}").read_text().splitlines()) == 10
               for name, scores in res["scores"].items() for lang in scores)  # the outputs kept
    assert all(e["equal"] == e["lines"] == 10 for e in res["export"].values())
    assert "## New direction en -> it" in (out / "results.md").read_text()


def test_batch_shapes_counts_every_variants_batches(tmp_path):
    """scripts/batch_shapes.py (BENCHMARKS.md, issue 56): each variant's batches cover every pair; buckets
    leave few shapes, one source length per batch leaves no source padding."""
    ckpt = make_tiny_checkpoint(str(tmp_path / "tiny.pt"))
    from helpers import make_pairs

    pairs = make_pairs(400, 3)
    for side, i in (("es", 0), ("en", 1)):
        (tmp_path / f"t.{side}").write_text("".join(p[i] + "\n" for p in pairs), encoding="utf-8")
    out = tmp_path / "shapes.json"
    run_script("batch_shapes.py", "-c", ckpt, "--src", str(tmp_path / "t.es"), "--tgt", str(tmp_path / "t.en"),
               "--batch-tokens", "64", "256", "--json", str(out))
    res = json.loads(out.read_text())
    rows = {(r["variant"], r["batch_tokens"]): r for r in res["rows"]}
    assert len(rows) == 6 and res["pairs"] == 400
    for bt in (64, 256):
        default, buckets, same = (rows[(v, bt)] for v in ("default", "length_buckets", "same_source_length"))
        assert buckets["shapes"] <= len(res["buckets"]) and buckets["shapes"] < default["shapes"]
        assert 0 < buckets["padding_efficiency"] < default["padding_efficiency"] <= 1
        assert same["batches"] >= default["batches"]


@pytest.mark.slow
def test_bench_serve_stream_times_the_lines_of_streamed_answers(tmp_path):
    """scripts/bench_serve.py --stream (BENCHMARKS.md, issue 58): every streamed line checked against `nmt
    translate`, first line no later than the whole answer."""
    pytest.importorskip("uvicorn", reason="nmt serve needs the serve extra")
    ckpt = make_tiny_checkpoint(str(tmp_path / "tiny.pt"))
    src = tmp_path / "in.es"
    src.write_text("".join(p[0] + "\n" for p in make_pairs(40, 2)), encoding="utf-8")
    out = tmp_path / "serve.json"
    run_script("bench_serve.py", "-c", ckpt, "--input", str(src), "--stream", "8", "--json", str(out))
    res = json.loads(out.read_text())
    assert res["wrong"] == 0 and res["exit_code"] == 0 and len(res["rows"]) == 5
    assert all(0 < r["first_ms"] <= r["quarter_ms"] <= r["whole_ms"] for r in res["rows"])


@pytest.mark.slow
def test_bench_joined_times_steps_by_rows_and_pairs_apart_and_joined(tmp_path):
    """scripts/bench_joined.py (BENCHMARKS.md "Serving", StepPool's JOIN_ROWS): a step's time for each row count,
    and each pair of searches stepped apart and joined."""
    ckpt = make_tiny_checkpoint(str(tmp_path / "tiny.pt"))
    out = tmp_path / "joined.json"
    run_script("bench_joined.py", "-c", ckpt, "--rows", "1", "4", "--pairs", "1x2,3x3", "--steps", "3",
               "--src-len", "5", "--json", str(out))
    res = json.loads(out.read_text())
    assert [r["rows"] for r in res["rows"]] == [1, 4] and all(r["ms_per_step"] > 0 for r in res["rows"])
    assert [p["rows"] for p in res["pairs"]] == [[1, 2], [3, 3]]
    assert all(p["apart_ms"] > 0 and p["joined_ms"] > 0 for p in res["pairs"])


@pytest.mark.slow
def test_the_report_scripts_check_their_inputs_before_any_work(tmp_path):
    """length_report.py and length_sweep.py scored mismatched files pair by pair (zip), took --lines -8 for a slice,
    wrote --json over an input and showed tracebacks; engine_parity.py and langid_report.py showed tracebacks."""
    from helpers import ENV, one_line_error, write

    src, ref = write(tmp_path / "s.txt", ["a", "b", "c"]), write(tmp_path / "r.txt", ["x", "y"])
    ckpt = write(tmp_path / "c.pt", ["not read"])
    for args, problem in [(["length_report.py", "--checkpoint", ckpt, "--src", src, "--ref", ref], "line counts differ"),
                          (["length_report.py", "--checkpoint", ckpt, "--src", src, "--ref", src, "--json", src],
                           "is the same file as the input --src"),
                          (["length_sweep.py", "--checkpoint", ckpt, "--src", src, "--ref", src, "--lines", "-8"],
                           "--lines must be at least 0"),
                          (["engine_parity.py", "--checkpoint", ckpt, "--export", str(tmp_path), "--src", src,
                            "--control", "g=beam_size"], "expected NAME=KEY:VALUE"),
                          (["langid_report.py", "--data", str(tmp_path), "--langs", "es"], "at least two languages")]:
        proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", args[0]), *args[1:]], capture_output=True,
                              text=True, env=ENV, timeout=120)
        one_line_error(proc, 2, f"{args[0]}: error: ", problem)
    assert open(src).read() == "a\nb\nc\n"
