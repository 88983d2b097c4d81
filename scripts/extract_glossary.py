#!/usr/bin/env python3
"""Extract a glossary from a parallel corpus: single source/target words that align strongly (issue 37).

The rule is nmt.text.terms.extract_dictionary's (the one `data.term_dictionary: null` uses): words in at
least --min-count lines, not among the --stopwords most frequent of their side, that occur together
in at least --min-share of each one's lines, linked one to one by Dice coefficient; rarest source
word first. Writes `source<TAB>target` lines (nmt translate --glossary, nmt evaluate --glossary,
data.term_dictionary) after one `#` comment line saying how they were made.

    python3 scripts/extract_glossary.py --src data/bible-es-en/train.es.gz --tgt data/bible-es-en/train.en.gz \\
        --out bible-es-en.glossary.tsv --apply data/bible-es-en/test.es.gz

--apply FILE also reports how many lines of FILE (e.g. the test split's sources) hold a term, and how
many entries match there. Needs `nmt` installed (pip install -e .).
"""

from __future__ import annotations

import argparse
import itertools
import sys

from nmt import textio
from nmt.benchmarking import run_script
from nmt.errors import UserError
from nmt.text.glossary import Glossary
from nmt.text.terms import extract_dictionary


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--src", required=True, help="source side of the corpus (plain or gzip)")
    p.add_argument("--tgt", required=True, help="target side, line-aligned with --src")
    p.add_argument("--out", default="-", help="the glossary TSV to write (default: standard output)")
    p.add_argument("--min-count", type=int, default=3, help="lines each word must occur in (default 3)")
    p.add_argument("--min-share", type=float, default=0.7,
                   help="share of each word's lines that must hold the other one (default 0.7)")
    p.add_argument("--stopwords", type=int, default=100,
                   help="most frequent words of each side left out (at most a tenth of them; default 100)")
    p.add_argument("--max-lines", type=int, default=200_000, help="read at most this many pairs (default 200000)")
    p.add_argument("--max-entries", type=int, default=0, help="keep the first N entries, rarest first (0 = all)")
    p.add_argument("--no-identical", action="store_true",
                   help="leave out words translated by themselves (names, identifiers)")
    p.add_argument("--apply", metavar="FILE", help="report the lines of FILE that hold a term")
    args = p.parse_args(argv)
    if args.min_count < 1 or not 0 < args.min_share <= 1 or args.stopwords < 0 or args.max_lines < 1 \
            or args.max_entries < 0:
        p.error("--min-count and --max-lines must be >= 1, --min-share in (0, 1], --stopwords and --max-entries >= 0")
    return args


def pairs(src: str, tgt: str):
    """Aligned (source, target) lines; UserError when the files have different numbers of lines."""
    for number, (a, b) in enumerate(itertools.zip_longest(textio.iter_lines(src), textio.iter_lines(tgt)), 1):
        if a is None or b is None:
            raise UserError(f"{src} and {tgt} have different numbers of lines ({number - 1} pairs, then one "
                            f"file ends)")
        yield a, b


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_script("extract_glossary.py", lambda: extract(args))


def extract(args) -> int:
    inputs = {"--src": args.src, "--tgt": args.tgt} | ({"--apply": args.apply} if args.apply else {})
    textio.check_paths(inputs, {"--out": args.out})
    entries = extract_dictionary(pairs(args.src, args.tgt), min_count=args.min_count, min_share=args.min_share,
                                 stopwords=args.stopwords, max_lines=args.max_lines,
                                 identical=not args.no_identical)
    entries = entries[:args.max_entries or None]
    applied = textio.read_lines(args.apply) if args.apply else None  # (read, and checked, before any output)
    header = (f"# {len(entries)} entries from {args.src} / {args.tgt} (scripts/extract_glossary.py --min-count "
              f"{args.min_count} --min-share {args.min_share:g} --stopwords {args.stopwords} --max-lines "
              f"{args.max_lines}{' --no-identical' if args.no_identical else ''})")
    textio.write_lines(args.out, [header] + [f"{e.source}\t{e.target}" for e in entries])
    print(f"{len(entries)} entries written to {'standard output' if textio.is_stdin(args.out) else args.out}",
          file=sys.stderr)
    if applied is not None:
        glossary = Glossary(entries)
        matched = [glossary.match(line) for line in applied]
        used = {m.entry for ms in matched for m in ms}
        print(f"{args.apply}: {sum(map(bool, matched))} of {len(matched)} lines hold a term "
              f"({sum(map(len, matched))} matches of {len(used)} entries)", file=sys.stderr)
    return 0

if __name__ == "__main__":
    sys.exit(main())
