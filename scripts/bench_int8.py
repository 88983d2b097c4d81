"""Per-call time of a decoding step's linear layers on CPU: fp32 `F.linear`, PyTorch's int8 matmul alone
(`torch._int_mm`, int8 x int8 -> int32, activations already quantized), nmt's `Int8Linear` (per-row
activation quantization + `torch._int_mm` + rescaling: what `--precision int8` runs) and FBGEMM's
`quantized::linear_dynamic` (quantization inside the kernel, one activation scale per call), for the
shapes of the quickstart model (d_model 256, FFN 1024, 8k vocabulary) at 32 and 160 rows (greedy and
beam 5 at batch 32). Median of --calls calls after 20 warm-up calls.

    python scripts/bench_int8.py --threads 2 --json int8.json

Answers "why is nmt's int8 not faster than its fp32 on this model" (BENCHMARKS.md, "Lean inference").
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings


SHAPES = ((256, 768), (256, 256), (256, 1024), (1024, 256), (256, 8000))  # (in, out): qkv, out, FFN in/out, vocabulary


def median_us(fn, calls: int) -> float:
    for _ in range(20):
        fn()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[32, 160])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F
    from torch import nn

    from nmt.model.precision import Int8Linear

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows_out = []
    print(f"{'rows':>5} {'in':>5} {'out':>5} {'fp32':>8} {'_int_mm':>8} {'Int8Linear':>10} {'fbgemm':>8}   (us per call)")
    for rows in args.rows:
        for k, n in SHAPES:
            lin = nn.Linear(k, n).eval()
            x = torch.randn(rows, k)
            q8 = Int8Linear.from_linear(lin)
            xq = torch.randint(-127, 127, (rows, k), dtype=torch.int8)
            with torch.inference_mode():
                r = dict(rows=rows, inputs=k, outputs=n,
                         fp32=median_us(lambda: F.linear(x, lin.weight, lin.bias), args.calls),
                         int_mm=median_us(lambda: torch._int_mm(xq, q8.weight_t), args.calls),
                         int8_linear=median_us(lambda: q8(x), args.calls), fbgemm=None)
                try:  # deprecated quantized tensors (pytorch/pytorch#184982): may be gone in a later torch
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        w = torch.quantize_per_tensor(lin.weight.detach(), 0.01, 0, torch.qint8)
                        packed = torch.ops.quantized.linear_prepack(w, lin.bias.detach())
                    r["fbgemm"] = median_us(lambda: torch.ops.quantized.linear_dynamic(x, packed, False), args.calls)
                except (RuntimeError, AttributeError):
                    pass
            rows_out.append(r)
            fb = f"{r['fbgemm']:8.1f}" if r["fbgemm"] is not None else f"{'-':>8}"
            print(f"{rows:>5} {k:>5} {n:>5} {r['fp32']:8.1f} {r['int_mm']:8.1f} {r['int8_linear']:10.1f} {fb}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(threads=args.threads, calls=args.calls, torch=torch.__version__, results=rows_out), f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
