"""Micro-benchmark of joined decoding steps (nmt/search/joining.py): what a decoding step costs for its rows,
and what running the steps of two searches as one batch saves against running them one after the other.

    python3 scripts/bench_joined.py -c runs/quickstart/checkpoints/best.pt [--rows 1 5 ... 512] [--json OUT]

For each row count R: a cache of R rows (source length `--src-len`) filled to position 16, then the median
time of `--steps` decode steps (ms per step and per row). For each pair (a, b) in `--pairs`: two searches'
caches, their two steps one after the other against one `joined_step` over both (median of `--steps`).
StepPool's JOIN_ROWS is read off the first table: where the time per step starts to grow with the rows.
The model comes from the checkpoint as `nmt translate` loads it (CPU fast paths on).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from nmt.search.joining import joined_step
from nmt.translation.torch_engine import TorchEngine


def cache_of(engine, rows: int, src_len: int, steps: int, filled: int = 16):
    """A cache of `rows` rows filled to position `filled`, with room for 2 x `steps` more, and its tokens."""
    model = engine.model
    filled = max(0, min(filled, model.max_positions - 1 - 2 * steps))
    src = torch.randint(5, 20, (rows, src_len), generator=torch.Generator().manual_seed(rows))
    mask = torch.ones(rows, src_len, dtype=torch.bool)
    cache = model.init_cache(model.encode(src, mask), mask, filled + 2 * steps, cache_cls=engine.ops.cache_cls)
    tokens = torch.full((rows,), 5)
    for _ in range(filled):
        model.decode_step(tokens, cache)
    return cache, tokens


def median_ms(fn, steps: int) -> float:
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", "-c", required=True)
    p.add_argument("--rows", type=int, nargs="*", default=[1, 5, 10, 20, 40, 64, 80, 160, 256, 320, 512])
    p.add_argument("--pairs", default="1x1,5x5,5x20,20x40,5x256,256x256", help="row counts of two searches, a,b,...")
    p.add_argument("--src-len", type=int, default=30)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--json", metavar="OUT")
    args = p.parse_args(argv)
    engine = TorchEngine.load(args.checkpoint, "cpu")
    model = engine.model
    out = {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(), "rows": [],
           "pairs": []}
    print(f"{torch.get_num_threads()} threads; src_len {args.src_len}")
    with torch.inference_mode():
        for rows in args.rows:
            cache, tokens = cache_of(engine, rows, args.src_len, args.steps)
            ms = median_ms(lambda: model.decode_step(tokens, cache), args.steps)
            out["rows"].append({"rows": rows, "ms_per_step": ms, "ms_per_row": ms / rows})
            print(f"{rows:5d} rows: {ms:7.2f} ms a step, {ms / rows:.3f} ms a row")
        for pair in args.pairs.split(","):
            a, b = (int(x) for x in pair.split("x"))
            (ca, ta), (cb, tb) = (cache_of(engine, n, args.src_len, args.steps) for n in (a, b))
            apart = median_ms(lambda: (model.decode_step(ta, ca), model.decode_step(tb, cb)), args.steps)
            joined = median_ms(lambda: joined_step([(model, ca, ta), (model, cb, tb)]), args.steps)
            out["pairs"].append({"rows": [a, b], "apart_ms": apart, "joined_ms": joined})
            print(f"{a} + {b} rows: apart {apart:.2f} ms, joined {joined:.2f} ms ({apart / joined:.2f}x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
