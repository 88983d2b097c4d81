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
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def eos_statistics(engine, src_lines: list[str], ref_lines: list[str], batch: int = 64) -> dict:
    import torch
    import torch.nn.functional as F

    from nmt.layout import source_tensors, target_tensors

    model, tok = engine.model, engine.tokenizer
    PAD, START, EOS = tok.specials.pad, tok.specials.start, tok.specials.eos
    limit = engine.max_positions - 1
    pairs = [(x[:limit], y[:limit - 1]) for x, y in zip(tok.encode_src(src_lines), tok.encode_tgt(ref_lines))
             if x and y]
    early_mass = early_argmax = early_positions = sentences_early = final_logp = final_argmax = 0.0
    with torch.inference_mode():
        for i in range(0, len(pairs), batch):
            chunk = pairs[i:i + batch]
            src, mask = source_tensors([x for x, _ in chunk], tok.specials)
            tgt_in, _ = target_tensors([y for _, y in chunk], tok.specials)
            logp = F.log_softmax(model(src, mask, tgt_in).float(), dim=-1)  # [B,T,V]
            logp[:, :, PAD] = float("-inf")  # as the search sees them
            logp[:, :, START] = float("-inf")
            p_eos, best = logp[:, :, EOS].exp(), logp.argmax(dim=-1)  # [B,T]
            for b, (_, y) in enumerate(chunk):
                n = len(y)  # positions 0..n-1 predict y, position n predicts EOS
                early_mass += float(p_eos[b, :n].sum())
                argmax_early = int((best[b, :n] == EOS).sum())
                early_argmax += argmax_early
                early_positions += n
                sentences_early += argmax_early > 0
                final_logp += float(logp[b, n, EOS])
                final_argmax += int(best[b, n]) == EOS
    n = len(pairs)
    return {"sentences": n, "early_eos_mass": early_mass / early_positions, "early_eos_argmax": early_argmax / early_positions,
            "sentences_early_argmax": sentences_early / n, "final_eos_logp": final_logp / n,
            "final_eos_argmax": final_argmax / n}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, nargs="+")
    ap.add_argument("--src", required=True)
    ap.add_argument("--ref", required=True)
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args()
    from nmt.torch_engine import TorchEngine
    from nmt.textio import read_lines

    src, ref = read_lines(args.src), read_lines(args.ref)
    out = {}
    for path in args.checkpoint:
        stats = eos_statistics(TorchEngine.load(path, "cpu", fast=False), src, ref)
        out[path] = stats
        print(f"{path}: " + ", ".join(f"{k} {v:.4g}" for k, v in stats.items()), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
