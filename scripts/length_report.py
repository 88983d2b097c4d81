"""Where does a model put EOS? Teacher-forced end-of-sentence statistics along the references.

    python scripts/length_report.py --checkpoint runs/quickstart/checkpoints/best.pt \
        --src data/bible-es-en/dev.es.gz --ref data/bible-es-en/dev.en.gz [--json OUT]

For each reference y (given its source), one teacher-forced pass gives p(EOS | y_<t, x) at
every position t = 0 .. len(y). Reported:
- early_eos_mass: mean p(EOS) over the positions before the reference's end (what a model
  that stops early has too much of);
- early_eos_argmax: share of those positions where EOS is the most probable token (greedy
  search would stop there if it got that far on the reference's path);
- sentences_early_argmax: share of references with at least one such position;
- final_eos_logp: mean log p(EOS) at the reference's end (how sure the model is to stop there);
- final_eos_argmax: share of references whose end has EOS as the most probable token.
"""

from __future__ import annotations

import argparse

from nmt.benchmarking import eos_statistics, paired_lines, run_script, write_json


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, nargs="+")
    ap.add_argument("--src", required=True)
    ap.add_argument("--ref", required=True)
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args()
    return run_script("length_report.py", lambda: report(args))


def report(args) -> int:
    from nmt.translation.torch_engine import TorchEngine
    from nmt import textio

    checkpoints = {f"--checkpoint {i + 1}": p for i, p in enumerate(args.checkpoint)}
    textio.check_paths({"--src": args.src, "--ref": args.ref, **checkpoints}, {"--json": args.json} if args.json else {})
    src, ref = paired_lines(args.src, args.ref)
    out = {}
    for path in args.checkpoint:
        stats = eos_statistics(TorchEngine.load(path, "cpu", fast=False), src, ref)
        out[path] = stats
        print(f"{path}: " + ", ".join(f"{k} {v:.4g}" for k, v in stats.items()), flush=True)
    write_json(args.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
