"""Output length against training: greedy and beam length ratios, and where the model puts EOS.

    python scripts/length_sweep.py --checkpoint A.pt B.pt ... --src data/bible-es-en/dev.es.gz \
        --ref data/bible-es-en/dev.en.gz [--lines 500] [--json OUT]

For each checkpoint (e.g. the same run at several steps): BLEU, BP and hyp/ref length ratio of
greedy search and of beam 5 under several length penalties, with and without 3-gram blocking
(every penalty from one `keep_all` beam search per blocking setting, as `nmt tune` scores them:
nmt/translation/tune.py), and the EOS statistics of scripts/length_report.py (teacher-forced along the
references). The first `--lines` lines of the dev set (all with 0).
"""

from __future__ import annotations

import argparse

from nmt.benchmarking import paired_lines, run_script, write_json


SETTINGS = [("greedy", 1, "none", 0.0), ("beam 5 none", 5, "none", 0.0), ("beam 5 gnmt 1.0", 5, "gnmt", 1.0),
            ("beam 5 average 1.0", 5, "average", 1.0), ("beam 5 average 1.2", 5, "average", 1.2)]


def sweep(path: str, src: list[str], ref: list[str]) -> dict:
    from nmt.benchmarking import eos_statistics
    from nmt.translation.torch_engine import TorchEngine
    from nmt.translation.tune import Decoder, Scorer, Setting, pick

    engine = TorchEngine.load(path, "cpu")
    decode = engine.decode
    decoder, scorer = Decoder(engine, src, decode), Scorer(ref, "bleu")
    lines = list(range(len(src)))
    out: dict = {"step": None}
    for ngram in (0, 3):
        runs = {beam: decoder.run((beam, ngram), lines) for beam in (1, 5)}
        for name, beam, kind, alpha in SETTINGS:
            setting = Setting(beam, ngram, kind, alpha)
            texts = [decoder.texts(i, [pick(runs[beam][i], setting)])[0] for i in lines]
            bleu, bp, ratio, loops = scorer.score(lines, texts)
            out[f"{name}, no-repeat {ngram}"] = {"bleu": bleu, "bp": bp, "ratio": ratio, "loops": loops}
    out["eos"] = eos_statistics(TorchEngine.load(path, "cpu", fast=False), src, ref)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, nargs="+")
    ap.add_argument("--src", required=True)
    ap.add_argument("--ref", required=True)
    ap.add_argument("--lines", type=int, default=0)
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args()
    return run_script("length_sweep.py", lambda: report(args))


def report(args) -> int:
    from nmt.model.checkpoint import load_record
    from nmt import textio

    checkpoints = {f"--checkpoint {i + 1}": p for i, p in enumerate(args.checkpoint)}
    textio.check_paths({"--src": args.src, "--ref": args.ref, **checkpoints}, {"--json": args.json} if args.json else {})
    src, ref = paired_lines(args.src, args.ref, args.lines)
    results = {}
    for path in args.checkpoint:
        res = sweep(path, src, ref)
        res["step"] = load_record(path).step
        results[path] = res
        print(f"{path} (step {res['step']}):", flush=True)
        for key, v in res.items():
            if key not in ("step", "eos"):
                print(f"  {key:<32} BLEU {v['bleu']:6.2f}  BP {v['bp']:.3f}  ratio {v['ratio']:.3f}  "
                      f"loops {100 * v['loops']:4.1f}%", flush=True)
        print("  EOS: " + ", ".join(f"{k} {v:.4g}" for k, v in res["eos"].items()), flush=True)
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
