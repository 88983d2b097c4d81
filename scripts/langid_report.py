#!/usr/bin/env python3
"""Measure nmt.text.langid on the gettext corpus (build it first: scripts/prepare_gettext.py).

Trains a LanguageIdentifier on the train split (the xx side of each train.en-xx pair file, and
the English side of the largest one as "en"), then prints

1. accuracy per language on the dev split, by message length in characters, and without the
   dev lines whose translation is identical to the English message;
2. off_target on the test split per margin: the share of references flagged (the floor), of
   English lines and of other-language lines put in place of the expected language (recall),
   from the multi-way test files (the same messages in every language).

    python3 scripts/langid_report.py [--data data/gettext] [--max-lines 50000] [--compare-ct]

--compare-ct adds Cavnar-Trenkle rank profiles (top 400 and 2000 1-5-grams, out-of-place
distance) on the same dev split, the alternative data/gettext/README.md compares against.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import math
import sys
import time
from pathlib import Path

from nmt.benchmarking import run_script
from nmt.text.langid import LanguageIdentifier, ngrams, off_target

BUCKETS = ("<10", "10-19", "20+")


def read(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")[:-1]


def bucket(text: str) -> str:
    return "<10" if len(text) < 10 else "10-19" if len(text) < 20 else "20+"


def load(data: Path, split: str, langs: list[str]) -> dict[str, list[tuple[str, bool]]]:
    """{lang: [(line, identical to its English message)]}; "en" from the largest pair file."""
    out = {}
    for lang in langs:
        en, xx = read(data / f"{split}.en-{lang}.en"), read(data / f"{split}.en-{lang}.{lang}")
        out[lang] = [(x, x == e) for e, x in zip(en, xx)]
    largest = max(langs, key=lambda lang: len(out[lang]))
    out["en"] = [(e, False) for e in read(data / f"{split}.en-{largest}.en")]
    return out


def accuracy_table(predict, dev: dict) -> str:
    columns = ("all", *BUCKETS, "not identical")
    rows = [f"{'lang':6}" + "".join(f"{c:>17}" for c in columns)]
    totals = collections.defaultdict(lambda: [0, 0])
    confusions: collections.Counter = collections.Counter()
    for lang, items in dev.items():
        acc = collections.defaultdict(lambda: [0, 0])
        for text, identical in items:
            predicted = predict(text)
            ok = predicted == lang
            if not ok:
                confusions[f"{lang}->{predicted}"] += 1
            for key in ("all", bucket(text)) + (() if identical else ("not identical",)):
                acc[key][0] += ok
                acc[key][1] += 1
                totals[key][0] += ok
                totals[key][1] += 1
        rows.append(f"{lang:6}" + "".join(f"{100 * acc[c][0] / max(acc[c][1], 1):9.1f}% ({acc[c][1]:4d})"
                                          for c in columns))
    rows.append(f"{'all':6}" + "".join(f"{100 * totals[c][0] / max(totals[c][1], 1):9.1f}% ({totals[c][1]:4d})"
                                       for c in columns))
    rows.append("most frequent errors: " + ", ".join(f"{k} {v}" for k, v in confusions.most_common(10))
                + f"; ja->zh_CN {confusions['ja->zh_CN']}, zh_CN->ja {confusions['zh_CN->ja']}")
    return "\n".join(rows)


def off_target_table(ident: LanguageIdentifier, data: Path, langs: list[str], margins: list[float]) -> str:
    multi = {lang: read(data / f"test.multi.{lang}") for lang in ("en", *langs)}
    refs = {lang: read(data / f"test.en-{lang}.{lang}") for lang in langs}
    rows = [f"{'margin':>6}  " + " ".join(f"{lang:>16}" for lang in langs) + "   (refs / en / other, %)"]
    for margin in margins:
        cells = []
        for lang in langs:
            floor = off_target(refs[lang], lang, ident, margin)[0] / len(refs[lang])
            english = off_target(multi["en"], lang, ident, margin)[0] / len(multi["en"])
            others = [h for other in langs if other != lang for h in multi[other]]
            other = off_target(others, lang, ident, margin)[0] / len(others)
            cells.append(f"{100 * floor:4.1f}/{100 * english:4.1f}/{100 * other:4.1f}")
        rows.append(f"{margin:6g}  " + " ".join(f"{c:>16}" for c in cells))
    return "\n".join(rows)


class RankProfiles:
    """Cavnar & Trenkle (1994): the `top` most frequent n-grams by rank; out-of-place distance."""

    def __init__(self, corpora: dict, top: int, orders=(1, 2, 3, 4, 5), max_lines: int | None = None):
        self.top, self.orders = top, orders
        self.profiles = {lang: self._ranks(itertools.islice(lines, max_lines)) for lang, lines in corpora.items()}

    def _ranks(self, lines) -> dict[str, int]:
        counts = collections.Counter(g for line in lines for g in ngrams(line, self.orders))
        ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:self.top]
        return {g: rank for rank, (g, _) in enumerate(ranked)}

    def predict(self, text: str) -> str:
        doc = self._ranks([text])
        return min(self.profiles, key=lambda lang: (sum(abs(self.profiles[lang][g] - r) if g in self.profiles[lang]
                                                        else self.top for g, r in doc.items()), lang))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("data/gettext"))
    parser.add_argument("--langs", default="es,de,fr,pt_BR,it,ru,ja,zh_CN")
    parser.add_argument("--max-lines", type=int, default=50000, help="training lines per language")
    parser.add_argument("--margins", default="0,2,5,10,20")
    parser.add_argument("--compare-ct", action="store_true")
    args = parser.parse_args(argv)
    return run_script("langid_report.py", lambda: report(args))


def report(args) -> int:
    from nmt.errors import UserError

    langs = [lang for lang in args.langs.split(",") if lang]
    if len(langs) < 2:
        raise UserError(f"--langs {args.langs!r}: give at least two languages (off-target counts the others)")
    if args.max_lines < 1:
        raise UserError(f"--max-lines must be at least 1, got {args.max_lines}")
    try:
        margins = [float(m) for m in args.margins.split(",")]
    except ValueError:
        raise UserError(f"--margins {args.margins!r}: expected numbers, e.g. 0,2,5") from None
    if not all(math.isfinite(m) and m >= 0 for m in margins):
        raise UserError(f"--margins {args.margins!r}: each must be a finite number >= 0")
    missing = [lang for lang in langs for split in ("train", "dev", "test")
               if not (args.data / f"{split}.en-{lang}.{lang}").is_file()]
    if missing:
        raise UserError(f"no gettext corpus for {', '.join(dict.fromkeys(missing))} in {args.data}; build it with "
                        "scripts/prepare_gettext.py")
    train = {lang: [t for t, _ in items] for lang, items in load(args.data, "train", langs).items()}
    dev = load(args.data, "dev", langs)
    start = time.perf_counter()
    ident = LanguageIdentifier.train(train, max_lines=args.max_lines)
    print(f"naive Bayes 1-4-grams, 20000 per language, {args.max_lines} lines per language: "
          f"trained in {time.perf_counter() - start:.1f} s, {len(ident.index)} n-grams")
    print(accuracy_table(ident.predict, dev))
    print("\noff_target on test: references flagged / English lines flagged / other-language lines flagged")
    print(off_target_table(ident, args.data, langs, margins))
    if args.compare_ct:
        for top in (400, 2000):
            ct = RankProfiles(train, top, max_lines=args.max_lines)
            print(f"\nCavnar-Trenkle rank profiles, top {top} 1-5-grams")
            print(accuracy_table(ct.predict, dev))
    return 0


if __name__ == "__main__":
    sys.exit(main())
