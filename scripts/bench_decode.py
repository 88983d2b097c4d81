"""Decoding benchmark: sentences/s and target tokens/s, greedy and beam, cached and uncached.

    python scripts/bench_decode.py --checkpoint runs/quickstart/checkpoints/best.pt \
        --input data/bible-es-en/test.es.gz --sentences 500 --force-len 128 --batch-sizes 32 --json out.json

With --force-len N every sentence decodes exactly N tokens (minimum = maximum
output length), so systems are compared at equal work. With --ct2-model DIR (an
`nmt export` of the checkpoint) CTranslate2 float32 is timed on the same sentences
and batch sizes too (its translate_batch call only). Sentences are sorted
by source length and cut into batches of B sentences (as fairseq's
--batch-size does). The uncached path re-runs the decoder over the whole
prefix at each step (quadratic), so it runs on --uncached-sentences only.

Times cover encoding + search on already tokenized input (model load and
tokenization are reported separately as `load_s`); `--whole-command` also times
`nmt translate` end to end as a subprocess (start-up and model load included),
the way the other toolkits were timed in BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import subprocess
import sys
import tempfile
import time



def read_lines(path: str, n: int) -> list[str]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
    lines = [line for line in lines if line.strip()]
    return lines[:n] if n else lines


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_search(engine, src_ids, batch_size, beam, force_len, use_cache, device, torch, workers=1):
    """Encode + search src_ids (subword ids, no EOS) in batches of batch_size sentences (sorted by length)
    through `TorchEngine.search` (the engine's fast paths, and its autocast for --precision bf16/fp16
    entered in each worker thread); with workers > 1 on CPU, as `nmt translate --workers` runs them.
    -> (seconds, output tokens)."""
    from nmt.search import SearchOptions
    from nmt.translation.batching import batch_cost, run_batches

    order = sorted(range(len(src_ids)), key=lambda i: len(src_ids[i]))
    lengths = dict(max_len_a=0.0, max_len_b=force_len, min_len=force_len) if force_len else dict(max_len_a=1.2,
                                                                                                   max_len_b=10)
    options = SearchOptions(beam_size=beam, use_cache=use_cache, specials=engine.tokenizer.specials, **lengths)

    def search(batch):
        return sum(len(h[0].tokens) for h in engine.search(batch, options))

    batches = [[src_ids[i] for i in order[start:start + batch_size]] for start in range(0, len(order), batch_size)]
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    costs = [batch_cost([len(x) + 1 for x in b]) for b in batches]  # as nmt translate schedules them
    n_tokens = sum(n for _, n in run_batches(search, batches, workers, device, costs))
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0, n_tokens


def whole_command(args, lines, beam, batch_size) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        inp = os.path.join(tmp, "in.txt")
        with open(inp, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        cmd = [sys.executable, "-m", "nmt", "translate", "--checkpoint", args.checkpoint, "-i", inp,
               "-o", os.path.join(tmp, "out.txt"), "--beam", str(beam), "--batch-size", str(batch_size),
               "--batch-tokens", "1000000", "--device", args.device, "--precision", args.precision, "--workers", str(args.workers), "--quiet"]
        if args.force_len:
            cmd += ["--max-len-a", "0", "--max-len-b", str(args.force_len), "--min-len", str(args.force_len)]
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads)) if args.threads else dict(os.environ)
        if args.no_cpu_tuning:
            env["NMT_CPU_TUNING"] = "0"
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, env=env)
        return time.perf_counter() - t0


def run_ct2(args) -> list[dict]:
    """Time CTranslate2 in a fresh process (this one's torch OpenMP threads would compete with
    CTranslate2's: in one process it ran at 20.6 instead of 38.5 greedy sentences/s)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--ct2-worker", "--checkpoint", args.checkpoint, "--input", args.input,
           "--sentences", str(args.sentences), "--force-len", str(args.force_len), "--threads", str(args.threads),
           "--workers", str(args.workers),
           "--ct2-model", args.ct2_model, "--batch-sizes", *map(str, args.batch_sizes), "--beams", *map(str, args.beams)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    results = json.loads(out.strip().splitlines()[-1])
    for r in results:
        print(f"{r['search']:>12} {'ct2':>6} {r['batch']:>6} {r['sentences']:>6} {r['seconds']:>8.2f} {r['sent_per_s']:>8.2f} "
              f"{r['tok_per_s']:>9.0f} {r['peak_mem_mb']:>8.0f}", flush=True)
    return results


def ct2_worker(args, lines) -> list[dict]:
    """CTranslate2 float32 (as exported) on the same sentences, sorted by length as nmt's batches are;
    --workers N -> inter_threads N (CTranslate2 runs N of the max_batch_size batches at once), intra_threads threads/N."""
    import ctranslate2
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=os.path.join(args.ct2_model, "spm.model"))
    pieces = sorted((sp.encode(line, out_type=str) + ["</s>"] for line in lines), key=len)
    intra = max(1, args.threads // args.workers) if args.threads else 0
    translator = ctranslate2.Translator(args.ct2_model, device="cpu", intra_threads=intra, inter_threads=args.workers)
    kw = dict(min_decoding_length=args.force_len, max_decoding_length=args.force_len) if args.force_len else \
        dict(max_decoding_length=256)
    translator.translate_batch(pieces[:8], beam_size=5, **dict(kw, max_decoding_length=8, min_decoding_length=0))  # warm-up
    out = []
    for beam in args.beams:
        for bs in args.batch_sizes:
            t0 = time.perf_counter()
            res = translator.translate_batch(pieces, max_batch_size=bs, batch_type="examples", beam_size=beam, **kw)
            secs = time.perf_counter() - t0
            toks = sum(len(r.hypotheses[0]) for r in res)
            r = dict(search=("greedy" if beam == 1 else f"beam{beam}") + "_ct2", beam=beam, cache=True, batch=bs,
                     sentences=len(lines), seconds=secs, sent_per_s=len(lines) / secs, tok_per_s=toks / secs, tokens=toks,
                     peak_mem_mb=peak_rss_mb(), engine=f"ctranslate2 {ctranslate2.__version__} float32",
                     workers=args.workers)
            out.append(r)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--input", required=True, help="source sentences (plain or .gz); blank lines are skipped")
    ap.add_argument("--sentences", type=int, default=500, help="use the first N sentences (0 = all)")
    ap.add_argument("--force-len", type=int, default=0, help="decode exactly N tokens per sentence (0 = natural lengths)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[8, 32, 128], help="sentences per batch")
    ap.add_argument("--beams", type=int, nargs="+", default=[1, 5], help="beam sizes (1 = greedy)")
    ap.add_argument("--uncached-sentences", type=int, default=64, help="sentences for the uncached runs (0 = skip them)")
    ap.add_argument("--whole-command", action="store_true", help="also time `nmt translate` as a subprocess at batch 32")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", default="fp32", help="decode.precision: fp32, bf16, fp16 (GPU), int8 (CPU)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads on CPU (0 = default)")
    ap.add_argument("--workers", type=int, default=1,
                    help="batches decoded at once on CPU, each with THREADS/N threads (`nmt translate --workers`; "
                         "CTranslate2: inter_threads N)")
    ap.add_argument("--ct2-model", metavar="DIR",
                    help="also time CTranslate2 on this export of the checkpoint (`nmt export`): translate_batch on the "
                         "same SentencePiece pieces, max_batch_size = each --batch-sizes value, the call only")
    ap.add_argument("--no-cpu-tuning", action="store_true",
                    help="without the CPU fast paths (as NMT_CPU_TUNING=0)")
    ap.add_argument("--json", metavar="OUT", help="write the results here as JSON")
    ap.add_argument("--ct2-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.ct2_worker:  # child of run_ct2: no torch in this process
        print(json.dumps(ct2_worker(args, read_lines(args.input, args.sentences))))
        return 0
    if args.no_cpu_tuning:
        os.environ["NMT_CPU_TUNING"] = "0"
    from nmt.device import tune_malloc

    tune_malloc(inference=True)  # as `nmt translate` does
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from nmt.translation.torch_engine import TorchEngine

    t0 = time.perf_counter()
    engine = TorchEngine.load(args.checkpoint, args.device, precision=args.precision)  # on CPU with the CPU fast paths, as nmt translate
    model, tokenizer = engine.model, engine.tokenizer
    lines = read_lines(args.input, args.sentences)
    src_ids = tokenizer.encode_src(lines)
    load_s = time.perf_counter() - t0
    device = next(model.parameters()).device
    print(f"# {len(lines)} sentences, device {device}, torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"load+tokenize {load_s:.2f}s, cpu tuning {'off' if args.no_cpu_tuning else 'on'}, workers {args.workers}", flush=True)
    run_search(engine, src_ids[:8], 8, 5, 8, True, device, torch)  # warm-up

    results = []
    header = f"{'search':>8} {'cache':>6} {'batch':>6} {'sents':>6} {'time_s':>8} {'sent/s':>8} {'tok/s':>9} {'rss_MB':>8}"
    print(header)
    for beam in args.beams:
        for use_cache in (True, False):
            n = len(src_ids) if use_cache else min(args.uncached_sentences, len(src_ids))
            if n == 0:
                continue
            for bs in (args.batch_sizes if use_cache else [32]):
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                secs, toks = run_search(engine, src_ids[:n], bs, beam, args.force_len, use_cache, device, torch,
                                        args.workers)
                mem = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else peak_rss_mb()
                r = dict(search="greedy" if beam == 1 else f"beam{beam}", beam=beam, cache=use_cache, batch=bs,
                         sentences=n, seconds=secs, sent_per_s=n / secs, tok_per_s=toks / secs, tokens=toks,
                         peak_mem_mb=mem, workers=args.workers)
                results.append(r)
                print(f"{r['search']:>8} {str(use_cache):>6} {bs:>6} {n:>6} {secs:>8.2f} {r['sent_per_s']:>8.2f} "
                      f"{r['tok_per_s']:>9.0f} {mem:>8.0f}", flush=True)
    speedups = {}
    for beam in args.beams:
        c = [r for r in results if r["beam"] == beam and r["cache"] and r["batch"] == 32]
        u = [r for r in results if r["beam"] == beam and not r["cache"]]
        if c and u:
            speedups[f"beam{beam}"] = c[0]["sent_per_s"] / u[0]["sent_per_s"]
            print(f"# cache speed-up, {'greedy' if beam == 1 else f'beam {beam}'}, batch 32: {speedups[f'beam{beam}']:.1f}x")
    if args.ct2_model:
        results += run_ct2(args)
    whole = {}
    if args.whole_command:
        for beam in args.beams:
            secs = whole_command(args, lines, beam, 32)
            whole[f"beam{beam}"] = dict(seconds=secs, sent_per_s=len(lines) / secs)
            print(f"# whole command `nmt translate`, beam {beam}, batch 32: {secs:.2f}s = {len(lines) / secs:.2f} sent/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(checkpoint=args.checkpoint, input=args.input, force_len=args.force_len, load_s=load_s,
                           torch=torch.__version__, threads=torch.get_num_threads(), workers=args.workers, results=results,
                           cache_speedup=speedups, whole_command=whole), f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
