#!/usr/bin/env python3
"""What data.length_buckets and data.same_source_length do to one epoch's batches (issue 56): batches,
padding efficiency and distinct batch shapes, against today's batching. Counts only, no timing.

    python3 scripts/batch_shapes.py -c CHECKPOINT --src data/bible-es-en/train.es.gz \
        --tgt data/bible-es-en/train.en.gz --batch-tokens 8192 32768 [--json OUT]

The pairs are encoded by the checkpoint's tokenizer and filtered as `nmt train` does by length
(data.max_len, --max-len); batches are `nmt.data.batches.batch_indices` of epoch 1, seed 1.
Padding efficiency = real positions / padded positions over both sides (the training log's
`padding_efficiency`); with buckets the padded tensors are the bucket shapes, extra rows included.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

BUCKETS = [16, 24, 32, 48, 64, 96, 128, 192, 258]  # the last: data.max_len + 2 for the default max_len 256


def report(s: np.ndarray, t: np.ndarray, budget: int, variant: str) -> dict:
    from nmt.data.batches import batch_indices, bucket_shape

    buckets = BUCKETS if variant == "length_buckets" else ()
    batches = batch_indices(s, t, budget, seed=1, epoch=1, buckets=buckets,
                            same_source_length=variant == "same_source_length")
    real = int((s + 1).sum() + (t + 1).sum())
    padded, shapes = 0, set()
    for b in batches:
        if buckets:
            rows, length = bucket_shape(s[b], t[b], buckets, budget)
            shape = (rows, length, length)
        else:
            shape = (len(b), int(s[b].max()) + 1, int(t[b].max()) + 1)
        padded += shape[0] * (shape[1] + shape[2])
        shapes.add(shape)
    return {"variant": variant, "batch_tokens": budget, "batches": len(batches),
            "padding_efficiency": real / padded, "shapes": len(shapes)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-c", "--checkpoint", required=True)
    ap.add_argument("--src", required=True)
    ap.add_argument("--tgt", required=True)
    ap.add_argument("--batch-tokens", type=int, nargs="+", default=[8192, 32768])
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args()
    from nmt.model.checkpoint import load_record
    from nmt.textio import read_lines

    tok = load_record(args.checkpoint).load_tokenizer()
    src = [len(x) for x in tok.encode_src(read_lines(args.src))]
    tgt = [len(y) for y in tok.encode_tgt(read_lines(args.tgt))]
    s, t = np.array(src), np.array(tgt)
    keep = (s <= args.max_len) & (t <= args.max_len) & (s > 0) & (t > 0)
    s, t = s[keep], t[keep]
    rows = [report(s, t, budget, v) for budget in args.batch_tokens
            for v in ("default", "length_buckets", "same_source_length")]
    print(f"{len(s):,} pairs; buckets {BUCKETS}")
    print(f"{'variant':>20} {'batch tokens':>12} {'batches':>8} {'padding eff.':>12} {'shapes':>7}")
    for r in rows:
        print(f"{r['variant']:>20} {r['batch_tokens']:>12,} {r['batches']:>8,} {r['padding_efficiency']:>12.3f} "
              f"{r['shapes']:>7,}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"pairs": len(s), "buckets": BUCKETS, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
