"""CPU translation speed and memory: nmt (PyTorch) fp32 and int8 vs CTranslate2 float32 and int8, same
model and input, one run.

    python scripts/bench_ct2.py --checkpoint runs/NAME/checkpoints/best.pt \
        --input data/bible-es-en/test.es.gz --sentences 200 --beams 1 5 --batch-sizes 1 32 --threads 2 --json out.json

Without --checkpoint a base-sized model (d_model 512, 6+6 layers, FFN 2048, 8 heads) with random
weights and a joint 8k SentencePiece model trained on data/bible-es-en/train is built in a
temporary directory; its outputs are meaningless, so every sentence then decodes exactly
--force-len tokens (default 32; minimum = maximum output length) and all engines do equal work.

Each engine translates the same lines text-to-text (SentencePiece encoding, search, decoding)
with the same search settings (the checkpoint's decode section, then each --beams value, batches of
at most each --batch-sizes value sentences, with --batch-tokens padded source tokens): all through
nmt.translation.translate.translate_lines, with nmt.translation.torch_engine.TorchEngine (`decode.precision` fp32 and int8,
nmt/model/precision.py; --bf16 adds bf16) and nmt.translation.ct2.Ct2Engine (float32: `nmt export`; int8:
`nmt export --quantization int8`). Threads: torch.set_num_threads and CTranslate2's intra_threads;
batches: the default workers (2 on 2 threads). Every engine runs in a fresh process (this script
with --worker) that loads it, warms up on 8 lines and times every (beam, batch size) setting in turn;
its peak RSS (ru_maxrss) is reported. `--patience 0 1` times beam search under both stopping rules
(0: nmt's exact stop, which the CTranslate2 engine reproduces by never stopping early; 1: the
rule CTranslate2 and fairseq use, in both engines). torch's and CTranslate2's OpenMP threads compete when both run
in one process (CTranslate2 greedy ran at half speed after torch). The engines run round-robin
--repeats times and each one's best time per setting is reported (other processes' load then
affects all engines alike). Target tokens are the SentencePiece pieces of the output text. `same` is
the share of output lines identical to nmt fp32's.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import subprocess
import sys
import tempfile
import time


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

    from nmt.model.checkpoint import record, save_checkpoint
    from nmt.config import TokenizerConfig, config_from_dict
    from nmt.model.transformer import Transformer
    from nmt.text.tokenizer import Tokenizer, train_sentencepiece

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
    save_checkpoint(record(model.state_dict(), tokenizer, cfg), path)
    return path


def settings_of(args) -> list[tuple[int, int, float | None]]:
    """(beam, batch size, patience) for every combination (patience only for beams > 1; None = the
    checkpoint's)."""
    return [(beam, size, patience) for beam in args.beams for size in args.batch_sizes
            for patience in ((args.patience or [None]) if beam > 1 else [None])]


def key_of(setting: tuple[int, int, float | None]) -> str:
    """"BEAM/BATCH[/PATIENCE]": a setting's key in the workers' JSON."""
    beam, size, patience = setting
    return f"{beam}/{size}" + ("" if patience is None else f"/{patience:g}")


def worker(args) -> dict:
    """Timed runs of one engine in this (fresh) process: {"runs": {"BEAM/BATCH": {"seconds", "outputs"}},
    "peak_rss_mb"}."""
    import resource

    lines = read_lines(args.input, args.sentences)
    limits = dict(max_len_a=0.0, max_len_b=args.force_len, min_len=args.force_len) if args.force_len else {}
    if args.worker == "nmt":
        from nmt.device import tune_malloc

        tune_malloc(inference=True)  # as `nmt translate` does
        import torch

        torch.set_num_threads(args.threads)
        from nmt.translation.torch_engine import TorchEngine

        engine = TorchEngine.load(args.checkpoint, "cpu", precision=args.precision)
    else:  # no torch computation in this process
        from nmt.translation.ct2 import Ct2Engine

        engine = Ct2Engine(args.worker_model, "cpu", intra_threads=args.threads)
    from nmt.config import decode_config
    from nmt.translation.translate import translate_lines

    runs = {}
    for beam, size, patience in settings_of(args):
        overrides = dict(beam_size=beam, nbest=1, max_batch_size=size, **limits)
        if patience is not None:
            overrides["patience"] = patience
        if args.length_penalty_type:
            overrides["length_penalty_type"] = args.length_penalty_type
        if args.batch_tokens:
            overrides["batch_tokens"] = args.batch_tokens
        decode = decode_config(engine.decode, dict(overrides, precision=engine.precision))
        run = lambda some: translate_lines(engine, some, decode, warn=lambda m: None)
        run(lines[:8])  # warm-up
        t0 = time.perf_counter()
        outputs = run(lines)
        runs[key_of((beam, size, patience))] = dict(seconds=time.perf_counter() - t0, outputs=outputs)
    return dict(runs=runs, peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", help="nmt checkpoint (default: a random base-sized model, see above)")
    ap.add_argument("--input", default=os.path.join(BIBLE, "test.es.gz"), help="source sentences (plain or .gz)")
    ap.add_argument("--sentences", type=int, default=200, help="first N non-blank lines (0 = all)")
    ap.add_argument("--beams", type=int, nargs="+", default=[5], help="beam sizes (1 = greedy)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[256],
                    help="decode.max_batch_size values (sentences per batch; the checkpoint's default is 256)")
    ap.add_argument("--patience", type=float, nargs="+", default=None,
                    help="decode.patience values for beam search (default: the checkpoint's; 0 = exact stop, 1 = "
                         "CTranslate2's and fairseq's rule)")
    ap.add_argument("--length-penalty-type", choices=("gnmt", "average", "none"), default=None,
                    help="decode.length_penalty_type (default: the checkpoint's; the CTranslate2 engine refuses "
                         "patience > 0 with gnmt)")
    ap.add_argument("--bf16", action="store_true", help="also nmt with --precision bf16 (CPUs with AVX-512 BF16/AMX)")
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
    ap.add_argument("--precision", default="fp32", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return 0

    import torch  # this process builds and exports the models; the timed runs are workers

    torch.set_num_threads(args.threads)
    import ctranslate2

    from nmt.model.checkpoint import load_for_inference
    from nmt.config import decode_config
    from nmt.interop.ct2_export import write_export

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
        decode = decode_config(cfg.decode, dict(batch_tokens=args.batch_tokens))
        lines = read_lines(args.input, args.sentences)
        n_params = sum(p.numel() for p in model.parameters())
        print(f"# {len(lines)} sentences from {args.input}; model {n_params / 1e6:.1f}M parameters "
              f"({'random weights' if not args.checkpoint else checkpoint}); beams {args.beams}, batch sizes "
              f"{args.batch_sizes}, {'forced length ' + str(force_len) if force_len else 'natural lengths'}, "
              f"batch_tokens {decode.batch_tokens}; {args.threads} threads on {cpu_name()}; torch {torch.__version__}, "
              f"ctranslate2 {ctranslate2.__version__}; setup {setup_s:.1f}s; load {os.getloadavg()[0]:.1f}", flush=True)

        def timed(engine: str, model_dir: str | None, precision: str) -> dict:
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", engine, "--checkpoint", checkpoint,
                   "--input", args.input, "--sentences", str(args.sentences), "--beams", *map(str, args.beams),
                   "--batch-sizes", *map(str, args.batch_sizes), "--force-len", str(force_len),
                   "--threads", str(args.threads), "--precision", precision]
            if args.patience:
                cmd += ["--patience", *map(str, args.patience)]
            if args.length_penalty_type:
                cmd += ["--length-penalty-type", args.length_penalty_type]
            if args.batch_tokens:
                cmd += ["--batch-tokens", str(args.batch_tokens)]
            if model_dir:
                cmd += ["--worker-model", model_dir]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            return json.loads(out.strip().splitlines()[-1])

        engines = [("nmt (PyTorch)", "fp32", "nmt", None), ("nmt (PyTorch)", "int8", "nmt", None)] + \
            ([("nmt (PyTorch)", "bf16", "nmt", None)] if args.bf16 else []) + \
            [("CTranslate2", quant, "ct2", dirs[quant]) for quant in ("float32", "int8")]
        settings = [key_of(x) for x in settings_of(args)]
        best = [{k: float("inf") for k in settings} for _ in engines]
        outputs, rss = [None] * len(engines), [0.0] * len(engines)
        for _ in range(args.repeats):  # round-robin, so that load from other processes hits every engine alike
            for k, (_, weights, engine, model_dir) in enumerate(engines):
                r = timed(engine, model_dir, weights)
                for key, run in r["runs"].items():
                    best[k][key] = min(best[k][key], run["seconds"])
                outputs[k], rss[k] = {key: run["outputs"] for key, run in r["runs"].items()}, max(rss[k], r["peak_rss_mb"])
        results = []
        print(f"{'engine':<14} {'weights':<8} {'beam':>4} {'batch':>5} {'pat.':>4} {'time_s':>8} {'sent/s':>8} "
              f"{'tok/s':>8} {'vs nmt':>7} {'same':>6} {'rss_MB':>7}")
        for key, (beam, size, patience) in zip(settings, settings_of(args)):
            pat = "-" if patience is None else f"{patience:g}"
            for k, (name, weights, _, _) in enumerate(engines):
                secs, out, ref = best[k][key], outputs[k][key], outputs[0][key]
                tokens = sum(len(ids) for ids in tokenizer.encode_tgt(out))
                r = dict(engine=name, weights=weights, beam=beam, batch=size, patience=patience, seconds=secs,
                         sentences=len(lines),
                         target_tokens=tokens, sent_per_s=len(lines) / secs, tok_per_s=tokens / secs,
                         vs_nmt=best[0][key] / secs, same_as_nmt=sum(a == b for a, b in zip(out, ref)) / len(lines),
                         peak_rss_mb=rss[k])
                results.append(r)
                print(f"{name:<14} {weights:<8} {beam:>4} {size:>5} {pat:>4} {secs:>8.2f} {r['sent_per_s']:>8.2f} "
                      f"{r['tok_per_s']:>8.0f} {r['vs_nmt']:>6.2f}x {100 * r['same_as_nmt']:>5.1f}% {rss[k]:>7.0f}",
                      flush=True)
        if args.json:
            meta = dict(checkpoint=args.checkpoint or "random", input=args.input, beams=args.beams,
                        batch_sizes=args.batch_sizes, force_len=force_len, batch_tokens=decode.batch_tokens,
                        threads=args.threads, cpu=cpu_name(), parameters=n_params, torch=torch.__version__,
                        ctranslate2=ctranslate2.__version__, load=os.getloadavg())
            with open(args.json, "w") as f:
                json.dump(dict(meta, results=results), f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
