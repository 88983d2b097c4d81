"""Training throughput benchmark: tokens/s, step time, padding, memory and MFU.

    python scripts/bench_train.py --config configs/quickstart.yaml --steps 40 --json out.json

Runs the real training step (`nmt.training.step.train_step`: forward, label-smoothed
loss, backward, clipping, AdamW, schedule) on the config's real batches, times
`--steps` steps after `--warmup` untimed ones, and reports:

- target tokens/s and source+target tokens/s (real tokens: no padding),
- step time, padding efficiency (real / padded positions, source + target),
- peak memory (CPU: process peak RSS; CUDA: max allocated),
- MFU = model FLOPs per second / the device's measured peak.

Model FLOPs of one training step (forward + backward = 3 x forward; matmul
FLOPs only, 2 per multiply-add, real tokens only, so padding counts as waste):
for a pair with s source and t target positions, d = d_model, f = ffn_dim,
V = target vocabulary, Le/Ld encoder/decoder layers,

    forward = s * Le * (8 d^2 + 4 d f)                 encoder projections + FFN
            + Le * 4 s^2 d                              encoder attention (QK^T, AV)
            + s * Ld * 4 d^2                            cross-attention K/V of the memory
            + t * Ld * (12 d^2 + 4 d f)                 decoder self/cross projections + FFN
            + Ld * (2 t^2 d + 4 t s d)                  causal self-attention (half of t^2), cross-attention
            + t * 2 d V                                 output projection

which is the usual 6 x parameters x tokens (embeddings excluded, the output
projection included) plus the attention terms. The peak is measured here: a
large fp32 matmul on CPU, a bf16 matmul on CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time

from nmt.benchmarking import forward_flops


def measure_peak(torch, device) -> float:
    """FLOP/s of a large matmul: fp32 on CPU, bf16 on CUDA."""
    if device.type == "cuda":
        n, dtype, reps = 8192, torch.bfloat16, 20
    else:
        n, dtype, reps = 2048, torch.float32, 10
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    if device.type == "cuda":
        torch.cuda.synchronize()
    return 2 * n ** 3 * reps / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--steps", type=int, default=30, help="timed steps")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    ap.add_argument("--threads", type=int, default=2, help="torch threads on CPU (0 = default)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--workdir", help="where the tokenizer and encoded corpus are cached (default: a temp dir)")
    ap.add_argument("--no-cpu-tuning", action="store_true",
                    help="without the allocator tuning and numpy dropout (as NMT_CPU_TUNING=0)")
    ap.add_argument("--cudnn-attention", action="store_true",
                    help="CUDA: let SDPA pick cuDNN's attention again (nmt turns it off: device.avoid_cudnn_attention)")
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args()
    if args.no_cpu_tuning:
        os.environ["NMT_CPU_TUNING"] = "0"
    from nmt.device import tune_malloc

    tune_malloc()  # as `nmt train` does
    import numpy as np
    import torch

    from nmt.config import load_config, replace
    from nmt.data.batches import epoch_batches, training_batch
    from nmt.device import resolve_torch_device as resolve_device
    from nmt.training.logging_utils import RunLogger
    from nmt.training.step import train_step
    from nmt.train import build_training

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = load_config(args.config, args.overrides)
    # a step budget the schedules accept whatever the config's budget is (only the first steps run)
    cfg = replace(cfg, train=replace(cfg.train, max_steps=max(cfg.train.max_steps, 10**6), schedule_clock="steps"))
    device = resolve_device(args.device if args.device != "auto" else cfg.train.device)
    workdir = args.workdir or tempfile.mkdtemp(prefix="nmt-bench-")
    os.makedirs(workdir, exist_ok=True)
    tr = build_training(cfg, workdir, device, RunLogger(workdir, enabled=False))  # exactly what nmt train runs
    train, tokenizer, model, precision = tr.train_data, tr.tokenizer, tr.model, tr.precision
    if args.cudnn_attention:
        torch.backends.cuda.enable_cudnn_sdp(True)
    optimizer, scheduler, fwd, t = tr.optimizer, tr.scheduler, tr.forward, cfg.train
    batches = epoch_batches(train, cfg, 1)
    need = (args.warmup + args.steps) * t.update_freq
    batches = (batches * (need // len(batches) + 1))[:need]

    m = cfg.model
    Le, Ld, d, f, V = m.n_encoder_layers, m.n_decoder_layers, m.d_model, m.ffn_dim, tokenizer.tgt_vocab_size
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    real_src = real_tgt = padded = 0
    flops = 0.0
    step_times = []
    for step in range(args.warmup + args.steps):
        group = [training_batch(train, b, cfg.data, tokenizer.specials, pin_memory=device.type == "cuda")
                 for b in batches[step * t.update_freq:(step + 1) * t.update_freq]]  # (as nmt train: the data keys)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        group = [b.to(device) for b in group]
        res = train_step(fwd, group, optimizer, scheduler, precision, label_smoothing=t.label_smoothing,
                         clip_norm=t.clip_norm, pad_id=tokenizer.specials.pad, loss_fn=tr.loss_fn)
        if device.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if step < args.warmup:
            continue
        step_times.append(dt)
        for b in group:
            tl = (b.tgt_out != tokenizer.specials.pad).sum(1).cpu().numpy()
            sl = b.src_mask.sum(1).cpu().numpy() if b.src_mask is not None else np.full(len(tl), b.src.shape[1])
            sl, tl = sl[tl > 0], tl[tl > 0]  # (rows a bucket adds have no target)
            real_src += int(sl.sum())
            real_tgt += int(tl.sum())
            padded += b.src.numel() + b.tgt_in.numel()
            flops += 3 * forward_flops(sl, tl, d, f, V, Le, Ld)
        assert res.updated
    total = sum(step_times)
    peak = measure_peak(torch, device)
    mem = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else \
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = dict(config=args.config, overrides=args.overrides, device=str(device), torch=torch.__version__,
               threads=torch.get_num_threads(), precision=precision.name, cpu_tuning=not args.no_cpu_tuning, compiled=t.compile,
               parameters=model.num_parameters(), steps=args.steps, batch_tokens=cfg.data.batch_tokens,
               update_freq=t.update_freq, tgt_tok_per_s=real_tgt / total, src_tgt_tok_per_s=(real_src + real_tgt) / total,
               step_time_s=total / args.steps, step_time_median_s=float(np.median(step_times)),
               padding_efficiency=(real_src + real_tgt) / padded, peak_mem_mb=mem,
               model_flops_per_s=flops / total, peak_flops_per_s=peak, mfu=flops / total / peak)
    print(f"# {args.config} {' '.join(args.overrides)} | {out['parameters']:,} params | device {device} | "
          f"torch {torch.__version__} | threads {out['threads']} | precision {precision.name} | "
          f"cpu tuning {'off' if args.no_cpu_tuning else 'on'}")
    rows = [("target tokens/s", f"{out['tgt_tok_per_s']:,.0f}"),
            ("source+target tokens/s", f"{out['src_tgt_tok_per_s']:,.0f}"),
            ("step time (mean / median)", f"{out['step_time_s'] * 1000:.0f} / {out['step_time_median_s'] * 1000:.0f} ms"),
            ("padding efficiency", f"{out['padding_efficiency']:.1%}"),
            ("peak memory", f"{mem:,.0f} MB"),
            ("model FLOP/s", f"{out['model_flops_per_s'] / 1e9:,.1f} GFLOP/s"),
            ("measured peak", f"{peak / 1e9:,.1f} GFLOP/s ({'bf16' if device.type == 'cuda' else 'fp32'} matmul)"),
            ("MFU", f"{out['mfu']:.1%}")]
    for k, v in rows:
        print(f"{k:>28}  {v}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
