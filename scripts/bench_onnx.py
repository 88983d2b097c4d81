"""CPU translation speed, BLEU and size on disk: onnxruntime on `nmt export --format onnx` (fp32 and int8) against
nmt's PyTorch engine (fp32, int8) and CTranslate2 (float32, int8), same model, same lines, greedy search, one run.

    python scripts/bench_onnx.py --checkpoint runs/quickstart/checkpoints/best.pt \
        --input data/bible-es-en/test.es.gz --ref data/bible-es-en/test.en.gz --sentences 500 --threads 2 --json out.json

Without --checkpoint a base-sized model (d_model 512, 6+6 layers, FFN 2048, 8 heads, post-norm) with random
weights and a joint 8k SentencePiece model trained on data/bible-es-en/train is built in a temporary
directory (as scripts/bench_ct2.py does); its outputs are meaningless, so every sentence then decodes exactly
--force-len tokens (default 32) on every engine, and BLEU is not reported.

Each engine translates the same lines text to text (tokenization, greedy search, detokenization) in a
fresh process (this script with --worker) that loads it, warms up on 8 lines and times the whole input; the
engines run round-robin --repeats times and each one's best time is kept. nmt and CTranslate2 run through
nmt.translation.translate.translate_lines (their own batching: the checkpoint's batch_tokens, at most
--batch-size sentences; the default workers). onnxruntime runs the loop a user of the export writes: the
`tokenizers` library on tokenizer.json, lines sorted by length in batches of --batch-size, onnx/encoder_model
once, onnx/decoder_model_merged per token with the past keys and values fed back (one InferenceSession per
graph, --threads intra-op threads; neither nmt nor torch imported), each line stopping at EOS or at the
length limit the other engines use (`nmt.search.max_output_lengths`, computed beforehand). `same` is the share of output lines
identical to nmt fp32's; BLEU is sacreBLEU's against the first lines of --ref. Sizes: the checkpoint file,
CTranslate2's model.bin, the ONNX graphs (encoder + merged decoder).
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
ENGINES = [("nmt (PyTorch)", "fp32", "nmt"), ("nmt (PyTorch)", "int8", "nmt"), ("CTranslate2", "float32", "ct2"),
           ("CTranslate2", "int8", "ct2"), ("onnxruntime", "fp32", "onnx"), ("onnxruntime", "int8", "onnx")]


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


def build_random_checkpoint(directory: str, threads: int) -> str:
    """A random-weight base-sized post-norm model + an 8k joint SentencePiece model, saved as a checkpoint."""
    import torch

    from nmt.config import TokenizerConfig, config_from_dict
    from nmt.model.checkpoint import record, save_checkpoint
    from nmt.model.transformer import Transformer
    from nmt.text.tokenizer import Tokenizer, train_sentencepiece

    text = read_lines(os.path.join(BIBLE, "train.es.gz"), 20000) + read_lines(os.path.join(BIBLE, "train.en.gz"), 20000)
    tok = TokenizerConfig(vocab_size=8000, model_type="unigram", threads=threads, max_sentences=40000)
    tokenizer = Tokenizer(train_sentencepiece(text, tok, seed=1, what="joint", log=lambda m: None))
    raw = {"data": {"src_lang": "es", "tgt_lang": "en", "train": {"src": "x.es", "tgt": "x.en"},
                    "valid": {"src": "x.es", "tgt": "x.en"}, "tokenizer": {"vocab_size": 8000}},
           "model": {"d_model": 512, "n_heads": 8, "layers": 6, "ffn_dim": 2048, "max_positions": 512, "norm": "post"}}
    cfg = config_from_dict(raw, check_files=False)
    torch.manual_seed(0)
    model = Transformer(cfg.model, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size)
    path = os.path.join(directory, "random.pt")
    save_checkpoint(record(model.state_dict(), tokenizer, cfg), path)
    return path


class OnnxGreedy:
    """Greedy search over an ONNX export with onnxruntime and tokenizer.json (the loop docs/onnx.md shows)."""

    def __init__(self, directory: str, threads: int, quantized: bool):
        import onnxruntime as ort
        from tokenizers import Tokenizer

        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
        suffix = "_quantized" if quantized else ""
        graph = lambda name: ort.InferenceSession(os.path.join(directory, "onnx", f"{name}{suffix}.onnx"), opts,
                                                  providers=["CPUExecutionProvider"])
        self.encoder, self.decoder = graph("encoder_model"), graph("decoder_model_merged")
        self.tokenizer = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
        with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
            self.config = json.load(f)
        with open(os.path.join(directory, "generation_config.json"), encoding="utf-8") as f:
            self.gen = json.load(f)
        self.outputs = [o.name for o in self.decoder.get_outputs()]
        self.pasts = [i.name for i in self.decoder.get_inputs() if i.name.startswith("past_key_values.")]

    def translate(self, lines: list[str], batch_size: int, limits: list[int], force_len: int = 0) -> list[str]:
        """`limits`: the most tokens each line may get (EOS counted)."""
        encoded = [e.ids for e in self.tokenizer.encode_batch(lines)]
        order = sorted(range(len(lines)), key=lambda i: len(encoded[i]))
        out = [""] * len(lines)
        for start in range(0, len(order), batch_size):
            rows = order[start:start + batch_size]
            ids = self._search([encoded[i] for i in rows], [limits[i] for i in rows], force_len)
            for i, text in zip(rows, self.tokenizer.decode_batch(ids, skip_special_tokens=True)):
                out[i] = text
        return out

    def _search(self, sources: list[list[int]], limits: list[int], force_len: int) -> list[list[int]]:
        import numpy as np

        c = self.config
        batch, width = len(sources), max(map(len, sources))
        ids = np.full((batch, width), c["pad_token_id"], np.int64)
        mask = np.zeros((batch, width), np.int64)
        for row, src in enumerate(sources):
            ids[row, :len(src)], mask[row, :len(src)] = src, 1
        hidden = self.encoder.run(None, {"input_ids": ids, "attention_mask": mask})[0]
        heads = c["decoder_attention_heads"]
        past = {name: np.zeros((batch, heads, 0, c["d_model"] // heads), np.float32) for name in self.pasts}
        step_ids = np.full((batch, 1), c["decoder_start_token_id"], np.int64)
        out, live = [[] for _ in sources], np.ones(batch, bool)
        bad = [b[0] for b in self.gen.get("bad_words_ids", [])]
        forced = self.gen.get("forced_bos_token_id")
        for step in range(max(limits)):
            logits, *presents = self.decoder.run(None, {
                "input_ids": step_ids, "encoder_hidden_states": hidden, "encoder_attention_mask": mask,
                "use_cache_branch": np.array([step > 0]), **past})
            last = logits[:, -1]
            last[:, bad] = -np.inf
            if force_len:
                last[:, c["eos_token_id"]] = -np.inf
            best = last.argmax(-1)
            if step == 0 and forced is not None:
                best[:] = forced
            for row in np.flatnonzero(live):
                if best[row] == c["eos_token_id"]:
                    live[row] = False
                else:
                    out[row].append(int(best[row]))
                    live[row] = len(out[row]) < limits[row]
            if not live.any():
                break
            for name, value in zip(self.outputs[1:], presents):
                if step == 0 or ".decoder." in name:
                    past[name.replace("present", "past_key_values")] = value
            step_ids = best[:, None].astype(np.int64)
        return out


def peak_rss_mb() -> float:
    """This process's peak resident memory: /proc's VmHWM (which restarts at exec; getrusage's ru_maxrss keeps
    the high-water mark of the parent that forked it), else ru_maxrss."""
    try:
        with open("/proc/self/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(args) -> dict:
    """Timed runs of one engine in this (fresh) process: {"seconds", "outputs", "peak_rss_mb"}."""
    lines = read_lines(args.input, args.sentences)
    if args.worker == "onnx":  # neither nmt nor torch in this process
        with open(args.limits, encoding="utf-8") as f:
            limits = dict(zip(lines, json.load(f)))  # (line -> its length limit: the main process's numbers)
        engine = OnnxGreedy(args.worker_model, args.threads, args.precision == "int8")
        run = lambda some: engine.translate(some, args.batch_size, [limits[line] for line in some], args.force_len)
    else:
        from nmt.config import decode_config
        from nmt.translation.translate import translate_lines

        if args.worker == "nmt":
            from nmt.device import tune_malloc

            tune_malloc(inference=True)  # as `nmt translate` does
            import torch

            torch.set_num_threads(args.threads)
            from nmt.translation.torch_engine import TorchEngine

            engine = TorchEngine.load(args.checkpoint, "cpu", precision=args.precision)
        else:
            from nmt.translation.ct2 import Ct2Engine

            engine = Ct2Engine(args.worker_model, "cpu", intra_threads=args.threads)
        limits = dict(max_len_a=0.0, max_len_b=args.force_len, min_len=args.force_len) if args.force_len else {}
        decode = decode_config(engine.decode, dict(beam_size=1, nbest=1, max_batch_size=args.batch_size, no_repeat_ngram=0,
                                                   precision=engine.precision, **limits))  # plain greedy, as the loop
        run = lambda some: translate_lines(engine, some, decode, warn=lambda m: None)
    run(lines[:8])  # warm-up
    t0 = time.perf_counter()
    outputs = run(lines)
    seconds = time.perf_counter() - t0
    return dict(seconds=seconds, outputs=outputs, peak_rss_mb=peak_rss_mb())


def mib(*paths: str) -> float:
    return sum(os.path.getsize(p) for p in paths) / 2**20


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", help="nmt checkpoint (default: a random base-sized model, see above)")
    ap.add_argument("--input", default=os.path.join(BIBLE, "test.es.gz"), help="source sentences (plain or .gz)")
    ap.add_argument("--ref", help="references for BLEU (plain or .gz; default: none)")
    ap.add_argument("--sentences", type=int, default=500, help="first N non-blank lines (0 = all)")
    ap.add_argument("--batch-size", type=int, default=32, help="sentences per batch, at most (every engine)")
    ap.add_argument("--force-len", type=int, default=None,
                    help="decode exactly N tokens per sentence (default: 32 for the random model, else natural lengths)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads, CTranslate2 and onnxruntime intra-op threads")
    ap.add_argument("--repeats", type=int, default=2, help="timed runs per engine, round-robin (best is kept)")
    ap.add_argument("--json", metavar="OUT", help="write the results here as JSON")
    ap.add_argument("--worker", choices=("nmt", "ct2", "onnx"), help=argparse.SUPPRESS)
    ap.add_argument("--worker-model", help=argparse.SUPPRESS)
    ap.add_argument("--precision", default="fp32", help=argparse.SUPPRESS)
    ap.add_argument("--limits", help=argparse.SUPPRESS)  # a JSON file: each line's length limit
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return 0

    import torch  # this process builds and exports the models; the timed runs are workers

    torch.set_num_threads(args.threads)
    import ctranslate2
    import onnxruntime

    from nmt.interop.ct2_export import write_export
    from nmt.interop.onnx_export import write_onnx
    from nmt.model.checkpoint import load_for_inference

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        checkpoint = args.checkpoint or build_random_checkpoint(tmp, args.threads)
        force_len = args.force_len if args.force_len is not None else (0 if args.checkpoint else 32)
        model, tokenizer, cfg = load_for_inference(checkpoint, "cpu")
        models = {("ct2", q): write_export(model, tokenizer, cfg, os.path.join(tmp, q), quantization=q,
                                           checkpoint=checkpoint) for q in ("float32", "int8")}
        onnx_dir = os.path.join(tmp, "onnx")
        write_onnx(model, tokenizer, cfg, onnx_dir, quantization="int8", checkpoint=checkpoint)
        models[("onnx", "fp32")] = models[("onnx", "int8")] = onnx_dir
        graphs = lambda suffix: [os.path.join(onnx_dir, "onnx", f"{g}{suffix}.onnx")
                                 for g in ("encoder_model", "decoder_model_merged")]
        sizes = {("nmt", "fp32"): mib(checkpoint), ("nmt", "int8"): mib(checkpoint),
                 ("ct2", "float32"): mib(os.path.join(models[("ct2", "float32")], "model.bin")),
                 ("ct2", "int8"): mib(os.path.join(models[("ct2", "int8")], "model.bin")),
                 ("onnx", "fp32"): mib(*graphs("")), ("onnx", "int8"): mib(*graphs("_quantized"))}
        setup_s = time.perf_counter() - t0
        lines = read_lines(args.input, args.sentences)
        refs = read_lines(args.ref, args.sentences) if args.ref and not force_len else None
        from nmt.search import max_output_lengths

        a, b = (0.0, force_len) if force_len else (cfg.decode.max_len_a, cfg.decode.max_len_b)
        limits_file = os.path.join(tmp, "limits.json")
        with open(limits_file, "w", encoding="utf-8") as f:  # the other engines' limits, for the onnxruntime loop
            json.dump(max_output_lengths([len(x) + 1 for x in tokenizer.encode_src(lines)], a, b,
                                         cfg.model.max_positions), f)
        n_params = sum(p.numel() for p in model.parameters())
        del model
        print(f"# {len(lines)} sentences from {args.input}; model {n_params / 1e6:.1f}M parameters "
              f"({'random weights' if not args.checkpoint else checkpoint}); greedy, batches of at most "
              f"{args.batch_size}, {'forced length ' + str(force_len) if force_len else 'natural lengths'}; "
              f"{args.threads} threads on {cpu_name()}; torch {torch.__version__}, ctranslate2 "
              f"{ctranslate2.__version__}, onnxruntime {onnxruntime.__version__}; setup {setup_s:.1f}s; "
              f"load {os.getloadavg()[0]:.1f}", flush=True)

        def timed(engine: str, weights: str) -> dict:
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", engine, "--checkpoint", checkpoint,
                   "--input", args.input, "--sentences", str(args.sentences), "--batch-size", str(args.batch_size),
                   "--force-len", str(force_len), "--threads", str(args.threads), "--precision", weights,
                   "--limits", limits_file]
            if (engine, weights) in models:
                cmd += ["--worker-model", models[(engine, weights)]]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            return json.loads(out.strip().splitlines()[-1])

        best, outputs, rss = [float("inf")] * len(ENGINES), [None] * len(ENGINES), [0.0] * len(ENGINES)
        for _ in range(args.repeats):  # round-robin, so that load from other processes hits every engine alike
            for k, (_, weights, engine) in enumerate(ENGINES):
                r = timed(engine, weights)
                best[k], outputs[k], rss[k] = min(best[k], r["seconds"]), r["outputs"], max(rss[k], r["peak_rss_mb"])
        import sacrebleu

        results = []
        print(f"{'engine':<14} {'weights':<8} {'time_s':>8} {'sent/s':>8} {'tok/s':>8} {'vs nmt':>7} {'same':>6} "
              f"{'BLEU':>6} {'rss_MB':>7} {'size_MiB':>8}")
        for k, (name, weights, engine) in enumerate(ENGINES):
            tokens = sum(len(ids) for ids in tokenizer.encode_tgt(outputs[k]))
            bleu = sacrebleu.corpus_bleu(outputs[k], [refs]).score if refs else None
            r = dict(engine=name, weights=weights, seconds=best[k], sentences=len(lines), target_tokens=tokens,
                     sent_per_s=len(lines) / best[k], tok_per_s=tokens / best[k], vs_nmt=best[0] / best[k],
                     same_as_nmt=sum(a == b for a, b in zip(outputs[k], outputs[0])) / len(lines), bleu=bleu,
                     peak_rss_mb=rss[k], size_mib=sizes[(engine, weights)])
            results.append(r)
            print(f"{name:<14} {weights:<8} {best[k]:>8.2f} {r['sent_per_s']:>8.2f} {r['tok_per_s']:>8.0f} "
                  f"{r['vs_nmt']:>6.2f}x {100 * r['same_as_nmt']:>5.1f}% {'-' if bleu is None else f'{bleu:.2f}':>6} "
                  f"{rss[k]:>7.0f} {r['size_mib']:>8.1f}", flush=True)
        if args.json:
            meta = dict(checkpoint=args.checkpoint or "random", input=args.input, ref=args.ref, batch_size=args.batch_size,
                        force_len=force_len, threads=args.threads, cpu=cpu_name(), parameters=n_params,
                        torch=torch.__version__, ctranslate2=ctranslate2.__version__,
                        onnxruntime=onnxruntime.__version__, load=os.getloadavg())
            with open(args.json, "w") as f:
                json.dump(dict(meta, results=results), f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
