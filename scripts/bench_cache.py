"""Micro-benchmark: per-step decoder time with and without the DecoderCache.

Model: d_model 256, 3+3 layers, 4 heads, FFN 1024, vocabulary 8000 (random
weights; speed does not depend on them). Rows: `--batch` sentences x `--beam`
beam-like rows, source length `--src-len`.

Variants, timed per step at several target positions:
- cached:    init_cache once, decode_step per step, beam-like `reorder` after
             each step (a random permutation inside each sentence's rows), with the
             cache `nmt translate` uses on CPU (nmt.search.fast.ReusingDecoderCache): self K/V
             preallocated to max_len, reorder gathers the filled prefix into reused
             spare buffers; cross K/V stored once per sentence (never copied by beam
             reorders).
- cached-rows: the same cache class, but cross K/V kept per row and gathered at
             every reorder (fairseq's layout), to measure what grouping saves.
- cat:       self K/V grown by torch.cat each step and gathered whole into new
             tensors at each reorder (fairseq's self-attention cache).
- uncached:  model.decode on the whole prefix, last position taken; timed at the
             reported positions only (its cost depends only on the prefix length).

Usage: python scripts/bench_cache.py [--steps 128] [--threads 2] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch


from nmt.search.cache import DecoderCache
from nmt.config import ModelConfig
from nmt.search.fast import ReusingDecoderCache
from nmt.masks import padding_mask
from nmt.model.transformer import Transformer

VOCAB = 8000


def build(seed: int) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=256, n_heads=4, layers=3, ffn_dim=1024, max_positions=1024)
    return Transformer(cfg, VOCAB, VOCAB).eval()


def beam_indices(n_src: int, beam: int, gen: torch.Generator) -> torch.Tensor:
    """A random permutation inside each sentence's `beam` rows: [n_src * beam]."""
    perm = torch.stack([torch.randperm(beam, generator=gen) for _ in range(n_src)])  # [N,K]
    return (perm + torch.arange(n_src)[:, None] * beam).flatten()


class CatCache(DecoderCache):
    """fairseq's self-attention cache: one position at first, grown by torch.cat at every
    step, gathered whole into new tensors at every reorder (the variant `cat`)."""

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.length == self.self_k[layer].shape[2]:  # full: grow by one position (a copy of the past)
            grow = lambda t: torch.cat([t, t.new_empty(t.shape[:2] + (1,) + t.shape[3:])], dim=2)  # noqa: E731
            self.self_k[layer], self.self_v[layer] = grow(self.self_k[layer]), grow(self.self_v[layer])
        return super().append(layer, k, v)

    def next_position(self) -> int:
        return self.length

    def _reorder_self(self, indices: torch.Tensor) -> None:
        self.self_k = [t.index_select(0, indices) for t in self.self_k]
        self.self_v = [t.index_select(0, indices) for t in self.self_v]


def run_cached(model, src, src_mask, steps, beam, variant, seed, clock) -> list[float]:
    """Seconds per step for steps 0..steps-1 (step p decodes position p, then reorders)."""
    gen = torch.Generator().manual_seed(seed)
    n_src = src.shape[0]
    expand = torch.arange(n_src).repeat_interleave(beam)
    reorders = [beam_indices(n_src, beam, gen) for _ in range(steps)]
    times = []
    with torch.inference_mode():
        memory = model.encode(src, src_mask)
        if variant == "cached-rows":  # per-row cross K/V: every reorder gathers them
            cache = model.init_cache(memory[expand], src_mask[expand], steps, cache_cls=ReusingDecoderCache)
        else:
            cls = CatCache if variant == "cat" else ReusingDecoderCache
            cache = model.init_cache(memory, src_mask, 1 if variant == "cat" else steps, cache_cls=cls)
            cache.reorder(expand)
        tokens = torch.randint(4, VOCAB, (n_src * beam,), generator=gen)
        for idx in reorders:
            t0 = clock()
            logits = model.decode_step(tokens, cache)
            tokens = logits.argmax(-1)[idx]
            cache.reorder(idx)
            times.append(clock() - t0)
    return times


def run_uncached(model, src, src_mask, positions, beam, seed, clock) -> dict[int, float]:
    """Seconds for one uncached step at each position (decode on the prefix 0..p)."""
    gen = torch.Generator().manual_seed(seed)
    n_src = src.shape[0]
    expand = torch.arange(n_src).repeat_interleave(beam)
    out = {}
    with torch.inference_mode():
        memory = model.encode(src, src_mask)[expand]
        mask = src_mask[expand]
        prefix = torch.randint(4, VOCAB, (n_src * beam, max(positions) + 1), generator=gen)
        for p in positions:
            t0 = clock()
            logits = model.decode(prefix[:, : p + 1], memory, mask)[:, -1]
            logits.argmax(-1)
            out[p] = clock() - t0
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--src-len", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3, help="runs per variant; the median step time is reported")
    ap.add_argument("--variants", default="cached,cached-rows,cat,uncached")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="wall: time.perf_counter; cpu: time.process_time (CPU time of this process, "
                         "robust to other load when --threads 1)")
    ap.add_argument("--json", metavar="OUT", help="also write the results as JSON")
    args = ap.parse_args(argv)
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    torch.set_num_threads(args.threads)
    model = build(0)
    gen = torch.Generator().manual_seed(1)
    lengths = torch.randint(args.src_len // 2, args.src_len + 1, (args.batch,), generator=gen)
    lengths[0] = args.src_len
    src_mask = padding_mask(lengths, args.src_len)
    src = torch.randint(4, VOCAB, (args.batch, args.src_len), generator=gen).masked_fill(~src_mask, 0)
    positions = [p for p in (0, 1, 3, 7, 15, 31, 63, 127, 255, 511) if p < args.steps]
    variants = args.variants.split(",")

    # Variants are interleaved within each repeat so that load from other processes
    # hits them alike; a position's time is the median over repeats and the steps
    # p-2 .. p+2 (a step's cost changes slowly with p).
    for v in variants:  # warm-up (first-call allocations, kernel selection)
        if v == "uncached":
            run_uncached(model, src, src_mask, positions[:3], args.beam, 0, clock)
        else:
            run_cached(model, src, src_mask, min(args.steps, 16), args.beam, v, 0, clock)
    runs: dict[str, list] = {v: [] for v in variants}
    for r in range(args.repeats):
        for v in variants:
            if v == "uncached":
                runs[v].append(run_uncached(model, src, src_mask, positions, args.beam, r, clock))
            else:
                runs[v].append(run_cached(model, src, src_mask, args.steps, args.beam, v, r, clock))
    results: dict[str, dict] = {}
    for v in variants:
        if v == "uncached":
            per_pos = {p: statistics.median(r[p] for r in runs[v]) for p in positions}
            results[v] = {"per_position_ms": {p + 1: 1e3 * t for p, t in per_pos.items()}}
            continue
        window = lambda p: [r[q] for r in runs[v] for q in range(max(0, p - 2), min(args.steps, p + 3))]
        totals = [sum(r) for r in runs[v]]
        results[v] = {"per_position_ms": {p + 1: 1e3 * statistics.median(window(p)) for p in positions},
                      "first16_ms": 1e3 * statistics.median(t for r in runs[v] for t in r[:16]),
                      "mean_ms": 1e3 * statistics.median(totals) / args.steps,
                      "total_s": statistics.median(totals)}

    rows = args.batch * args.beam
    print(f"# decode step time (ms), {rows} rows = {args.batch} x {args.beam}, src len <= {args.src_len}, "
          f"{args.steps} steps, {args.threads} threads, {args.clock} clock, torch {torch.__version__}, {platform.processor() or platform.machine()}")
    print("| position | " + " | ".join(variants) + " |")
    print("|---" * (len(variants) + 1) + "|")
    for p in positions:
        cells = [f"{results[v]['per_position_ms'][p + 1]:.2f}" for v in variants]
        print(f"| {p + 1} | " + " | ".join(cells) + " |")
    for key, label in (("first16_ms", f"median 1-{min(16, args.steps)}"), ("mean_ms", f"mean 1-{args.steps}"), ("total_s", f"total {args.steps} steps (s)")):
        cells = [f"{results[v][key]:.2f}" if key in results[v] else "-" for v in variants]
        print(f"| {label} | " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "torch": torch.__version__, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
