"""CPU translation speed of an imported model: `nmt translate` vs transformers' generate(), same run.

    python scripts/bench_hf.py --sentences 500 --batch 32 --length 32 --beams 1 4 --runs 2 --threads 2 \
        --json bench_hf.json [--model-dir DIR]

Builds (or reuses, --model-dir) a MarianMT model of OPUS-MT's size with transformers' own classes
(d_model 512, 6+6 layers, 8 heads, FFN 2048, swish, scaled embeddings, tied embeddings, 58,101-entry
vocab.json over an 8k SentencePiece model trained on data/bible-es-en/train; random weights),
saved with save_pretrained, and imports it with `nmt import`. Its outputs are meaningless, so every
sentence decodes exactly --length tokens in both (nmt: --min-len L --max-len-a 0 --max-len-b L;
transformers: min_length = max_length = L + 1, counting the decoder start, no forced EOS): equal work.

Each timed run is a fresh process, the whole command: `python -m nmt translate` (file in, file out;
default workers: 2 batches at once with 1 thread each on 2 cores; also --workers 1: one batch with
all threads), and a transformers process (this script with --hf-worker: from_pretrained, tokenizer,
generate() over batches of --batch sentences in input order, batch_decode, write). Threads: torch
--threads in the transformers process, nmt's default split of the same cores. OMP_WAIT_POLICY=PASSIVE
for all (nmt's default). The engines alternate, --runs rounds; reported: each run's sentences/s and
peak RSS (the child's ru_maxrss), the load average before it, and the share of output lines equal to
the first engine's.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
BIBLE = os.path.join(ROOT, "data", "bible-es-en")
VOCAB = 58101  # opus-mt-en-de's vocabulary size


def read_lines(path: str, n: int) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()]
    return lines[:n]


def build_model(directory: str) -> None:
    """A random OPUS-MT-sized MarianMTModel with Marian tokenizer files, saved into `directory`."""
    import io

    import sentencepiece as spm
    import torch
    import transformers

    text = read_lines(os.path.join(BIBLE, "train.es.gz"), 20000) + read_lines(os.path.join(BIBLE, "train.en.gz"), 20000)
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(text), model_writer=out, vocab_size=8000, model_type="bpe",
                                   minloglevel=2)
    sp = spm.SentencePieceProcessor(model_proto=out.getvalue())
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not (sp.is_control(i) or sp.is_unknown(i))]
    pieces += [f"\u2581filler{i}" for i in range(VOCAB - 3 - len(pieces))]  # Marian vocabularies are joint and large
    vocab = {"</s>": 0, "<unk>": 1, **{p: i + 2 for i, p in enumerate(pieces)}, "<pad>": VOCAB - 1}
    os.makedirs(directory, exist_ok=True)
    for name in ("source.spm", "target.spm"):
        with open(os.path.join(directory, name), "wb") as f:
            f.write(out.getvalue())
    with open(os.path.join(directory, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"source_lang": "es", "target_lang": "en", "tokenizer_class": "MarianTokenizer"}, f)
    config = transformers.MarianConfig(
        vocab_size=VOCAB, decoder_vocab_size=VOCAB, d_model=512, encoder_layers=6, decoder_layers=6,
        encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048,
        activation_function="swish", scale_embedding=True, max_position_embeddings=512, pad_token_id=VOCAB - 1,
        decoder_start_token_id=VOCAB - 1, eos_token_id=0, forced_eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.MarianMTModel(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" not in name:
                p.add_(0.05 * torch.randn_like(p))  # off the initialisation, logits far from uniform
    model.generation_config.update(num_beams=4, max_length=512, bad_words_ids=[[VOCAB - 1]])
    model.save_pretrained(directory)


def hf_worker(directory: str, src: str, out: str, beam: int, length: int, batch: int, threads: int) -> None:
    """The transformers side of one timed run (a whole process, as `nmt translate` is)."""
    import torch
    import transformers

    torch.set_num_threads(threads)
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(directory).eval()
    with open(src, encoding="utf-8") as f:
        lines = f.read().splitlines()
    results = []
    with torch.inference_mode():
        for i in range(0, len(lines), batch):
            inputs = tokenizer(lines[i: i + batch], return_tensors="pt", padding=True)
            ids = model.generate(**inputs, num_beams=beam, min_length=length + 1, max_length=length + 1,
                                 forced_eos_token_id=None)
            results += tokenizer.batch_decode(ids, skip_special_tokens=True)
    with open(out, "w", encoding="utf-8") as f:
        f.write("".join(r + "\n" for r in results))


def timed(cmd: list[str], env: dict) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of one child process."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    err = proc.stderr.read().decode()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{err}")
    return wall, usage.ru_maxrss / 1024


def one_round(engines: dict, beam: int, run: int, work: str, env: dict, n: int) -> list[dict]:
    """Every engine once (in reverse order on odd rounds); rows with speed, peak RSS and agreement."""
    order = list(engines) if run % 2 == 0 else list(reversed(engines))
    outputs, rows = {}, []
    for name in order:
        out = os.path.join(work, f"out-{beam}-{run}-{name.replace(' ', '_')}.en")
        load = os.getloadavg()[0]
        wall, rss = timed(engines[name](out, str(beam)), env)
        with open(out, encoding="utf-8") as f:
            outputs[name] = f.read().splitlines()
        rows.append(dict(engine=name, beam=beam, run=run, seconds=round(wall, 2), sentences_per_s=round(n / wall, 2),
                         peak_rss_mib=round(rss), load_before=round(load, 2)))
        print(json.dumps(rows[-1]), flush=True)
    for row in rows:
        row["same_as_nmt"] = sum(a == b for a, b in zip(outputs[row["engine"]], outputs["nmt"])) / len(outputs["nmt"])
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sentences", type=int, default=500)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--length", type=int, default=32, help="output tokens per sentence (forced, both engines)")
    p.add_argument("--beams", type=int, nargs="+", default=[1, 4])
    p.add_argument("--runs", type=int, default=2, help="alternating rounds")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--engines", nargs="+", default=["nmt", "nmt --workers 1", "transformers"])
    p.add_argument("--model-dir", help="reuse (or build into) this directory")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--hf-worker", nargs=7, help=argparse.SUPPRESS)
    p.add_argument("--build", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.build:
        build_model(args.build)
        return
    if args.hf_worker:
        d, src, out, beam, length, batch, threads = args.hf_worker
        hf_worker(d, src, out, int(beam), int(length), int(batch), int(threads))
        return
    work = tempfile.mkdtemp(prefix="bench_hf-")
    model_dir = args.model_dir or os.path.join(work, "opus-mt-sized")
    if not os.path.isfile(os.path.join(model_dir, "config.json")):  # in a child: this process stays small, and a
        subprocess.run([sys.executable, os.path.abspath(__file__), "--build", model_dir], check=True)  # child's
        # ru_maxrss counts its parent's memory at fork
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    ckpt = os.path.join(work, "imported.pt")
    subprocess.run([sys.executable, "-m", "nmt", "import", model_dir, "-o", ckpt, "-q"], env=env, check=True)
    src = os.path.join(work, "in.es")
    with open(src, "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in read_lines(os.path.join(BIBLE, "test.es.gz"), args.sentences)))
    L = str(args.length)
    engines = {
        "nmt": lambda out, k: [sys.executable, "-m", "nmt", "translate", "-c", ckpt, "-i", src, "-o", out, "--beam", k,
                               "--batch-size", str(args.batch), "--min-len", L, "--max-len-a", "0", "--max-len-b", L, "-q"],
        "nmt --workers 1": lambda out, k: engines["nmt"](out, k) + ["--workers", "1"],
        "transformers": lambda out, k: [sys.executable, os.path.abspath(__file__), "--hf-worker", model_dir, src, out,
                                        k, L, str(args.batch), str(args.threads)],
    }
    engines = {name: engines[name] for name in args.engines}
    rows = [row for beam in args.beams for run in range(args.runs) for row in one_round(engines, beam, run, work, env,
                                                                                      args.sentences)]
    result = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "args": vars(args),
              "rows": rows, "self_maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    for row in rows:
        print(f"beam {row['beam']} run {row['run']} {row['engine']:>16}: {row['sentences_per_s']:7.2f} sent/s "
              f"({row['seconds']:.1f} s), peak RSS {row['peak_rss_mib']} MiB, load {row['load_before']}, "
              f"same as nmt {row['same_as_nmt']:.1%}")


if __name__ == "__main__":
    main()
