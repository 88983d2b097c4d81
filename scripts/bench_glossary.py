#!/usr/bin/env python3
"""Guaranteed terminology (issue 37): term use, quality and speed of constrained search, on one corpus.

    python3 scripts/bench_glossary.py --train-src data/bible-es-en/train.es.gz --train-tgt data/bible-es-en/train.en.gz \\
        --test-src data/bible-es-en/test.es.gz --test-tgt data/bible-es-en/test.en.gz \\
        --plain runs/bible-plain/checkpoints/best.pt --terms runs/bible-terms/checkpoints/best.pt --out runs/bench-glossary-bible

The glossary is extracted from the training pairs by nmt.text.terms.extract_dictionary (scripts/extract_glossary.py's
rule; words translated by themselves, mostly names, left out unless --identical) and written to OUT/glossary.tsv
(or read from --glossary). The test split is translated with beam --beam, at most --batch sentences a batch
(decode.glossary_constrain --constrain), by:
  plain            the plain model, no glossary;
  plain+glossary   the plain model with the glossary (constrained search);
  terms            the model trained with data.terms (annotations), no glossary;
  terms+glossary   that model with the glossary (constrained search).
Per system: term use (matched entries whose target term appears in the output, nmt.text.glossary.term_use), BLEU and
chrF on all lines and on the lines with a term (sacreBLEU's API, as `nmt evaluate`), loops and too-long lines
(nmt's degeneration report), lines that reached the length limit. `--consistent`: each line gets only the matched
entries whose target term its reference holds (the test glossaries of Dinu et al., 2019: an entry the reference
does not use is a glossary error against that reference, and forcing it costs BLEU whatever the search does);
the lines are translated in groups that share their entries. Speed, same run, the plain model: the whole test
split with and without the glossary, and the lines no entry matches with and without it, alternating, --repeats
times each (median seconds). OUT/results.json and OUT/results.md; `--quick`: few lines, one repeat (a test runs it).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time

from nmt import textio
from nmt.api import Translator
from nmt.evaluation.degeneration import degeneration
from nmt.text.glossary import Glossary, appearing, lines_with_terms, read_glossary, term_use
from nmt.evaluation.metrics import corpus_metrics
from nmt.text.terms import extract_dictionary

SYSTEMS = (("plain", "plain", False), ("plain+glossary", "plain", True), ("terms", "terms", False),
           ("terms+glossary", "terms", True))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name in ("train-src", "train-tgt", "test-src", "test-tgt"):
        p.add_argument(f"--{name}", required=True)
    p.add_argument("--plain", required=True, help="checkpoint of a model trained without data.terms")
    p.add_argument("--terms", help="checkpoint of a model trained with data.terms (its rows are left out without it)")
    p.add_argument("--glossary", help="a TSV glossary to use instead of extracting one")
    p.add_argument("--identical", action="store_true", help="keep entries whose source and target are the same word")
    p.add_argument("--out", required=True)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--constrain", choices=("always", "missing"), default="always",
                   help="decode.glossary.constrain: which lines with a term get the constrained search")
    p.add_argument("--margin", type=float, help="decode.glossary.margin (default: the models' own)")
    p.add_argument("--batch", type=int, default=32, help="sentences per batch (decode.max_batch_size)")
    p.add_argument("--test-lines", type=int, default=0, help="the first N test lines (0 = all)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--parts", default="systems,speed", help="systems (term use and quality; load does not change "
                   "them) and/or speed (needs a quiet machine); results.json keeps the other part of an earlier run")
    p.add_argument("--systems", default=",".join(name for name, _, _ in SYSTEMS),
                   help="the systems to run (comma-separated); results.json keeps the others of an earlier run")
    p.add_argument("--consistent", action="store_true", help="per line, only the matched entries whose target "
                   "term the reference holds (Dinu et al., 2019's test glossaries); speed still uses the whole glossary")
    p.add_argument("--quick", action="store_true", help="20 test lines, one repeat")
    args = p.parse_args(argv)
    if args.quick:
        args.test_lines, args.repeats = args.test_lines or 20, 1
    return args


def glossary_of(args) -> list:
    if args.glossary:
        return read_glossary(args.glossary)
    pairs = zip(textio.iter_lines(args.train_src), textio.iter_lines(args.train_tgt))
    entries = extract_dictionary(pairs, identical=args.identical)
    textio.write_lines(os.path.join(args.out, "glossary.tsv"),
                       [f"# {len(entries)} entries: nmt.text.terms.extract_dictionary of {args.train_src} / {args.train_tgt}"
                        f"{'' if args.identical else ' (identical=False)'}"] + [f"{e.source}\t{e.target}" for e in entries])
    return entries


def consistent_entries(srcs, refs, glossary: Glossary) -> list[tuple]:
    """Per line, the entries matched in its source whose target term appears in its reference."""
    out = []
    for src, ref in zip(srcs, refs):
        found = list(dict.fromkeys(m.entry for m in glossary.match(src)))
        out.append(tuple(e for e, ok in zip(found, appearing([e.target for e in found], ref)) if ok))
    return out


def translate_per_line(translator: Translator, srcs, per_line: list[tuple]) -> list:
    """srcs translated, each line with its own entries (lines that share them in one call; none: no glossary)."""
    groups: dict[tuple, list[int]] = {}
    for i, entries in enumerate(per_line):
        groups.setdefault(entries, []).append(i)
    out: list = [None] * len(srcs)
    for entries, rows in groups.items():
        results = translator.translate([srcs[i] for i in rows], glossary=Glossary(entries) if entries else None)
        for i, r in zip(rows, results):
            out[i] = r
    return out


def term_use_per_line(hyps, srcs, per_line: list[tuple]) -> float | None:
    """term_use (percent) over every line's own entries."""
    matched = used = 0
    for hyp, src, entries in zip(hyps, srcs, per_line):
        if entries:
            u = term_use([hyp], [src], Glossary(entries))
            matched, used = matched + u["term_matches"], used + u["terms_used"]
    return 100.0 * used / matched if matched else None


def scores(hyps, refs, rows) -> dict:
    out = {}
    for name, part in (("all", range(len(hyps))), ("term_lines", rows)):
        m = corpus_metrics([hyps[i] for i in part], [refs[i] for i in part], ("bleu", "chrf")) if part else None
        out[f"bleu_{name}"] = m["bleu"]["score"] if m else None
        out[f"chrf_{name}"] = m["chrf"]["score"] if m else None
    return out


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def speed(translator: Translator, srcs, glossary, rows, repeats: int) -> dict:
    """Median seconds with and without the glossary (alternating), all lines and the unmatched ones."""
    matched = set(rows)
    unmatched = [s for i, s in enumerate(srcs) if i not in matched]
    out = {}
    for name, lines in (("all", srcs), ("no_term_lines", unmatched)):
        with_g, without = [], []
        for _ in range(repeats):
            without.append(timed(lambda: translator.translate(lines), 1))
            with_g.append(timed(lambda: translator.translate(lines, glossary=glossary), 1))
        out[name] = {"lines": len(lines), "seconds": statistics.median(without),
                     "seconds_glossary": statistics.median(with_g),
                     "ratio": statistics.median(with_g) / max(statistics.median(without), 1e-9)}
    return out


def markdown(result: dict) -> str:
    rows = ["| system | term use | BLEU | chrF | BLEU (term lines) | chrF (term lines) | loops | too long | at limit |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    f = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
    for name, s in result["systems"].items():
        rows.append(f"| {name} | {f(s['term_use'])}% | {f(s['bleu_all'])} | {f(s['chrf_all'])} | "
                    f"{f(s['bleu_term_lines'])} | {f(s['chrf_term_lines'])} | {s['loops']} | {s['long']} | "
                    f"{s['at_limit']} |")
    if result.get("load") is not None:
        rows.append(f"\nLoad average (1 min) when the speed was measured: {result['load']:.2f}.")
    g = result["glossary"]
    kept = " whose target the reference holds (--consistent)" if g.get("consistent") else ""
    rows += ["", f"Glossary: {g['entries']} entries; {g['term_lines']} of {g['test_lines']} test lines hold a term{kept} "
                 f"({g['term_matches']} matched entries).", "",
             "| speed (plain model, beam {beam}, batch {batch}, glossary_constrain {constrain}) | lines | s | s with glossary | ratio |".format(**result),
             "|---|---:|---:|---:|---:|"]
    for name, s in result["speed"].items():
        rows.append(f"| {name} | {s['lines']} | {s['seconds']:.2f} | {s['seconds_glossary']:.2f} | {s['ratio']:.3f} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    entries = glossary_of(args)
    glossary = Glossary(entries)
    limit = args.test_lines or None
    srcs = list(itertools.islice(textio.iter_lines(args.test_src), limit))
    refs = list(itertools.islice(textio.iter_lines(args.test_tgt), limit))
    per_line = consistent_entries(srcs, refs, glossary) if args.consistent else None
    rows = [i for i, e in enumerate(per_line) if e] if per_line is not None else lines_with_terms(srcs, glossary)
    options = {"beam_size": args.beam, "max_batch_size": args.batch, "batch_tokens": 1_000_000, "nbest": 1,
               "glossary_constrain": args.constrain,
               **({"glossary_margin": args.margin} if args.margin is not None else {})}
    models = {"plain": args.plain, "terms": args.terms}
    wanted = {model for name, model, _ in SYSTEMS if name in args.systems.split(",")} | {"plain"}
    translators = {k: Translator(v, device=args.device, **options) for k, v in models.items() if v and k in wanted}
    path = os.path.join(args.out, "results.json")
    result: dict = {"beam": args.beam, "batch": args.batch, "systems": {}, "speed": {}}
    if os.path.exists(path):  # (the part not run this time stays)
        with open(path, encoding="utf-8") as f:
            result.update(json.load(f))
    result["command"] = " ".join(sys.argv)
    result["constrain"] = args.constrain
    parts = args.parts.split(",")
    for name, model, constrained in SYSTEMS:
        if model not in translators or "systems" not in parts or name not in args.systems.split(","):
            continue
        start = time.perf_counter()
        if constrained and per_line is not None:
            out = translate_per_line(translators[model], srcs, per_line)
        else:
            out = translators[model].translate(srcs, glossary=glossary if constrained else None)
        hyps = [r.text for r in out]
        report = degeneration(hyps, refs, srcs, [r.finished for r in out])
        use = term_use_per_line(hyps, srcs, per_line) if per_line is not None else term_use(hyps, srcs, glossary)["term_use"]
        result["systems"][name] = {"term_use": use, **scores(hyps, refs, rows),
                                   "loops": report["loops"]["count"], "long": report["long"]["count"],
                                   "at_limit": report["at_limit"]["count"], "seconds": time.perf_counter() - start}
        textio.write_lines(os.path.join(args.out, f"{name}.txt"), hyps)
        print(f"{name}: {result['systems'][name]}", file=sys.stderr, flush=True)
    matches = sum(map(len, per_line)) if per_line is not None else term_use(srcs, srcs, glossary)["term_matches"]
    result["glossary"] = {"entries": len(glossary), "test_lines": len(srcs), "term_lines": len(rows),
                          "term_matches": matches, "consistent": bool(args.consistent)}
    if "speed" in parts:
        result["speed"] = speed(translators["plain"], srcs, glossary, rows, args.repeats)
        result["load"] = os.getloadavg()[0]
    textio.write_lines(path, [json.dumps(result, indent=1)])
    textio.write_lines(os.path.join(args.out, "results.md"), markdown(result).splitlines())
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
