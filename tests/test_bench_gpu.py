"""scripts/bench_gpu.py (nmt against transformers, training and decoding; BENCHMARKS.md "On a GPU:
nmt against transformers"): its --device cpu --quick run measures every part and writes the JSON that
checks outside the repository read. Timings are never asserted, only what the numbers count: the two
training systems are the same model (equal loss from the same weights, transformers' own forward pass
as the reference), decoding does the forced work in both, and greedy search agrees line for line.
The CUDA variant (skipped without a CUDA device) runs the same on a GPU: bf16, peak memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts", "bench_gpu.py")


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device (none on CI)"))])
def test_bench_gpu_quick_measures_every_part_on_one_model(tmp_path, device):
    pytest.importorskip("transformers", reason="the A/B rows compare against transformers")
    cuda = device == "cuda"
    out = tmp_path / "gpu.json"
    profiles = tmp_path / "profiles"
    # the batches of data.length_buckets padded on the device (issue 56): nmt's and transformers' losses on
    # them are compared below (start_loss)
    data_set = ["--data-set", "length_buckets=[16, 32, 64, 128, 264]", "--data-set", "collate=device"]
    proc = subprocess.run([sys.executable, SCRIPT, "--device", device, "--quick", "--json", str(out),
                           "--profile", str(profiles), *data_set],
                          env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["errors"] == [] and res["quick"] is True and res["peak_flops_per_s"] > 0
    assert res["parts"] == ["decode", "nmt_train", "train"]
    assert res["data_set"] == {"length_buckets": [16, 32, 64, 128, 264], "collate": "device"}
    # --profile: one file per training shape, the per-step split first, then the op tables
    assert sorted(p.name for p in profiles.iterdir()) == sorted(
        f"profile-{m}-{bt}.txt" for m in ("tiny", "tiny-wide") for bt in (512, 1024))
    for p in profiles.iterdir():
        head, _, tables = p.read_text().partition("\n")
        assert head.startswith("nmt: ") and "host time in ops" in head and "aten::" in tables
    # CUDA: the same decoding without CUDA graphs (NMT_CUDA_GRAPHS=0) in decode_eager, one row per nmt row
    assert len(res["decode_eager"]) == (len([r for r in res["decode"] if r["system"] == "nmt"]) if cuda else 0)
    for r in res["decode_eager"]:  # fp32: the same search up to rounding (bf16 near-ties flip more often)
        assert r["system"] == "nmt eager" and r["same_lines"] >= (0.9 if r["precision"] == "fp32" else 0.0)
    assert "tgt tok/s" in proc.stdout and "same lines" in proc.stdout  # the table

    train = res["train"]
    assert all("error" not in r for r in train)
    ab = [r for r in train if r["system"] in ("nmt", "transformers")]
    keys = {(r["model"], r["batch_tokens"]) for r in ab}
    assert len({m for m, _ in keys}) == 2 and len({bt for _, bt in keys}) == 2  # two models x two budgets
    for model, bt in keys:
        pair = {r["system"]: r for r in ab if (r["model"], r["batch_tokens"]) == (model, bt)}
        assert set(pair) == {"nmt", "transformers"}
        # the same weights give the same loss: the two systems train the same model (bf16 autocast on CUDA)
        assert pair["transformers"]["start_loss"] == pytest.approx(pair["nmt"]["start_loss"], rel=2e-2 if cuda else 1e-5)
        assert pair["nmt"]["flops_per_tgt_token"] == pair["transformers"]["flops_per_tgt_token"]  # same batches
        assert pair["transformers"]["nmt_speedup"] == pytest.approx(
            pair["nmt"]["tgt_tok_per_s"] / pair["transformers"]["tgt_tok_per_s"])
    for r in ab:
        assert r["tgt_tok_per_s"] > 0 and r["tflops"] > 0 and r["mfu"] > 0 and r["steps"] > 0
        assert (r["peak_mem_mb"] > 0) if cuda else r["peak_mem_mb"] is None
    (e2e,) = [r for r in train if r["system"] == "nmt train"]
    assert e2e["tgt_tok_per_s"] > 0 and e2e["mfu"] > 0 and e2e["vs_step"] > 0 and e2e["log_intervals"] >= 1
    assert (e2e["model"], e2e["batch_tokens"]) in keys

    decode = res["decode"]
    assert all("error" not in r for r in decode)
    configs = {(r["precision"], r["beam"], r["batch"]) for r in decode}
    assert {b for _, b, _ in configs} == {1, 5} and len({n for _, _, n in configs}) == 2
    assert {p for p, _, _ in configs} == ({"fp32", "bf16"} if cuda else {"fp32"})
    for config in configs:
        pair = {r["system"]: r for r in decode if (r["precision"], r["beam"], r["batch"]) == config}
        assert set(pair) == {"nmt", "transformers"}
        for r in pair.values():
            assert r["sent_per_s"] > 0 and r["tok_per_s"] > 0 and 0 <= r["same_lines"] <= 1
            assert r["tok_per_s"] / r["sent_per_s"] == pytest.approx(r["length"])  # every output forced to length
        if config[:2] == ("fp32", 1) and not cuda:  # greedy: the argmax of the same (bitwise) fp32 logits
            assert pair["transformers"]["same_lines"] == 1.0
        elif config[:2] == ("fp32", 1):  # other kernels: equal logits to rounding, near-ties aside
            assert pair["transformers"]["same_lines"] >= 0.9


@pytest.mark.slow
def test_bench_gpu_compile_adds_the_compiled_system(tmp_path):
    """--compile: a third training system, nmt with train.compile (same weights, checked by the script),
    in `train_compiled`, its compilation in warmup_s (one model and the A/B only: compiling is slow on
    CPU; `nmt train` with train.compile is tests/test_compile.py's)."""
    pytest.importorskip("transformers", reason="the A/B rows compare against transformers")
    out = tmp_path / "gpu.json"
    proc = subprocess.run([sys.executable, SCRIPT, "--device", "cpu", "--quick", "--compile", "--parts", "train",
                           "--models", "tiny", "--json", str(out), "--data-set", "same_source_length=true"],
                          env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["errors"] == [] and res["compile"] is True
    assert {r["system"] for r in res["train"]} == {"nmt", "transformers"}
    for bt in (512, 1024):  # batches without source masks (data.same_source_length): the same loss as transformers'
        pair = {r["system"]: r["start_loss"] for r in res["train"] if r["batch_tokens"] == bt}
        assert pair["nmt"] == pytest.approx(pair["transformers"], rel=1e-5)
    compiled = res["train_compiled"]
    assert sorted(r["batch_tokens"] for r in compiled) == [512, 1024]
    for r in compiled:
        eager = next(e for e in res["train"] if e["system"] == "nmt" and e["batch_tokens"] == r["batch_tokens"])
        assert r["system"] == "nmt compiled" and r["tgt_tok_per_s"] > 0 and r["mfu"] > 0
        assert r["flops_per_tgt_token"] == eager["flops_per_tgt_token"]  # the same batches
        assert r["vs_eager"] == pytest.approx(r["tgt_tok_per_s"] / eager["tgt_tok_per_s"])
    first = min(compiled, key=lambda r: r["batch_tokens"])  # its warm-up compiled the layers and the loss
    assert first["warmup_s"] > max(r["warmup_s"] for r in res["train"])


@pytest.mark.parametrize("args, message", [(["--parts", "train,nope"], "--parts: unknown part(s) nope"),
                                           (["--quick", "--models", "base"], "--models: unknown model(s) base")])
def test_bench_gpu_refuses_unknown_parts_and_models(args, message):
    proc = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr
