"""The cost of each decoding option: `nmt translate` (the whole command) with and without it.

    python scripts/bench_options.py --checkpoint runs/quickstart/checkpoints/best.pt \
        --input data/bible-es-en/test.es.gz --sentences 500 --rounds 3 --json out.json
    # a multilingual model, plain against language-contrastive decoding only:
    python scripts/bench_options.py --checkpoint CK --input data/gettext/test.en-it.en --sentences 200 \
        --beams 4 --flags="--tgt-lang ita_Latn" --only plain \
        --variant "contrast=--contrast-lang eng_Latn,spa_Latn,fra_Latn,deu_Latn --contrast-weight 0.175"

Each variant is the same command plus some flags, at batch 32 (`--batch-size 32`), beam 5
and greedy, from a plain search (no sampling, no n-gram blocking, whatever the checkpoint's
`decode` section says); the variants run round-robin, `--rounds` times, so that the machine's load hits
them alike, and the median sentences/s is reported with its ratio to the plain command.
The prefix variant forces, per line, the first 3 words of the plain command's own output
(a prefix the model would produce anyway: the search work stays comparable).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


VARIANTS = {
    "plain": [],
    "sampling topk 10": ["--sampling", "topk", "--topk", "10"],
    "sampling topp 0.9": ["--sampling", "topp", "--topp", "0.9"],
    "prefix (3 words)": "PREFIX",
    "no-repeat-ngram 3": ["--no-repeat-ngram", "3"],
    "alignment": ["--alignment"],
}


def run(args, inp: str, out: str, extra: list[str], beam: int) -> float:
    cmd = [sys.executable, "-m", "nmt", "translate", "-c", args.checkpoint, "-i", inp, "-o", out, "--beam", str(beam),
           "--batch-size", "32", "--sampling", "none", "--no-repeat-ngram", "0", "-q", *args.flags.split(), *extra]  # plain, whatever the
    # checkpoint's decode defaults; a variant's own flags come later and win
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=os.path.join(os.path.dirname(__file__), ".."))
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--sentences", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--beams", type=int, nargs="+", default=[5, 1])
    ap.add_argument("--json", metavar="OUT")
    ap.add_argument("--flags", default="", help="flags every command gets (e.g. --tgt-lang L for a multilingual model)")
    ap.add_argument("--only", default=",".join(VARIANTS), help="comma-separated built-in variants to run (plain always)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=FLAGS",
                    help="another variant: the plain command plus FLAGS (repeatable)")
    args = ap.parse_args()
    variants = {name: flags for name, flags in VARIANTS.items() if name == "plain" or name in args.only.split(",")}
    variants.update((name, flags.split()) for name, _, flags in (v.partition("=") for v in args.variant))
    from nmt.textio import read_lines

    lines = [x for x in read_lines(args.input) if x][: args.sentences]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        inp = os.path.join(tmp, "in.txt")
        with open(inp, "w", encoding="utf-8") as f:
            f.write("".join(x + "\n" for x in lines))
        for beam in args.beams:
            plain_out = os.path.join(tmp, f"plain{beam}.txt")
            run(args, inp, plain_out, [], beam)  # warm-up, and the prefixes' source
            prefix = os.path.join(tmp, f"prefix{beam}.txt")
            with open(plain_out, encoding="utf-8") as f, open(prefix, "w", encoding="utf-8") as g:
                g.write("".join(" ".join(x.split()[:3]) + "\n" for x in f.read().splitlines()))
            times: dict[str, list[float]] = {name: [] for name in variants}
            for _ in range(args.rounds):
                for name, extra in variants.items():
                    flags = ["--prefix", prefix] if extra == "PREFIX" else extra
                    times[name].append(run(args, inp, os.path.join(tmp, "out.txt"), flags, beam))
            base = len(lines) / statistics.median(times["plain"])
            for name, t in times.items():
                rate = len(lines) / statistics.median(t)
                results[f"beam{beam} {name}"] = dict(sent_per_s=rate, ratio=rate / base, seconds=t)
                print(f"beam {beam:<2} {name:<20} {rate:7.2f} sent/s  {rate / base:5.2f}x  "
                      f"({', '.join(f'{x:.1f}' for x in t)} s)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(checkpoint=args.checkpoint, sentences=len(lines), results=results), f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
