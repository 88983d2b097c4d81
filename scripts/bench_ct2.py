"""CPU translation speed: nmt (PyTorch) vs CTranslate2 float32 and int8, same model and input, one run.

    python scripts/bench_ct2.py --checkpoint runs/NAME/checkpoints/best.pt \
        --input data/bible-es-en/test.es.gz --sentences 200 --beam 5 --threads 2 --json out.json

Without --checkpoint a base-sized model (d_model 512, 6+6 layers, FFN 2048, 8 heads) with random
weights and a joint 8k SentencePiece model trained on data/bible-es-en/train is built in a
temporary directory; its outputs are meaningless, so every sentence then decodes exactly
--force-len tokens (default 32; minimum = maximum output length) and all engines do equal work.

Each engine translates the same lines text-to-text (SentencePiece encoding, search, decoding)
with the same search settings (beam, length limits, batches of --batch-tokens padded source
tokens): both through nmt.translate.translate_lines, with nmt.torch_engine.TorchEngine and nmt.ct2.Ct2Engine
(float32: `nmt export`; int8: `nmt export --quantization int8`). Threads: torch.set_num_threads
and CTranslate2's intra_threads. Every timed run is a fresh process (this script with --worker)
that loads its engine, warms up on 8 lines and times the rest: torch's and CTranslate2's OpenMP
threads compete when both run in one process (CTranslate2 greedy ran at half speed after torch).
The engines run round-robin --repeats times and each one's best time is reported (other
processes' load then affects all engines alike).
Target tokens are the SentencePiece pieces of the output text. `same` is the share of output
lines identical to nmt's.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
BIBLE = os.path.join(ROOT, "data", "bible-es-en")


def read_lines(path: str, n: int) -> list[str]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f if line.strip()]
    return lines[:n] if n else lines


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def build_random_checkpoint(directory: str, args) -> str:
    """A random-weight model of the requested size + an 8k joint SentencePiece model, saved as a checkpoint."""
    import torch

    from nmt.checkpoint import save_checkpoint
    from nmt.config import TokenizerConfig, config_from_dict, to_dict
    from nmt.model import Transformer
    from nmt.tokenizer import Tokenizer, train_sentencepiece

    text = read_lines(os.path.join(BIBLE, "train.es.gz"), 20000) + read_lines(os.path.join(BIBLE, "train.en.gz"), 20000)
    tok = TokenizerConfig(vocab_size=8000, model_type="unigram", threads=args.threads, max_sentences=40000)
    tokenizer = Tokenizer(train_sentencepiece(text, tok, seed=1, what="joint", log=lambda m: None))
    raw = {"data": {"src_lang": "es", "tgt_lang": "en", "train": {"src": "x.es", "tgt": "x.en"},
                    "valid": {"src": "x.es", "tgt": "x.en"}, "tokenizer": {"vocab_size": 8000}},
           "model": {"d_model": args.d_model, "n_heads": args.heads, "layers": args.layers, "ffn_dim": args.ffn_dim,
                     "max_positions": 512}}
    cfg = config_from_dict(raw, check_files=False)
    torch.manual_seed(0)
    model = Transformer(cfg.model, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size)
    path = os.path.join(directory, "random.pt")
    save_checkpoint({"model": model.state_dict(), "config": to_dict(cfg), "tokenizer": tokenizer.to_bytes(),
                     "vocab": {"src": tokenizer.src_vocab_size, "tgt": tokenizer.tgt_vocab_size},
                     "step": 0, "epoch": 0}, path)
    return path


def worker(args) -> dict:
    """One timed run of one engine in this (fresh) process: {"seconds", "outputs"}."""
    lines = read_lines(args.input, args.sentences)
    limits = dict(max_len_a=0.0, max_len_b=args.force_len, min_len=args.force_len) if args.force_len else {}
    overrides = dict(beam_size=args.beam, nbest=1, batch_tokens=args.batch_tokens, **limits)
    if args.worker == "nmt":
        from nmt.fast import tune_malloc

        tune_malloc(inference=True)  # as `nmt translate` does
        import torch

        torch.set_num_threads(args.threads)
        from nmt.torch_engine import TorchEngine

        engine = TorchEngine.load(args.checkpoint, "cpu")
    else:  # no torch computation in this process
        from nmt.ct2 import Ct2Engine

        engine = Ct2Engine(args.worker_model, "cpu", intra_threads=args.threads)
    from nmt.config import decode_config
    from nmt.translate import translate_lines

    decode = decode_config(engine.decode, overrides)
    run = lambda some: translate_lines(engine, some, decode, warn=lambda m: None)
    run(lines[:8])  # warm-up
    t0 = time.perf_counter()
    outputs = run(lines)
    seconds = time.perf_counter() - t0
    return dict(seconds=seconds, outputs=outputs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", help="nmt checkpoint (default: a random base-sized model, see above)")
    ap.add_argument("--input", default=os.path.join(BIBLE, "test.es.gz"), help="source sentences (plain or .gz)")
    ap.add_argument("--sentences", type=int, default=200, help="first N non-blank lines (0 = all)")
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--force-len", type=int, default=None,
                    help="decode exactly N tokens per sentence (default: 32 for the random model, else natural lengths)")
    ap.add_argument("--batch-tokens", type=int, default=None, help="padded source tokens per batch (default: the checkpoint's)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads and CTranslate2 intra_threads")
    ap.add_argument("--repeats", type=int, default=2, help="timed runs per engine, round-robin (best is kept)")
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--ffn-dim", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--json", metavar="OUT", help="write the results here as JSON")
    ap.add_argument("--worker", choices=("nmt", "ct2"), help=argparse.SUPPRESS)
    ap.add_argument("--worker-model", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return 0

    import torch  # this process builds and exports the models; the timed runs are workers

    torch.set_num_threads(args.threads)
    import ctranslate2

    from nmt.checkpoint import load_for_inference
    from nmt.config import decode_config
    from nmt.export import write_export

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        checkpoint = args.checkpoint or build_random_checkpoint(tmp, args)
        force_len = args.force_len if args.force_len is not None else (0 if args.checkpoint else 32)
        model, tokenizer, cfg = load_for_inference(checkpoint, "cpu")  # for the exports
        dirs = {}
        for quant in ("float32", "int8"):
            dirs[quant] = write_export(model, tokenizer, cfg, os.path.join(tmp, quant), quantization=quant,
                                       checkpoint=checkpoint)
        setup_s = time.perf_counter() - t0
        limits = dict(max_len_a=0.0, max_len_b=force_len, min_len=force_len) if force_len else {}
        decode = decode_config(cfg.decode, dict(beam_size=args.beam, nbest=1, batch_tokens=args.batch_tokens, **limits))
        lines = read_lines(args.input, args.sentences)
        n_params = sum(p.numel() for p in model.parameters())
        print(f"# {len(lines)} sentences from {args.input}; model {n_params / 1e6:.1f}M parameters "
              f"({'random weights' if not args.checkpoint else checkpoint}); beam {decode.beam_size}, "
              f"{'forced length ' + str(force_len) if force_len else 'natural lengths'}, batch_tokens {decode.batch_tokens}; "
              f"{args.threads} threads on {cpu_name()}; torch {torch.__version__}, ctranslate2 {ctranslate2.__version__}; "
              f"setup {setup_s:.1f}s", flush=True)

        def timed(engine: str, model_dir: str | None) -> dict:
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", engine, "--checkpoint", checkpoint,
                   "--input", args.input, "--sentences", str(args.sentences), "--beam", str(args.beam),
                   "--force-len", str(force_len), "--threads", str(args.threads)]
            if args.batch_tokens:
                cmd += ["--batch-tokens", str(args.batch_tokens)]
            if model_dir:
                cmd += ["--worker-model", model_dir]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            return json.loads(out.strip().splitlines()[-1])

        engines = [("nmt (PyTorch)", "float32", "nmt", None)] + \
            [("CTranslate2", quant, "ct2", dirs[quant]) for quant in ("float32", "int8")]
        best, outputs = [float("inf")] * len(engines), [None] * len(engines)
        for _ in range(args.repeats):  # round-robin, so that load from other processes hits every engine alike
            for k, (_, _, engine, model_dir) in enumerate(engines):
                r = timed(engine, model_dir)
                best[k], outputs[k] = min(best[k], r["seconds"]), r["outputs"]
        results = []
        print(f"{'engine':<14} {'weights':<8} {'time_s':>8} {'sent/s':>8} {'tok/s':>8} {'speedup':>8} {'same':>6}")
        for (name, weights, engine, _), secs, out in zip(engines, best, outputs):
            tokens = sum(len(ids) for ids in tokenizer.encode_tgt(out))
            r = dict(engine=name, weights=weights, seconds=secs, sentences=len(lines), target_tokens=tokens,
                     sent_per_s=len(lines) / secs, tok_per_s=tokens / secs,
                     same_as_nmt=sum(a == b for a, b in zip(out, outputs[0])) / len(lines))
            r["speedup"] = r["sent_per_s"] / results[0]["sent_per_s"] if results else 1.0
            results.append(r)
            print(f"{name:<14} {weights:<8} {secs:>8.2f} {r['sent_per_s']:>8.2f} {r['tok_per_s']:>8.0f} "
                  f"{r['speedup']:>7.2f}x {100 * r['same_as_nmt']:>5.1f}%", flush=True)
        if args.json:
            meta = dict(checkpoint=args.checkpoint or "random", input=args.input, beam=decode.beam_size,
                        force_len=force_len, batch_tokens=decode.batch_tokens, threads=args.threads, cpu=cpu_name(),
                        parameters=n_params, torch=torch.__version__, ctranslate2=ctranslate2.__version__,
                        decode=dataclasses.asdict(decode))
            with open(args.json, "w") as f:
                json.dump(dict(meta, results=results), f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
