"""Training-step variants on one GPU: the experiment behind BENCHMARKS.md "The training step compiled"
(issue 36, session of 2026-11-28). Kept as it ran, so that its numbers can be reproduced; the supported
measurement is `scripts/bench_gpu.py --compile`.

    python3 docs/experiments/train_step_variants.py --out DIR --budget 230 --variants eager,nosync,compiled_loss

Variants, on the same model (weights continue from one variant to the next) and the same pre-collated
batches of scripts/bench_gpu.py's base and big models: eager (nmt's train_step), nosync (the same without
the per-step finiteness check, i.e. without its host sync), compiled (torch.compile of the whole model,
dynamic shapes), compiled_loss (the whole model and the loss in one compiled function, dynamic shapes),
regional (train.compile as it landed afterwards: Transformer.compile_layers and the compiled loss;
added after the GPU run, never run on a GPU yet; in place, so keep it last). Per variant: tokens/s,
step time, MFU, the first two steps' time (compilation), and a torch.profiler table of 5 steps in
DIR/prof-MODEL-TOKENS-VARIANT.txt (per step: wall time under the profiler and the sum of the kernels'
self device time)."""
import os, sys, time, json, argparse
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import torch
import bench_gpu as bg
from nmt.config import replace
from nmt.training.logging_utils import RunLogger
from nmt.train import build_training
from nmt.training.step import train_step
from nmt.training.loss import label_smoothed_nll
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("--quick", action="store_true")
ap.add_argument("--out", default="/tmp/exp")
ap.add_argument("--budget", type=float, default=250)
ap.add_argument("--models", default="base,big")
ap.add_argument("--variants", default="eager,nosync,compiled_loss,compiled")
ap.add_argument("--big-variants", default="eager,compiled_loss")
args = ap.parse_args()
os.makedirs(args.out, exist_ok=True)
T0 = time.perf_counter()
dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
plan = bg.QUICK if args.quick else bg.FULL
peak, _ = bg.measure_peak(dev, plan)
print(f"peak {peak/1e12:.0f} TFLOP/s", flush=True)
results = []


def nosync_step(tr, batch):
    t = tr.cfg.train
    opt = tr.optimizer
    opt.zero_grad(set_to_none=True)
    with tr.precision.autocast():
        logits = tr.forward(batch.src, batch.src_mask, batch.tgt_in)
    loss, nll = label_smoothed_nll(logits, batch.tgt_out, t.label_smoothing, tr.tokenizer.specials.pad)
    (loss / batch.n_tgt_tokens).backward()
    params = [p for g in opt.param_groups for p in g["params"] if p.grad is not None]
    torch.nn.utils.clip_grad_norm_(params, t.clip_norm, foreach=True)
    opt.step()
    tr.scheduler.step()


def make_fused(tr):
    """compiled forward + cross_entropy loss in one compiled function."""
    model, pad, eps = tr.model, tr.tokenizer.specials.pad, tr.cfg.train.label_smoothing

    def fwd_loss(src, src_mask, tgt_in, tgt_out):
        with tr.precision.autocast():
            logits = model(src, src_mask, tgt_in)
        lg = logits.float().flatten(0, 1)
        tgt = tgt_out.flatten()
        loss = F.cross_entropy(lg, tgt, ignore_index=pad, label_smoothing=eps, reduction="sum")
        nll = F.cross_entropy(lg, tgt, ignore_index=pad, reduction="sum").detach()
        return loss, nll
    return torch.compile(fwd_loss, dynamic=True)


def fused_step(tr, fn, batch):
    t = tr.cfg.train
    opt = tr.optimizer
    opt.zero_grad(set_to_none=True)
    loss, nll = fn(batch.src, batch.src_mask, batch.tgt_in, batch.tgt_out)
    (loss / batch.n_tgt_tokens).backward()
    params = [p for g in opt.param_groups for p in g["params"] if p.grad is not None]
    gn = torch.nn.utils.clip_grad_norm_(params, t.clip_norm, foreach=True)
    ok = torch.stack([loss, gn.float()]).isfinite().all().item()
    if ok:
        opt.step()
        tr.scheduler.step()


def timed(step, batches, n_warm, rounds, per):
    for i in range(n_warm):
        step(batches[i][0])
    bg.sync(dev)
    secs, toks, flops, k = 0.0, 0, 0.0, n_warm
    for _ in range(rounds):
        bg.sync(dev); t0 = time.perf_counter()
        for i in range(k, k + per):
            step(batches[i][0])
        bg.sync(dev); secs += time.perf_counter() - t0
        for b, _, f in batches[k:k + per]:
            toks += b.n_tgt_tokens; flops += f
        k += per
    return secs, toks, flops, rounds * per


def profile(step, batches, path):
    from torch.profiler import ProfilerActivity, profile as prof_
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    bg.sync(dev); t0 = time.perf_counter()
    with prof_(activities=acts) as p:
        for b, _, _ in batches:
            step(b)
        bg.sync(dev)
    wall = (time.perf_counter() - t0) / len(batches)
    ev = p.key_averages()
    kern = sum(getattr(e, "self_device_time_total", 0) for e in ev) / 1e3 / len(batches)
    n_k = sum(getattr(e, "count", 0) for e in ev if getattr(e, "self_device_time_total", 0) > 0 and e.device_type.name == "CUDA") / len(batches) if dev.type == "cuda" else 0
    with open(path, "w") as f:
        f.write(f"wall {wall*1e3:.1f} ms, kernel {kern:.1f} ms per step, kernel launches ~{n_k:.0f}\n")
        for key in ("self_device_time_total", "self_cpu_time_total"):
            try:
                f.write(ev.table(sort_by=key, row_limit=40) + "\n")
            except Exception as e:
                f.write(f"({key}: {e})\n")
    return wall * 1e3, kern, n_k


work = args.out + "/work"
need = plan.warmup + 3 * plan.round_steps + 5
for name in args.models.split(","):
    cfg = bg.bench_config(plan, work, "ab", name, plan.batch_tokens[-1], str(dev))
    tr = build_training(cfg, cfg.run_dir, dev, RunLogger(cfg.run_dir, enabled=False))
    for bt in plan.batch_tokens[::-1]:
        batches = bg.precollate(tr, replace(cfg, data=replace(cfg.data, batch_tokens=bt)), need, dev)
        for v in (args.variants if name == "base" else args.big_variants).split(","):
            if time.perf_counter() - T0 > args.budget:
                print(f"budget spent, skipping {name} {bt} {v}", flush=True); continue
            if bt != plan.batch_tokens[-1] and v not in ("eager", "compiled_loss"):
                continue
            t1 = time.perf_counter()
            try:
                if v == "eager":
                    tr.forward = tr.model
                    step = lambda b: train_step(tr.forward, [b], tr.optimizer, tr.scheduler, tr.precision,
                                                label_smoothing=0.1, clip_norm=1.0, pad_id=tr.tokenizer.specials.pad)
                elif v == "nosync":
                    tr.forward = tr.model
                    step = lambda b: nosync_step(tr, b)
                elif v == "compiled":
                    tr.forward = torch.compile(tr.model, dynamic=True)
                    step = lambda b: train_step(tr.forward, [b], tr.optimizer, tr.scheduler, tr.precision,
                                                label_smoothing=0.1, clip_norm=1.0, pad_id=tr.tokenizer.specials.pad)
                elif v == "regional":
                    from nmt.training.loss import compiled_smoothed_nll
                    tr.model.compile_layers()
                    tr.forward, tr.loss_fn = tr.model, compiled_smoothed_nll()
                    step = lambda b: train_step(tr.forward, [b], tr.optimizer, tr.scheduler, tr.precision,
                                                label_smoothing=0.1, clip_norm=1.0, pad_id=tr.tokenizer.specials.pad,
                                                loss_fn=tr.loss_fn)
                elif v == "compiled_loss":
                    fn = getattr(tr, "_fused", None) or make_fused(tr)
                    tr._fused = fn
                    step = lambda b: fused_step(tr, fn, b)
                step(batches[0][0]); step(batches[1][0]); bg.sync(dev)
                first = time.perf_counter() - t1
                secs, toks, flops, n = timed(step, batches, plan.warmup, 3, plan.round_steps)
                wall, kern, nk = profile(step, batches[-5:], f"{args.out}/prof-{name}-{bt}-{v}.txt")
                r = dict(model=name, bt=bt, variant=v, tok_s=toks / secs, step_ms=1e3 * secs / n,
                         mfu=flops / secs / peak, prof_wall_ms=wall, kernel_ms=kern, launches=nk, first_s=first)
            except Exception as e:
                import traceback; traceback.print_exc()
                r = dict(model=name, bt=bt, variant=v, error=repr(e)[:300])
            results.append(r)
            print(json.dumps(r), flush=True)
    tr = batches = None
    bg.free(dev)
json.dump(results, open(args.out + "/exp_train.json", "w"), indent=1)
print(f"{'model':5} {'bt':>6} {'variant':14} {'tok/s':>9} {'step ms':>8} {'MFU':>6} {'kern ms':>8} {'launch':>7} {'first s':>7}")
for r in results:
    if "error" in r:
        print(r["model"], r["bt"], r["variant"], "ERROR", r["error"][:150]); continue
    print(f"{r['model']:5} {r['bt']:6} {r['variant']:14} {r['tok_s']:9.0f} {r['step_ms']:8.1f} {r['mfu']*100:5.1f}% {r['kernel_ms']:8.1f} {r['launches']:7.0f} {r['first_s']:7.1f}")
print(f"total {time.perf_counter()-T0:.0f} s")
