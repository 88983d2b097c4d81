"""nmt against Hugging Face transformers on one GPU: training and decoding speed, one command.

    python3 scripts/bench_gpu.py --json OUT                         # one CUDA GPU, about 4-6 minutes
    python3 scripts/bench_gpu.py --device cpu --quick --json OUT    # every part on tiny shapes, < 1 minute
    python3 scripts/bench_gpu.py --parts decode --json OUT          # only some parts (train, nmt_train, decode)
    python3 scripts/bench_gpu.py --parts train --models base --profile DIR   # where a training step's time goes
    python3 scripts/bench_gpu.py --compile --parts train,nmt_train --json OUT  # + nmt with train.compile: true
    python3 scripts/bench_gpu.py --parts train --train-set loss_chunk=8192 --json OUT  # nmt with a train key set
    python3 scripts/bench_gpu.py --data-set collate=device --json OUT   # both systems' batches as a data key makes them

Progress goes to stderr, one table to stdout, everything to --json OUT. Data: the shipped Bible
corpus (data/bible-es-en, es->en), a joint SentencePiece model trained on its training split by nmt
(8k BPE; 500 with --quick). Models: post-norm Transformers with MarianMT's position table, so
that one model exists in both toolkits (`nmt export --format hf`): base (d_model 512, 8 heads, 6+6
layers, FFN 2048) and big (1024, 16 heads, 6+6, FFN 4096); ReLU, dropout 0.1, shared and tied
embeddings. Randomly initialised (speed only). Parts, in order:

1. **Matmul peak** (the MFU denominator): a large matmul, bf16 on CUDA (8192^3, 50 per timing),
   fp32 on CPU (2048^3; 1024^3 with --quick), the best of 3 timings after a warm-up.
2. **Training A/B** (`train` rows, system "nmt" and "transformers"), per model and batch budget
   (16,384 and 32,768 tokens): nmt's real step (`nmt.training.step.train_step` on what `nmt.train.build_training`
   prepares: fused AdamW, inverse-sqrt schedule, label-smoothed loss, gradient clipping at 1.0, bf16
   autocast on CUDA) against transformers' `MarianMTModel` of the same shape with the same initial
   weights (written by nmt's HF exporter, loaded with `attn_implementation="sdpa"`; its sinusoid
   position tables frozen, as `MarianMTModel(config)` makes them and nmt's are), trained by
   the same kind of step: forward under the same autocast (`use_cache=False`), PyTorch's
   label-smoothed `F.cross_entropy` (the formula nmt's fused loss computes, nmt/training/loss.py) summed
   over the real target tokens and divided by their count, `clip_grad_norm_`, nmt's fused AdamW and
   schedule (`nmt.training.optim`). Both get the same pre-collated token-budget batches (nmt's data pipeline,
   epoch 1, already on the device) in the same order: warm-up steps, then alternating rounds (nmt
   first in even rounds), each round timed between `torch.cuda.synchronize()` calls. Reported: real
   target tokens per second, model TFLOP/s and MFU (matmul FLOPs of the real tokens, the formula
   of scripts/bench_train.py, over the measured peak), step time, `start_loss` (each system's loss
   per token on the first batch in eval mode before any step: from the same weights, equal to
   rounding if the two are the same model), and on CUDA the peak memory of the system's steps
   (`max_memory_allocated` since a reset before each of its rounds, minus the resident weights and
   optimizer state of the other system, whose gradients are freed first).
3. **`nmt train` end to end** (`train` row, system "nmt train"): `python -m nmt train` on a
   temporary config of the same model, batch budget and tokenizer, a fixed number of steps,
   validation (loss only) at the end only; its tokens/s is the mean of the rates train.log reports
   (real target tokens per second of wall clock between log lines: collate, copies, steps), the
   first interval (start-up) left out, and `vs_step` divides it by the step-only rate of part 2.
4. **Decoding A/B** (`decode` rows), on part 3's model (best.pt) exported with nmt's
   `nmt export --format hf` writer: `nmt.Translator` against transformers' `generate()`
   (sdpa attention, the exported generation_config) on the first 640 test-split lines, every
   output forced to 48 tokens (nmt: min_len = max_len_b = 48, max_len_a = 0; generate():
   min_length = max_length = 49, counting the decoder start), greedy and beam 5, batches of 64
   and 256 sentences (sorted by length, longest first, in both), fp32 and bf16 autocast (CUDA
   only; CPU runs fp32). Times are text in, text out (tokenization and detokenization included),
   after an untimed warm-up batch of each system, alternating which system goes first.
   `same_lines`: the share of lines on which both agree (transformers' token ids detokenized by
   nmt's tokenizer, so only the search is compared). With every hypothesis the same length, the
   length penalty (nmt `average` 1.0 = transformers' `length_penalty` 1.0) and the stopping rule
   (nmt patience 0 = `early_stopping="never"`) cannot matter; greedy must agree up to floating-
   point near-ties. Beam search may differ: while EOS is forbidden nmt renormalises the other
   tokens' probabilities (CTranslate2's semantics), transformers does not (its processors run on
   the log-probabilities), which moves beams of different EOS probability against each other.
   On CUDA a third system, "nmt eager" (the JSON's `decode_eager` rows), is nmt with its decoding
   steps run eagerly instead of replayed as CUDA graphs (`NMT_CUDA_GRAPHS=0`, nmt/search/cuda_graphs.py):
   the before/after of that change in one run; its `same_lines` compares it with nmt's lines.

`--compile` adds a third system to part 2, "nmt compiled" (the JSON's `train_compiled` rows): the same
model and step with `train.compile: true` (each layer and the loss compiled, nmt/model/transformer.py
`compile_layers`), built from the same seed (its weights are checked equal to nmt's before any step),
timed in the same alternating rounds; its compilation falls in the warm-up steps (`warmup_s`, every
row has it) and `vs_eager` divides its rate by nmt's. Part 3 then trains with `train.compile: true`
too, and its `vs_step` compares with the compiled step.

transformers is optional: without it its rows are skipped, with a note. cuDNN's attention is off
for both systems (nmt turns it off process-wide on CUDA: nmt/device.py). Each part runs in its own
try/except: a failure is printed, recorded (an `error` row and the JSON's `errors`), and the exit
status is 1; the other parts still run.

JSON: {device, torch, transformers, quick, compile, peak_flops_per_s, peak_dtype, part_seconds, notes,
errors, parts, train: [{model, batch_tokens, system, tgt_tok_per_s, tflops, mfu, warmup_s, ...}],
train_compiled: [the same, system "nmt compiled", with vs_eager], decode: [{precision, beam, batch,
system, sent_per_s, tok_per_s, same_lines, ...}], decode_eager: [the same]}.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import gzip
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import dataclasses
from dataclasses import dataclass

from nmt.benchmarking import forward_flops  # the MFU formula (shared with bench_train.py)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
BIBLE = os.path.join(ROOT, "data", "bible-es-en")
LR, WARMUP = 5e-4, 4000  # inverse_sqrt schedule (only the warm-up's first steps run)
T0 = time.perf_counter()


@dataclass(frozen=True)
class Plan:
    """What a run measures and how long: the full GPU run, or --quick (tiny shapes)."""

    models: dict[str, dict]  # name -> model shape (nmt's model.* keys)
    batch_tokens: tuple[int, ...]
    vocab_size: int
    train_sentences: int | None  # training pairs read (None: all)
    warmup: int  # untimed steps per system, model and batch budget
    rounds: int  # alternating timed rounds
    round_steps: int  # steps per system and round
    e2e: tuple[str, int]  # model and batch budget of the `nmt train` run
    e2e_steps: int
    e2e_log_every: int
    sentences: int  # decoded test lines
    length: int  # forced output length
    beams: tuple[int, ...]
    batches: tuple[int, ...]
    peak: tuple[int, int]  # matmul size and repetitions on CUDA (CPU: at most 2048, 10 repetitions)
    valid_sentences: int = 200  # validation pairs of the `nmt train` run (loss at the end only)
    ab_models: tuple[str, ...] = ()  # the models of the training A/B (--models; empty: all of `models`)


FULL = Plan(models={"base": dict(d_model=512, n_heads=8, layers=6, ffn_dim=2048),
                    "big": dict(d_model=1024, n_heads=16, layers=6, ffn_dim=4096)},
            batch_tokens=(16384, 32768), vocab_size=8000, train_sentences=None, warmup=10, rounds=4, round_steps=15,
            e2e=("base", 16384), e2e_steps=300, e2e_log_every=50, sentences=640, length=48, beams=(1, 5),
            batches=(64, 256), peak=(8192, 50))
QUICK = Plan(models={"tiny": dict(d_model=64, n_heads=4, layers=2, ffn_dim=256),
                     "tiny-wide": dict(d_model=128, n_heads=4, layers=2, ffn_dim=512)},
             batch_tokens=(512, 1024), vocab_size=500, train_sentences=2000, warmup=2, rounds=2, round_steps=2,
             e2e=("tiny", 512), e2e_steps=12, e2e_log_every=4, sentences=24, length=8, beams=(1, 5),
             batches=(4, 16), peak=(1024, 10), valid_sentences=32)


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def sync(device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def read_lines(path: str, n: int) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()]
    return lines[:n]


# --------------------------------------------------------------------------- 1. the matmul peak

def measure_peak(device, plan: Plan) -> tuple[float, str]:
    """(FLOP/s, dtype name) of a large square matmul: bf16 on CUDA, fp32 on CPU; best of 3 timings."""
    import torch

    n, reps = plan.peak
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if device.type != "cuda":
        n, reps = min(n, 2048), 10
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(3):
        sync(device)
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ b
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 * reps / best, str(dtype).removeprefix("torch.")


# --------------------------------------------------------------------------- configs

def bench_config(plan: Plan, output_dir: str, name: str, model: str, batch_tokens: int, device: str, *,
                 spm_model: str | None = None, **train):
    """An nmt Config: the Bible corpus, `plan.models[model]`, post-norm with MarianMT's positions;
    spm_model: an existing SentencePiece model instead of training one."""
    from nmt.config import config_from_dict

    corpus = lambda split, n: {"src": os.path.join(BIBLE, f"{split}.es.gz"),
                               "tgt": os.path.join(BIBLE, f"{split}.en.gz"), **({"max_sentences": n} if n else {})}
    tokenizer = {"joint": True, "vocab_size": plan.vocab_size, "model_type": "bpe",
                 "threads": max(1, min(16, os.cpu_count() or 1))}
    if spm_model:
        tokenizer["model"] = spm_model
    raw = {"name": name, "seed": 1, "output_dir": output_dir,
           "data": {"src_lang": "es", "tgt_lang": "en", "train": corpus("train", plan.train_sentences),
                    "valid": corpus("dev", plan.valid_sentences), "tokenizer": tokenizer, "max_len": 256,
                    "batch_tokens": batch_tokens, **DATA_SET},
           "model": {**plan.models[model], "norm": "post", "positions": "sinusoidal_halves", "activation": "relu",
                     "dropout": 0.1},
           "train": {"lr": LR, "warmup_steps": WARMUP, "max_steps": 10 ** 6, "label_smoothing": 0.1, "clip_norm": 1.0,
                     "precision": "auto", "device": device, "valid_bleu": False, "metric": "loss", **TRAIN_SET,
                     **train},
           # nmt's counterpart of transformers' beam search (nmt/interop/hf_export.py): score / length^1, exact stop
           "decode": {"beam_size": 5, "length_penalty": 1.0, "length_penalty_type": "average", "patience": 0.0}}
    return config_from_dict(raw)


# --------------------------------------------------------------------------- 2. training A/B

class NmtSide:
    """nmt's real training step over a `Training` (nmt/train.py)."""

    def __init__(self, tr, name: str = "nmt"):
        self.tr, self.model, self.optimizer, self.name = tr, tr.model, tr.optimizer, name

    def logits(self, batch, hf_mask):
        with self.tr.precision.autocast():
            return self.tr.forward(batch.src, batch.src_mask, batch.tgt_in)  # [B,T,V]

    def step(self, batch, hf_mask) -> None:
        from nmt.training.step import train_step

        tr, t = self.tr, self.tr.cfg.train
        train_step(tr.forward, [batch], tr.optimizer, tr.scheduler, tr.precision, label_smoothing=t.label_smoothing,
                   clip_norm=t.clip_norm, pad_id=tr.tokenizer.specials.pad, loss_fn=tr.loss_fn)


class HFSide:
    """transformers' MarianMTModel trained by the same kind of step (module docstring, part 2)."""

    name = "transformers"

    def __init__(self, model, tr, device):
        from nmt.training.optim import build_optimizer, build_scheduler

        t = tr.cfg.train
        self.model, self.t, self.pad, self.dtype = model, t, tr.tokenizer.specials.pad, tr.precision.dtype
        self.device_type = device.type
        self.optimizer = build_optimizer(model, t, device)  # fused AdamW, nmt's parameter groups
        self.scheduler = build_scheduler(self.optimizer, t, tr.cfg.model.d_model)
        self.params = [p for p in model.parameters() if p.requires_grad]

    def logits(self, batch, hf_mask):
        import torch

        autocast = torch.autocast(self.device_type, dtype=self.dtype) if self.dtype else contextlib.nullcontext()
        with autocast:
            return self.model(input_ids=batch.src, attention_mask=hf_mask, decoder_input_ids=batch.tgt_in,
                              use_cache=False).logits  # [B,T,V]

    def step(self, batch, hf_mask) -> None:
        import torch

        self.optimizer.zero_grad(set_to_none=True)
        loss = smoothed_loss(self.logits(batch, hf_mask), batch, self.t.label_smoothing, self.pad)
        (loss / batch.n_tgt_tokens).backward()
        torch.nn.utils.clip_grad_norm_(self.params, self.t.clip_norm, foreach=True)
        self.optimizer.step()
        self.scheduler.step()


def smoothed_loss(logits, batch, epsilon: float, pad: int):
    """PyTorch's label-smoothed cross-entropy summed over the real target tokens (fp32), the loss nmt's
    fused function computes (nmt/training/loss.py)."""
    import torch.nn.functional as F

    return F.cross_entropy(logits.float().flatten(0, 1), batch.tgt_out.flatten(), ignore_index=pad,
                           label_smoothing=epsilon, reduction="sum")


def start_losses(sides: list, batch, hf_mask, epsilon: float, pad: int) -> dict[str, float]:
    """Each system's loss per token on one batch, in eval mode (no dropout), before any step: the
    systems start from the same weights, so these agree to rounding if they are the same model."""
    import torch

    out = {}
    for side in sides:
        side.model.eval()
        with torch.no_grad():
            out[side.name] = float(smoothed_loss(side.logits(batch, hf_mask), batch, epsilon, pad)) / batch.n_tgt_tokens
        side.model.train()
    return out


def resident_bytes(side) -> int:
    """Weights, buffers and optimizer state of a system (what stays on the device between its steps,
    gradients aside)."""
    import torch

    tensors = list(side.model.parameters()) + list(side.model.buffers())
    tensors += [v for s in side.optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in {id(t): t for t in tensors}.values())


def hf_twin(tr, directory: str, device):
    """transformers' MarianMTModel with the nmt model's current weights (nmt's HF exporter), sdpa attention."""
    import transformers
    from safetensors.torch import save_file

    from nmt.interop.hf_export import build_directory

    files, weights, _ = build_directory(tr.model, tr.tokenizer, tr.cfg)
    os.makedirs(directory, exist_ok=True)
    for name, data in files.items():
        with open(os.path.join(directory, name), "wb") as f:
            f.write(data)
    save_file({k: v.cpu().contiguous() for k, v in weights.items()}, os.path.join(directory, "model.safetensors"),
              metadata={"format": "pt"})
    model = transformers.MarianMTModel.from_pretrained(directory, attn_implementation="sdpa")  # (or an error)
    for name, p in model.named_parameters():  # the fixed sinusoid tables MarianMTModel(config) makes (nn.Embedding
        if "embed_positions" in name:  # with _freeze=True), which from_pretrained (transformers 5.24) leaves trainable
            p.requires_grad_(False)
    return model.to(device).train()


def precollate(tr, cfg, n: int, device):
    """The first n token-budget batches of epoch 1 (cycled if the epoch is shorter), on the device, each
    with its transformers attention mask (int64) and its training FLOPs (3 x forward, real tokens)."""
    import torch

    from nmt.data.batches import epoch_batches, training_batch

    index = epoch_batches(tr.train_data, cfg, 1)
    index = (index * (n // len(index) + 1))[:n]
    m, V, pad = cfg.model, tr.tokenizer.tgt_vocab_size, tr.tokenizer.specials.pad
    out = []
    for b in index:  # (the batches data.length_buckets / same_source_length / collate make: --data-set)
        batch = training_batch(tr.train_data, b, cfg.data, tr.tokenizer.specials).to("cpu")
        mask = batch.src_mask if batch.src_mask is not None else torch.ones(batch.src.shape, dtype=torch.bool)
        sl, tl = mask.sum(1).numpy(), (batch.tgt_out != pad).sum(1).numpy()
        real = tl > 0  # (rows a bucket adds have no target)
        flops = 3 * forward_flops(sl[real], tl[real], m.d_model, m.ffn_dim, V, m.n_encoder_layers, m.n_decoder_layers)
        out.append((batch.to(device), mask.long().to(device), flops))
    sync(device)
    return out


def time_sides(sides: list, batches: list, plan: Plan, device) -> dict:
    """Warm up each system, then alternate timed rounds; per system: seconds, FLOPs, tokens, steps and
    peak memory (CUDA)."""
    import torch

    cuda = device.type == "cuda"
    stats = {s.name: dict(seconds=0.0, flops=0.0, tokens=0, steps=0, peak=0, warmup_s=0.0) for s in sides}
    done = {s.name: 0 for s in sides}
    for side in sides:  # (torch.compile compiles in the first warm-up steps: warmup_s)
        sync(device)
        t0 = time.perf_counter()
        for i in range(plan.warmup):
            side.step(*batches[i][:2])
        sync(device)
        stats[side.name]["warmup_s"] = time.perf_counter() - t0
        done[side.name] = plan.warmup
    for r in range(plan.rounds):
        for side in (sides if r % 2 == 0 else sides[::-1]):
            others = [o for o in sides if o is not side]
            for o in others:  # its gradients would count as this system's memory
                o.optimizer.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.reset_peak_memory_stats(device)
            s, start = stats[side.name], done[side.name]
            sync(device)
            t0 = time.perf_counter()
            for i in range(start, start + plan.round_steps):
                side.step(*batches[i][:2])
            sync(device)
            s["seconds"] += time.perf_counter() - t0
            for batch, _, flops in batches[start:start + plan.round_steps]:
                s["flops"] += flops
                s["tokens"] += batch.n_tgt_tokens
            s["steps"] += plan.round_steps
            done[side.name] += plan.round_steps
            if cuda:
                s["peak"] = max(s["peak"], torch.cuda.max_memory_allocated(device) - sum(map(resident_bytes, others)))
    return stats


def train_ab(plan: Plan, work: str, device, peak: float | None, have_hf: bool, errors: list) -> list[dict]:
    """Part 2: each model, at each batch budget; rows (error rows for what failed)."""
    import torch

    # build_training turns TF32 on (nmt/training/step.py); restored afterwards, as `nmt train` restores it, so
    # that part 4's fp32 decoding runs in full fp32 as `nmt translate` does
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    rows = []
    try:
        for name in plan.ab_models or plan.models:
            try:
                rows += train_model(plan, work, device, peak, have_hf, errors, name)
            except Exception as e:  # noqa: BLE001 (recorded, reported, exit status 1)
                rows.append(fail(errors, "train", name, e, model=name, batch_tokens=None, system="nmt"))
            finally:
                free(device)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    return rows


def train_model(plan: Plan, work: str, device, peak: float | None, have_hf: bool, errors: list,
                name: str) -> list[dict]:
    """Part 2 for one model: nmt's training and its transformers twin, built once, timed at each batch budget."""
    import torch

    from nmt.config import replace
    from nmt.training.logging_utils import RunLogger
    from nmt.train import build_training

    log(f"train A/B: building {name}")
    cfg = bench_config(plan, work, "ab", name, plan.batch_tokens[0], str(device))
    tr = build_training(cfg, cfg.run_dir, device, RunLogger(cfg.run_dir, enabled=False))  # what `nmt train` runs
    sides = [NmtSide(tr)]
    if have_hf:
        sides.append(HFSide(hf_twin(tr, os.path.join(work, f"hf-{name}"), device), tr, device))
    rows, start, compiled = [], None, None
    if COMPILE:  # the same model (same seed), with train.compile: true
        try:
            ccfg = bench_config(plan, work, "ab", name, plan.batch_tokens[0], str(device), compile=True)
            compiled = NmtSide(build_training(ccfg, ccfg.run_dir, device, RunLogger(ccfg.run_dir, enabled=False)),
                               COMPILED)
            a, b = tr.model.state_dict(), compiled.model.state_dict()
            if list(a) != list(b) or not all(torch.equal(a[k], b[k]) for k in a):
                raise RuntimeError("the compiled twin does not start from the same weights")
        except Exception as e:  # noqa: BLE001 (the other systems still run)
            compiled = None
            rows.append(fail(errors, "train", f"{name} compiled", e, model=name, batch_tokens=None, system=COMPILED))
    need = plan.warmup + plan.rounds * plan.round_steps
    for bt in plan.batch_tokens:
        try:
            batches = precollate(tr, replace(cfg, data=replace(cfg.data, batch_tokens=bt)), need, device)
            if start is None:  # before any step: the same weights in both (the compiled twin: checked above)
                start = start_losses(sides, *batches[0][:2], cfg.train.label_smoothing, tr.tokenizer.specials.pad)
            timed = sides + ([compiled] if compiled else [])
            log(f"train A/B: {name}, {bt} batch tokens, {len(timed)} systems x {need} steps")
            try:
                stats = time_sides(timed, batches, plan, device)
            except Exception as e:  # noqa: BLE001 (a compiled system that fails leaves the others measured)
                if compiled is None:
                    raise
                rows.append(fail(errors, "train", f"{name} {bt} compiled", e, model=name, batch_tokens=bt,
                                 system=COMPILED))
                timed, compiled = sides, None
                stats = time_sides(timed, batches, plan, device)
            rows += train_rows(name, bt, stats, peak, device, tr.model.num_parameters(), start)
            for side in [sides[0]] + ([compiled] if compiled else []) if PROFILE_DIR else ():
                try:
                    profile_steps(side, batches[:plan.round_steps], device, os.path.join(
                        PROFILE_DIR, f"profile-{name}-{bt}{'-compiled' if side is compiled else ''}.txt"))
                except Exception as e:  # noqa: BLE001 (the timed rows stand; the profile's failure is recorded)
                    fail(errors, "profile", f"{name} {bt}", e)
            log("train A/B: " + ", ".join(f"{r['system']} {r['tgt_tok_per_s']:,.0f} tok/s" for r in rows[-len(timed):]))
        except Exception as e:  # noqa: BLE001 (recorded, reported, exit status 1)
            rows.append(fail(errors, "train", f"{name} {bt}", e, model=name, batch_tokens=bt, system="nmt"))
        finally:
            batches = None
            free(device)
    return rows


PROFILE_DIR: str | None = None  # --profile
TRAIN_SET: dict = {}  # --train-set: train keys for nmt's runs
DATA_SET: dict = {}  # --data-set: data keys for every run's batches
COMPILE = False  # --compile: a third system, nmt with train.compile: true (the JSON's `train_compiled` rows)
COMPILED = "nmt compiled"


def profile_steps(side, batches: list, device, path: str) -> None:
    """torch.profiler over `side`'s steps on `batches` (after its timed rounds): per step the wall time,
    the host's time in PyTorch ops and the device's kernel time (host-bound when the first two are
    close and the third is well below), then the ops by device time and by host time; written to path."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync(device)
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        for batch, hf_mask, _ in batches:
            side.step(batch, hf_mask)
        sync(device)
    wall = (time.perf_counter() - t0) / len(batches)
    events = prof.key_averages()
    host = sum(e.self_cpu_time_total for e in events) / 1e6 / len(batches)
    kernels = sum(getattr(e, "self_device_time_total", 0) for e in events) / 1e6 / len(batches)
    head = (f"{side.name}: {len(batches)} steps profiled; per step: wall {wall * 1e3:.1f} ms, host time in ops "
            f"{host * 1e3:.1f} ms, device kernel time {kernels * 1e3:.1f} ms")
    with open(path, "w", encoding="utf-8") as f:
        f.write(head + "\n\n")
        for key in ("self_device_time_total", "self_cpu_time_total"):
            try:
                f.write(events.table(sort_by=key, row_limit=30) + "\n")
            except Exception as e:  # noqa: BLE001 (a profiler without that column)
                f.write(f"({key}: {e})\n")
    log("profile: " + head)


def free(device) -> None:
    """Return what the last measurement left to the allocator (a model, batches, an out-of-memory's debris)."""
    gc.collect()
    if device.type == "cuda":
        import torch

        torch.cuda.empty_cache()


def train_rows(name: str, bt: int, stats: dict, peak: float | None, device, parameters: int,
               start: dict) -> list[dict]:
    rows = []
    for system, s in stats.items():
        rate, flops_per_s = s["tokens"] / s["seconds"], s["flops"] / s["seconds"]
        rows.append(dict(model=name, batch_tokens=bt, system=system, parameters=parameters, steps=s["steps"],
                         tgt_tok_per_s=rate, step_ms=1000 * s["seconds"] / s["steps"], warmup_s=s["warmup_s"],
                         tflops=flops_per_s / 1e12, mfu=flops_per_s / peak if peak else None,
                         flops_per_tgt_token=s["flops"] / s["tokens"], start_loss=start.get(system),
                         peak_mem_mb=s["peak"] / 2 ** 20 if device.type == "cuda" else None))
    by = {r["system"]: r for r in rows}
    if "transformers" in by:
        by["transformers"]["nmt_speedup"] = by["nmt"]["tgt_tok_per_s"] / by["transformers"]["tgt_tok_per_s"]
    if COMPILED in by:
        by[COMPILED]["vs_eager"] = by[COMPILED]["tgt_tok_per_s"] / by["nmt"]["tgt_tok_per_s"]
        if "transformers" in by:
            by[COMPILED]["nmt_speedup"] = by[COMPILED]["tgt_tok_per_s"] / by["transformers"]["tgt_tok_per_s"]
    return rows


# --------------------------------------------------------------------------- 3. nmt train end to end

RATE = re.compile(r"\| tokens_per_s ([0-9.eE+-]+)")


def train_e2e(plan: Plan, work: str, device, peak: float | None, step_rows: list[dict]) -> tuple[dict, str]:
    """Part 3: `python -m nmt train` for plan.e2e_steps steps; (row, its best.pt)."""
    from nmt.config import save_config

    model, bt = plan.e2e
    spm = os.path.join(work, "ab", "spm.model")  # part 2's tokenizer: no second training
    output_dir = tempfile.mkdtemp(prefix="nmt-train-", dir=work)  # a new run directory, even in a reused --workdir
    # the learning rates of part 2's first steps (warmup must end inside max_steps: a lower peak instead)
    warmup = plan.e2e_steps - 1
    cfg = bench_config(plan, output_dir, "e2e", model, bt, str(device), spm_model=spm if os.path.isfile(spm) else None,
                       max_steps=plan.e2e_steps, warmup_steps=warmup, lr=LR * warmup / WARMUP,
                       log_every=plan.e2e_log_every, valid_every=0, keep_last=0, compile=COMPILE)
    path = os.path.join(output_dir, "e2e.yaml")
    save_config(cfg, path)
    log(f"nmt train: {model}, {bt} batch tokens, {plan.e2e_steps} steps")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "nmt", "train", "--config", path, "--quiet"], capture_output=True,
                          text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"nmt train exited with {proc.returncode}: {tail}")
    with open(os.path.join(cfg.run_dir, "train.log"), encoding="utf-8") as f:
        rates = [float(m.group(1)) for m in RATE.finditer(f.read())]
    if len(rates) < 2:
        raise RuntimeError(f"train.log has {len(rates)} tokens_per_s lines; 2 or more expected")
    rate = sum(rates[1:]) / len(rates[1:])  # the first interval holds the start-up
    system = COMPILED if COMPILE else "nmt"  # the step-only rate of the same code
    step = next((r for r in step_rows if (r.get("model"), r.get("batch_tokens"), r.get("system")) == (model, bt, system)
                 and "error" not in r), None)
    per_token = step["flops_per_tgt_token"] if step else None
    row = dict(model=model, batch_tokens=bt, system="nmt train", steps=plan.e2e_steps, tgt_tok_per_s=rate,
               log_intervals=len(rates) - 1, wall_s=wall, tflops=rate * per_token / 1e12 if per_token else None,
               mfu=rate * per_token / peak if per_token and peak else None, compiled=COMPILE,
               vs_step=rate / step["tgt_tok_per_s"] if step else None)
    log(f"nmt train: {rate:,.0f} tok/s" + (f" ({row['vs_step']:.2f}x the step-only rate)" if step else ""))
    return row, os.path.join(cfg.run_dir, "checkpoints", "best.pt")


# --------------------------------------------------------------------------- 4. decoding A/B

def hf_translate(model, tokenizer, lines: list[str], beam: int, batch: int, length: int, dtype, device):
    """generate() over batches of `batch` lines sorted by length (longest first, as nmt's batches), every
    output forced to `length` tokens; (texts, generated ids without the decoder start), in input order."""
    import torch

    lengths = [len(x) for x in tokenizer(lines)["input_ids"]]
    order = sorted(range(len(lines)), key=lambda i: -lengths[i])
    texts, ids = [None] * len(lines), [None] * len(lines)
    autocast = torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext()
    with torch.inference_mode(), autocast:
        for start in range(0, len(order), batch):
            part = order[start:start + batch]
            enc = tokenizer([lines[i] for i in part], return_tensors="pt", padding=True).to(device)
            out = model.generate(**enc, num_beams=beam, do_sample=False, min_length=length + 1,
                                 max_length=length + 1)  # [b, 1 + length]: the decoder start, then the output
            decoded = tokenizer.batch_decode(out, skip_special_tokens=True)
            rows = out[:, 1:].tolist()
            for j, i in enumerate(part):
                texts[i], ids[i] = decoded[j], rows[j]
    return texts, ids


def decode_ab(plan: Plan, work: str, device, checkpoint: str, have_hf: bool, errors: list) -> list[dict]:
    """Part 4: nmt.Translator against generate() on the exported checkpoint."""
    import torch

    from nmt import Translator
    from nmt.model.checkpoint import load_record
    from nmt.commands.export import ExportOptions, export_command
    from nmt.text.tokenizer import Tokenizer

    lines = read_lines(os.path.join(BIBLE, "test.es.gz"), plan.sentences)
    L = plan.length
    nmt_tokenizer = Tokenizer.from_bytes(load_record(checkpoint).tokenizer)
    hf_model = hf_tokenizer = None
    if have_hf:
        import transformers

        hf_dir = os.path.join(work, "hf-decode")
        export_command(ExportOptions(checkpoint, hf_dir, format="hf", force=True,
                                     quiet=True))  # `nmt export --format hf`
        hf_tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
        hf_model = transformers.AutoModelForSeq2SeqLM.from_pretrained(hf_dir, attn_implementation="sdpa")
        hf_model = hf_model.to(device).eval()
    precisions = ("fp32", "bf16") if device.type == "cuda" else ("fp32",)
    rows = []
    for precision in precisions:
        dtype = {"fp32": None, "bf16": torch.bfloat16}[precision]
        try:
            translator = Translator(checkpoint, device=str(device), precision=precision)
        except Exception as e:  # noqa: BLE001
            rows.append(fail(errors, "decode", precision, e, precision=precision, beam=None, batch=None, system="nmt"))
            continue
        eager = None
        if device.type == "cuda":
            try:
                eager = eager_translator(checkpoint, device, precision)
            except Exception as e:  # noqa: BLE001 (the other systems still run)
                rows.append(fail(errors, "decode", f"{precision} eager", e, precision=precision, beam=None,
                                 batch=None, system=EAGER))
        for k, (beam, batch) in enumerate((b, n) for b in plan.beams for n in plan.batches):
            what = f"{precision} beam {beam} batch {batch}"
            try:
                opts = dict(beam_size=beam, max_batch_size=batch, batch_tokens=10 ** 7, min_len=L, max_len_a=0,
                            max_len_b=L, length_penalty=1.0, length_penalty_type="average", patience=0.0,
                            no_repeat_ngram=0, nbest=1)
                systems = {"nmt": lambda part: translator.translate(part, **opts)}
                if eager is not None:
                    systems[EAGER] = lambda part: eager.translate(part, **opts)
                if have_hf:
                    systems["transformers"] = lambda part: hf_translate(hf_model, hf_tokenizer, part, beam, batch, L,
                                                                        dtype, device)
                names = list(systems)[k % len(systems):] + list(systems)[:k % len(systems)]  # who goes first rotates
                for name in names:  # warm-up: one batch each, untimed
                    systems[name](lines[:batch])
                seconds, outputs = {}, {}
                for name in names:
                    sync(device)
                    t0 = time.perf_counter()
                    outputs[name] = systems[name](lines)
                    sync(device)
                    seconds[name] = time.perf_counter() - t0
                rows += decode_rows(precision, beam, batch, lines, L, seconds, outputs, nmt_tokenizer)
                same = next(r["same_lines"] for r in rows[-len(systems):] if r["system"] == "nmt")
                speeds = ", ".join(f"{r['system']} {r['sent_per_s']:,.1f} sent/s" for r in rows[-len(systems):])
                log(f"decode {what}: {speeds}" + (f", same lines {same:.1%}" if same is not None else ""))
            except Exception as e:  # noqa: BLE001
                rows.append(fail(errors, "decode", what, e, precision=precision, beam=beam, batch=batch, system="nmt"))
        translator = eager = None
        free(device)
    return rows


EAGER = "nmt eager"  # nmt with NMT_CUDA_GRAPHS=0 (the JSON's `decode_eager` rows)


def eager_translator(checkpoint: str, device, precision: str):
    """An nmt.Translator that decodes without CUDA graphs (nmt/search/cuda_graphs.py), for the A/B on CUDA."""
    from nmt import Translator

    old = os.environ.get("NMT_CUDA_GRAPHS")
    os.environ["NMT_CUDA_GRAPHS"] = "0"  # read when the engine loads
    try:
        return Translator(checkpoint, device=str(device), precision=precision)
    finally:
        if old is None:
            del os.environ["NMT_CUDA_GRAPHS"]
        else:
            os.environ["NMT_CUDA_GRAPHS"] = old


def decode_rows(precision, beam, batch, lines, L, seconds, outputs, nmt_tokenizer) -> list[dict]:
    """One row per system; the forced length is checked (equal work), `same_lines` compares the searches."""
    n = len(lines)
    nmt_texts = [r.text for r in outputs["nmt"]]
    for name in ("nmt", EAGER):  # an output that ended with EOS was not forced to L tokens
        if any(r.finished for r in outputs.get(name, ())):
            raise RuntimeError(f"{name}: an output ended before the forced length")
    tokens = {"nmt": n * L, EAGER: n * L}
    same = {}  # system -> its share of lines equal to the other's
    if EAGER in outputs:
        same[EAGER] = sum(a.text == b for a, b in zip(outputs[EAGER], nmt_texts)) / n
    if "transformers" in outputs:
        _, ids = outputs["transformers"]
        ends = {nmt_tokenizer.specials.eos, nmt_tokenizer.specials.pad}  # (the export keeps nmt's ids)
        tokens["transformers"] = sum(t not in ends for row in ids for t in row)
        if tokens["transformers"] != n * L:
            raise RuntimeError(f"transformers: {tokens['transformers']} output tokens, {n * L} forced")
        same["nmt"] = same["transformers"] = sum(a == b for a, b in zip(nmt_tokenizer.decode_tgt(ids), nmt_texts)) / n
    return [dict(precision=precision, beam=beam, batch=batch, system=name, sentences=n, length=L, seconds=secs,
                 sent_per_s=n / secs, tok_per_s=tokens[name] / secs, same_lines=same.get(name))
            for name, secs in seconds.items()]


# --------------------------------------------------------------------------- the run

def fail(errors: list, part: str, what: str, e: BaseException, **row) -> dict:
    """Record a failed measurement: printed now, kept in the JSON, exit status 1 at the end."""
    msg = f"{type(e).__name__}: {e}".strip()
    log(f"ERROR in {part} ({what}): {msg}")
    errors.append(dict(part=part, what=what, error=msg))
    return dict(row, error=msg)


def print_table(out: dict) -> None:
    cell = lambda v, f="": format(v, f) if v is not None else "-"
    print(f"# {out['device']} | torch {out['torch']} | transformers {out['transformers'] or 'not installed'} | "
          f"peak {cell(out['peak_flops_per_s'] and out['peak_flops_per_s'] / 1e12, ',.1f')} TFLOP/s "
          f"({out['peak_dtype']} matmul){' | --quick' if out['quick'] else ''}")
    print(f"{'model':>10} {'batch tok':>9} {'system':>12} {'tgt tok/s':>11} {'TFLOP/s':>8} {'MFU':>6} "
          f"{'peak MB':>8} {'nmt x':>6} {'vs step/eager':>13} {'warm-up s':>9}")
    for r in out["train"] + out["train_compiled"]:
        head = f"{r['model']:>10} {cell(r['batch_tokens']):>9} {r['system']:>12}"
        if "error" in r:
            print(f"{head}  ERROR {r['error']}")
            continue
        print(f"{head} {r['tgt_tok_per_s']:>11,.0f} {cell(r.get('tflops'), '.2f'):>8} {cell(r.get('mfu'), '.1%'):>6} "
              f"{cell(r.get('peak_mem_mb'), ',.0f'):>8} {cell(r.get('nmt_speedup'), '.2f'):>6} "
              f"{cell(r.get('vs_step') or r.get('vs_eager'), '.2f'):>13} {cell(r.get('warmup_s'), '.1f'):>9}")
    print(f"{'precision':>9} {'beam':>4} {'batch':>5} {'system':>12} {'sent/s':>9} {'tok/s':>10} {'same lines':>10}")
    for r in out["decode"] + out["decode_eager"]:
        head = f"{cell(r['precision']):>9} {cell(r['beam']):>4} {cell(r['batch']):>5} {r['system']:>12}"
        if "error" in r:
            print(f"{head}  ERROR {r['error']}")
            continue
        print(f"{head} {r['sent_per_s']:>9,.1f} {r['tok_per_s']:>10,.0f} {cell(r['same_lines'], '.1%'):>10}")
    for note in out["notes"]:
        print(f"# note: {note}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto", help="auto (CUDA if available), cuda, cuda:N, cpu")
    ap.add_argument("--quick", action="store_true", help="every part on tiny shapes (a test runs it on CPU)")
    ap.add_argument("--json", metavar="OUT", help="write the results here")
    ap.add_argument("--workdir", help="keep the run's files here (default: a temporary directory, removed)")
    ap.add_argument("--parts", default="train,nmt_train,decode",
                    help="comma-separated parts to run: train (the A/B), nmt_train, decode (runs nmt_train for its "
                         "model); default all. The matmul peak is always measured")
    ap.add_argument("--models", help="comma-separated models of the training A/B (default all: base,big)")
    ap.add_argument("--profile", metavar="DIR", help="after each training A/B shape, profile nmt's steps "
                    "(torch.profiler) into DIR/profile-MODEL-TOKENS.txt: host-bound or device-bound")
    ap.add_argument("--train-set", action="append", default=[], metavar="KEY=VALUE",
                    help="a train key for nmt's runs in every part, e.g. loss_chunk=8192 (repeatable; in the JSON)")
    ap.add_argument("--data-set", action="append", default=[], metavar="KEY=VALUE",
                    help="a data key for every part's batches, e.g. collate=device or 'length_buckets=[16,32,64,128,258]' "
                         "(repeatable; in the JSON)")
    ap.add_argument("--compile", action="store_true", help="a third system in the training A/B, nmt with "
                    "train.compile: true (rows in the JSON's `train_compiled`, with the compilation in warmup_s); "
                    "the `nmt train` part then compiles too")
    args = ap.parse_args()
    parts = {p.strip() for p in args.parts.split(",")}
    if not parts <= {"train", "nmt_train", "decode"}:
        ap.error(f"--parts: unknown part(s) {', '.join(sorted(parts - {'train', 'nmt_train', 'decode'}))}")
    from nmt.device import tune_malloc

    tune_malloc()  # as `nmt train` does (CPU only; before torch allocates)
    import torch

    from nmt.device import resolve_torch_device

    device = resolve_torch_device(args.device)
    plan = QUICK if args.quick else FULL
    if args.models:  # the A/B's models; `nmt train` and decoding keep theirs (plan.e2e)
        chosen = [m.strip() for m in args.models.split(",")]
        unknown = set(chosen) - set(plan.models)
        if unknown:
            ap.error(f"--models: unknown model(s) {', '.join(sorted(unknown))} (this plan has {', '.join(plan.models)})")
        plan = dataclasses.replace(plan, ab_models=tuple(m for m in plan.models if m in chosen))
    global PROFILE_DIR, COMPILE, TRAIN_SET, DATA_SET
    COMPILE = args.compile
    import yaml

    for flag, items, into in (("--train-set", args.train_set, TRAIN_SET), ("--data-set", args.data_set, DATA_SET)):
        for item in items:
            key, sep, value = item.partition("=")
            if not sep:
                ap.error(f"{flag} {item!r}: expected KEY=VALUE, e.g. loss_chunk=8192")
            into[key.strip()] = yaml.safe_load(value)
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
        PROFILE_DIR = args.profile
    try:
        import transformers

        hf_version = transformers.__version__
        transformers.utils.logging.disable_progress_bar()  # from_pretrained's "Loading weights" bars
    except ImportError:
        hf_version = None
    notes = [] if hf_version else ["transformers is not installed: its rows are skipped"]
    errors: list[dict] = []
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    out = dict(device=f"{device} ({name})", torch=torch.__version__, transformers=hf_version, quick=args.quick,
               peak_flops_per_s=None, peak_dtype=None, part_seconds={}, notes=notes, errors=errors, train=[], decode=[],
               decode_eager=[], train_compiled=[], compile=COMPILE, train_set=dict(TRAIN_SET), data_set=dict(DATA_SET),
               parts=sorted(parts))
    with tempfile.TemporaryDirectory(prefix="bench_gpu-") as tmp:
        work = args.workdir or tmp
        os.makedirs(work, exist_ok=True)

        def part(key: str, fn):
            t0 = time.perf_counter()
            try:
                return fn()
            except Exception as e:  # noqa: BLE001 (recorded, reported, exit status 1)
                fail(errors, key, key, e)
                return None
            finally:
                out["part_seconds"][key] = round(time.perf_counter() - t0, 1)

        log(f"device {out['device']}, torch {torch.__version__}, transformers {hf_version}")
        peak = part("peak", lambda: measure_peak(device, plan))
        if peak:
            out["peak_flops_per_s"], out["peak_dtype"] = peak
            log(f"matmul peak {peak[0] / 1e12:,.2f} TFLOP/s ({peak[1]})")
        peak_flops = out["peak_flops_per_s"]  # None: no MFU
        if "train" in parts:
            train = part("train", lambda: train_ab(plan, work, device, peak_flops, bool(hf_version), errors))
            train = train if train is not None else [dict(model=None, batch_tokens=None, system="nmt",
                                                          error=errors[-1]["error"])]
            out["train"] = [r for r in train if r["system"] != COMPILED]
            out["train_compiled"] = [r for r in train if r["system"] == COMPILED]
        if not parts & {"nmt_train", "decode"}:
            e2e = False
        else:
            e2e = part("nmt_train", lambda: train_e2e(plan, work, device, peak_flops,
                                                      out["train"] + out["train_compiled"]))
        if e2e is False:
            pass
        elif e2e is None:  # (its error is recorded); decoding needs its checkpoint
            out["train"].append(dict(model=plan.e2e[0], batch_tokens=plan.e2e[1], system="nmt train",
                                     error=errors[-1]["error"]))
            if "decode" in parts:
                out["decode"] = [fail(errors, "decode", "decode", RuntimeError("needs the nmt train part's checkpoint"),
                                      precision=None, beam=None, batch=None, system="nmt")]
        else:
            out["train"].append(e2e[0])
            checkpoint = e2e[1]
            if "decode" in parts:
                decode = part("decode", lambda: decode_ab(plan, work, device, checkpoint, bool(hf_version), errors))
                decode = decode if decode is not None else [dict(precision=None, beam=None, batch=None,
                                                                 system="nmt", error=errors[-1]["error"])]
                out["decode"] = [r for r in decode if r["system"] != EAGER]
                out["decode_eager"] = [r for r in decode if r["system"] == EAGER]
    out["elapsed_s"] = round(time.perf_counter() - T0, 1)
    if args.json:
        with open(args.json + ".tmp", "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
        os.replace(args.json + ".tmp", args.json)
    print_table(out)
    log(f"done in {out['elapsed_s']} s" + (f"; {len(errors)} part(s) FAILED" if errors else ""))
    for e in errors:
        print(f"bench_gpu: {e['part']} ({e['what']}) failed: {e['error']}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
