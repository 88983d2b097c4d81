"""Data preparation at scale (issue 17): time and peak memory of preparing a large generated corpus.

    python scripts/bench_data.py --pairs 3000000 --dir /work/benchdata/3m --json out.json
    python scripts/bench_data.py --pairs 3000000 --dir /work/benchdata/3m --code /path/to/old/checkout  # before

1. generate (this process, skipped when DIR already holds N pairs): the shipped Bible training
   text (data/bible-es-en/train.{es,en}.gz, 27,894 pairs) repeated with a deterministic
   per-copy variation, so no two lines are equal: copy k swaps two neighbouring words (the
   position depends on k and the line), every third copy also doubles a word, and every copy
   but the first ends with a copy word made of letters (k in base 26). Plain text, or gzip
   with --gzip.
2. prepare (child process, a fresh run directory): `build_tokenizer` then `load_data`, the
   calls `nmt train` makes on a new run: SentencePiece on a `--max-sentences` sample, encoding,
   filtering and writing the cache. Phases: tokenizer (of which inside
   `SentencePieceTrainer.train`, which also pulls the streamed sample), encode (of which in
   SentencePiece's encode calls). Peak RSS of the child: `ru_maxrss` of its rusage (`os.wait4`,
   the per-child form of getrusage(RUSAGE_CHILDREN)); every measured command runs in its own child.
3. first step on a second run (child): `nmt train` on the same run directory with
   train.max_steps=1 (no checkpoint yet: the tokenizer is reused through its saved settings
   and the encoded corpus comes from the cache). Reported: wall time of the whole command,
   i.e. Python + torch start-up, tokenizer reuse, mapping the cache, the first epoch's batches
   (sorting every pair), one step, one validation on 200 pairs (loss only) and a checkpoint.
4. step time (child): after loading the prepared data, `--steps` training steps timed
   (collate + forward/backward/update, as in the training loop) after 2 untimed ones, and
   `collate` alone over the epoch's first 200 batches: the data part of a step, the only part
   that could depend on the corpus size (the model's part is noisy on a shared machine).

`--code DIR` runs the children with another checkout's `nmt` (PYTHONPATH=DIR), e.g. the code
before issue 17, for a same-run before/after; its run directory is DIR-specific (`runs/<name>`).
Phase 4 (the steps child) calls `nmt.train.build_training` (issue 23): with an older checkout
that phase fails and the result has no `steps` entry (phases 1-3 still work).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
BIBLE = os.path.join(ROOT, "data", "bible-es-en")


# --------------------------------------------------------------------------- generate

def _letters(k: int) -> str:
    out = ""
    while True:
        k, r = divmod(k, 26)
        out = chr(ord("a") + r) + out
        if k == 0:
            return out


def vary(line: str, i: int, k: int) -> str:
    """Copy k of line i: k = 0 is the line itself."""
    if k == 0:
        return line
    words = line.split()
    if len(words) > 1:
        j = (i * 7 + k) % (len(words) - 1)
        words[j], words[j + 1] = words[j + 1], words[j]
        if k % 3 == 1:
            words.insert(j, words[j])
    words.append("q" + _letters(k))
    return " ".join(words)


def read_bible(side: str) -> list[str]:
    with gzip.open(os.path.join(BIBLE, f"train.{side}.gz"), "rt", encoding="utf-8") as f:
        return [line.strip() for line in f]


def generate(directory: str, pairs: int, gz: bool) -> dict:
    """Write train.es/train.en (.gz with gz) with `pairs` lines each; returns what was written."""
    os.makedirs(directory, exist_ok=True)
    suffix = ".gz" if gz else ""
    marker = os.path.join(directory, f"generated{suffix}.json")
    if os.path.isfile(marker):
        with open(marker) as f:
            done = json.load(f)
        if done["pairs"] == pairs:
            return done
    t0 = time.perf_counter()
    sizes = {}
    for side in ("es", "en"):
        lines = read_bible(side)
        path = os.path.join(directory, f"train.{side}{suffix}")
        opener = (lambda p: gzip.open(p, "wb", compresslevel=1)) if gz else (lambda p: open(p, "wb"))
        with opener(path + ".tmp") as f:
            written, k = 0, 0
            while written < pairs:
                part = lines[:pairs - written]
                f.write(("\n".join(vary(x, i, k) for i, x in enumerate(part)) + "\n").encode("utf-8"))
                written += len(part)
                k += 1
        os.replace(path + ".tmp", path)
        sizes[side] = os.path.getsize(path)
    done = {"pairs": pairs, "bytes": sizes, "gzip": gz, "seconds": time.perf_counter() - t0}
    with open(marker, "w") as f:
        json.dump(done, f)
    return done


def write_config(directory: str, name: str, gz: bool, max_sentences: int, vocab_size: int) -> str:
    suffix = ".gz" if gz else ""
    cfg = {
        "name": name, "seed": 1, "output_dir": os.path.join(directory, "runs"),
        "data": {"src_lang": "es", "tgt_lang": "en",
                 "train": {"src": os.path.join(directory, f"train.es{suffix}"),
                           "tgt": os.path.join(directory, f"train.en{suffix}")},
                 "valid": {"src": os.path.join(BIBLE, "dev.es.gz"), "tgt": os.path.join(BIBLE, "dev.en.gz"),
                           "max_sentences": 200},
                 "tokenizer": {"vocab_size": vocab_size, "max_sentences": max_sentences, "threads": 2},
                 "max_len": 200, "batch_tokens": 2048},
        "model": {"d_model": 256, "n_heads": 4, "layers": 3, "ffn_dim": 1024},
        "train": {"device": "cpu", "precision": "fp32", "threads": 2, "max_steps": 1, "valid_every": 1000,
                  "valid_bleu": False, "metric": "loss", "log_every": 1, "warmup_steps": 0},
    }
    path = os.path.join(directory, f"{name}.yaml")
    import yaml

    with open(path, "w") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)
    return path


# --------------------------------------------------------------------------- children

def child_prepare(config: str, out: str) -> None:
    """Phase timings of build_tokenizer + load_data (works with the code before and after issue 17)."""
    t0 = time.perf_counter()
    import sentencepiece as spm

    from nmt.config import load_config
    from nmt.data.batches import load_data
    from nmt.text.tokenizer import Tokenizer, build_tokenizer

    spent = {"spm_train": 0.0, "spm_encode": 0.0}

    def timed(fn, key):
        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[key] += time.perf_counter() - t
        return wrapper
    spm.SentencePieceTrainer.train = timed(spm.SentencePieceTrainer.train, "spm_train")
    Tokenizer.encode_src = timed(Tokenizer.encode_src, "spm_encode")
    Tokenizer.encode_tgt = timed(Tokenizer.encode_tgt, "spm_encode")
    cfg = load_config(config)
    t1 = time.perf_counter()
    tok = build_tokenizer(cfg, cfg.run_dir, lambda m: print(m, file=sys.stderr))
    t2 = time.perf_counter()
    data = load_data(cfg, tok, cfg.run_dir, lambda m: print(m, file=sys.stderr))
    t3 = time.perf_counter()
    st = data.train.stats
    res = {"import_s": t1 - t0, "tokenizer_s": t2 - t1, "spm_train_s": spent["spm_train"], "encode_s": t3 - t2,
           "spm_encode_s": spent["spm_encode"], "prepare_s": t3 - t1,
           "pairs": st["pairs"], "kept": st["kept"], "src_tokens": st["src_tokens"], "tgt_tokens": st["tgt_tokens"],
           "cache_bytes": sum(os.path.getsize(os.path.join(cfg.run_dir, "cache", n))
                              for n in os.listdir(os.path.join(cfg.run_dir, "cache")))}
    with open(out, "w") as f:
        json.dump(res, f)


def child_steps(config: str, steps: int, out: str) -> None:
    """Mean time of `steps` training steps (collate + train_step) after 2 untimed ones, on the cached data."""
    from nmt.device import tune_malloc

    tune_malloc()  # as `nmt train` does
    import torch

    from nmt.config import load_config
    from nmt.data.batches import epoch_batches, load_data
    from nmt.layout import collate
    from nmt.training.logging_utils import RunLogger
    from nmt.training.step import train_step
    from nmt.text.tokenizer import build_tokenizer
    from nmt.train import build_training

    torch.set_num_threads(2)
    cfg = load_config(config)
    quiet = lambda m: None  # noqa: E731
    tok = build_tokenizer(cfg, cfg.run_dir, quiet)
    t0 = time.perf_counter()
    load_data(cfg, tok, cfg.run_dir, quiet)  # the cached corpus, mapped: what a second run pays
    t1 = time.perf_counter()
    tr = build_training(cfg, cfg.run_dir, torch.device("cpu"), RunLogger(cfg.run_dir, enabled=False))
    t2 = time.perf_counter()
    batches = epoch_batches(tr.train_data, cfg, 1)
    t3 = time.perf_counter()
    t, specials = cfg.train, tr.tokenizer.specials
    times = []
    for i in range(steps + 2):
        t_start = time.perf_counter()
        batch = collate(tr.train_data, batches[i], specials)
        train_step(tr.forward, [batch], tr.optimizer, tr.scheduler, tr.precision, label_smoothing=t.label_smoothing,
                   clip_norm=t.clip_norm, pad_id=specials.pad, loss_fn=tr.loss_fn)
        times.append(time.perf_counter() - t_start)
    t_start = time.perf_counter()
    for b in batches[:200]:  # the data part of a step alone: the model's part cannot depend on the corpus size
        collate(tr.train_data, b, specials)
    collate_s = (time.perf_counter() - t_start) / len(batches[:200])
    res = {"load_cached_s": t1 - t0, "build_training_s": t2 - t1, "epoch_batches_s": t3 - t2,
           "step_s": sum(times[2:]) / steps, "collate_s": collate_s}
    with open(out, "w") as f:
        json.dump(res, f)


def measured(cmd: list[str], env: dict, log: str) -> tuple[float, float, int]:
    """(wall seconds, peak RSS in GiB, exit code) of one child command; its output goes to `log`.

    The child runs in the code's directory: `python -m nmt` puts the working directory first
    on sys.path, so that is the `nmt` it runs."""
    with open(log, "w") as f:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=env["PYTHONPATH"])
        _, status, usage = os.wait4(proc.pid, 0)  # this child's rusage (Linux: ru_maxrss in KiB)
        wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_maxrss / 2**20, proc.returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=3_000_000)
    ap.add_argument("--dir", required=True, help="where the corpus and the runs go (outside the repository)")
    ap.add_argument("--gzip", action="store_true", help="write the corpus gzip-compressed (level 1)")
    ap.add_argument("--code", default=ROOT, help="checkout whose nmt the children run (default: this one)")
    ap.add_argument("--name", help="run name (default: bench-<basename of --code>)")
    ap.add_argument("--max-sentences", type=int, default=1_000_000, help="data.tokenizer.max_sentences")
    ap.add_argument("--vocab-size", type=int, default=8000)
    ap.add_argument("--steps", type=int, default=10, help="timed training steps")
    ap.add_argument("--skip", nargs="*", default=[], choices=["prepare", "first_step", "steps"],
                    help="phases to leave out (prepare: reuse the run directory a previous call prepared)")
    ap.add_argument("--json", metavar="OUT")
    if sys.argv[1:2] == ["--child"]:  # a measured child: --child prepare CONFIG OUT | steps CONFIG N OUT
        kind, *rest = sys.argv[2:]
        child_prepare(*rest) if kind == "prepare" else child_steps(rest[0], int(rest[1]), rest[2])
        return 0
    args = ap.parse_args()

    code = os.path.abspath(args.code)
    args.dir = os.path.abspath(args.dir)
    name = args.name or f"bench-{os.path.basename(code.rstrip('/'))}"
    gen = generate(args.dir, args.pairs, args.gzip)
    print(f"corpus: {gen['pairs']:,} pairs, {sum(gen['bytes'].values()) / 1e6:,.0f} MB "
          f"({'gzip' if gen['gzip'] else 'plain'}), generated in {gen['seconds']:.0f} s", flush=True)
    config = write_config(args.dir, name, args.gzip, args.max_sentences, args.vocab_size)
    run_dir = os.path.join(args.dir, "runs", name)
    env = dict(os.environ, PYTHONPATH=code, OMP_NUM_THREADS="2")
    me = [sys.executable, os.path.abspath(__file__), "--child"]
    result: dict = {"pairs": args.pairs, "code": code, "corpus": gen, "max_sentences": args.max_sentences}

    out = os.path.join(args.dir, f"{name}.prepare.json")
    if "prepare" not in args.skip:
        shutil.rmtree(run_dir, ignore_errors=True)
        wall, rss, rc = measured(me + ["prepare", config, out], env, os.path.join(args.dir, f"{name}.prepare.log"))
        if rc:
            print(f"prepare failed (exit {rc}): see {args.dir}/{name}.prepare.log", file=sys.stderr)
            return 1
        with open(out) as f:
            result["prepare"] = {**json.load(f), "wall_s": wall, "peak_rss_gib": rss}
    else:
        shutil.rmtree(os.path.join(run_dir, "checkpoints"), ignore_errors=True)  # a second run without a checkpoint
    if "prepare" in result:
        p = result["prepare"]
        print(f"prepare: {p['prepare_s']:.1f} s (tokenizer {p['tokenizer_s']:.1f} s, of which SentencePiece training "
              f"{p['spm_train_s']:.1f} s; encode+filter+cache {p['encode_s']:.1f} s, of which SentencePiece encoding "
              f"{p['spm_encode_s']:.1f} s), peak RSS {p['peak_rss_gib']:.2f} GiB, {p['kept']:,} pairs kept, "
              f"cache {p['cache_bytes'] / 1e6:,.0f} MB", flush=True)

    if "first_step" not in args.skip:
        cmd = [sys.executable, "-m", "nmt", "train", "--config", config, "--set", "train.max_steps=1"]
        wall, rss, rc = measured(cmd, env, os.path.join(args.dir, f"{name}.first_step.log"))
        result["first_step"] = {"wall_s": wall, "peak_rss_gib": rss, "rc": rc}
        print(f"second run, `nmt train` to one step (cache hit): {wall:.1f} s, peak RSS {rss:.2f} GiB (exit {rc})",
              flush=True)
    if "steps" not in args.skip:
        out = os.path.join(args.dir, f"{name}.steps.json")
        wall, rss, rc = measured(me + ["steps", config, str(args.steps), out], env,
                                 os.path.join(args.dir, f"{name}.steps.log"))
        if rc == 0:
            with open(out) as f:
                result["steps"] = {**json.load(f), "peak_rss_gib": rss}
            s = result["steps"]
            print(f"training step (collate + step, mean of {args.steps}): {s['step_s'] * 1000:.0f} ms, of which "
                  f"collate (mean of 200 batches) {s['collate_s'] * 1000:.2f} ms; loading the cached corpus "
                  f"{s['load_cached_s']:.2f} s, one epoch's batches {s['epoch_batches_s']:.2f} s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
