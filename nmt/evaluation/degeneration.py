"""A report of degenerate outputs: loops, outputs far too short or long, copies, empty lines, outputs
cut off at the length limit, off-target outputs; `nmt evaluate` and every validation print it.
Words are the tokens of sacreBLEU's BLEU tokenizer, so the counts work for any script.

    report = degeneration(hyps, refs=refs, srcs=srcs, finished=finished)
    format_report(report)  ->  "degeneration (N lines): loops ...% (n), short ...% (n), ..."

Categories, each with `count`, `share` and the 1-based `lines` it flags:
- loops: a word 3-gram occurs 3 or more times in the output;
- short / long: output words / reference words < 0.5 or > 2 (against the source without a
  reference); lines whose reference (or source) is empty are not judged;
- copies: the output equals the (non-empty) source;
- empty: the output is empty although the source (or reference) is not;
- at_limit: stopped at the maximum length without EOS (only with `finished` flags, else None);
- off_target: in another language than `lang` (nmt/text/langid.py; only with an identifier, else
  None), next to the references' own rate (`reference_share`).
"""

from __future__ import annotations

import collections
from typing import Callable, Sequence

SHORT, LONG = 0.5, 2.0
LOOP_N, LOOP_TIMES = 3, 3
CATEGORIES = ("loops", "short", "long", "copies", "empty", "at_limit", "off_target")


def _tokenizer(tokenize: str | None) -> Callable[[str], list[str]]:
    from sacrebleu.metrics import BLEU

    tok = BLEU(tokenize=tokenize).tokenizer
    return lambda text: tok(text.rstrip()).split()


def loops(words: Sequence[str], n: int = LOOP_N, times: int = LOOP_TIMES) -> bool:
    """True when some n-gram of `words` occurs at least `times` times."""
    counts = collections.Counter(tuple(words[i:i + n]) for i in range(len(words) - n + 1))
    return bool(counts) and max(counts.values()) >= times


def degeneration(hyps: Sequence[str], refs: Sequence[str] | None = None, srcs: Sequence[str] | None = None,
                 finished: Sequence[bool] | None = None, tokenize: str | None = None, *, identifier=None,
                 lang: str | None = None) -> dict:
    """The report of the module docstring, as a dict: {"lines": N, "against": "reference" | "source" |
    None, category: {"count", "share", "lines"} (at_limit None without `finished`; off_target None
    without `identifier` (a nmt.text.langid.LanguageIdentifier) and a `lang` it knows, else also "lang"
    and, with `refs`, "reference_count" and "reference_share")}."""
    split = _tokenizer(tokenize)
    n = len(hyps)
    flagged: dict[str, list[int]] = {c: [] for c in CATEGORIES}
    against = refs if refs is not None else srcs
    for i, hyp in enumerate(hyps):
        words = split(hyp)
        if loops(words):
            flagged["loops"].append(i + 1)
        if against is not None:
            other = len(split(against[i]))
            if other:
                ratio = len(words) / other
                if ratio < SHORT:
                    flagged["short"].append(i + 1)
                elif ratio > LONG:
                    flagged["long"].append(i + 1)
                if not words:
                    flagged["empty"].append(i + 1)
        if srcs is not None and hyp.strip() and hyp.strip() == srcs[i].strip():
            flagged["copies"].append(i + 1)
        if finished is not None and not finished[i]:
            flagged["at_limit"].append(i + 1)
    report: dict = {"lines": n, "against": "reference" if refs is not None else "source" if srcs is not None else None}
    for c in CATEGORIES:
        if c == "off_target":
            report[c] = _off_target(hyps, refs, identifier, lang)
        elif c == "at_limit" and finished is None:
            report[c] = None
        elif c == "copies" and srcs is None:
            report[c] = None
        else:
            report[c] = {"count": len(flagged[c]), "share": len(flagged[c]) / n if n else 0.0, "lines": flagged[c]}
    return report


def _off_target(hyps: Sequence[str], refs: Sequence[str] | None, identifier, lang: str | None) -> dict | None:
    if identifier is None or lang is None or lang not in identifier.langs:
        return None
    from nmt.text.langid import off_target

    n = len(hyps)
    count, lines = off_target(hyps, lang, identifier)
    entry = {"count": count, "share": count / n if n else 0.0, "lines": lines, "lang": lang}
    if refs is not None:
        ref_count = off_target(refs, lang, identifier)[0]
        entry.update(reference_count=ref_count, reference_share=ref_count / n if n else 0.0)
    return entry


def _format(category: str, entry: dict) -> str:
    text = f"{category.replace('_', ' ')} {100 * entry['share']:.1f}% ({entry['count']}"
    if entry.get("reference_share") is not None:
        text += f"; references {100 * entry['reference_share']:.1f}%"
    return text + ")"


def format_report(report: dict) -> str:
    """One line: the share and count of each category that was measured (off target: with the
    references' own share)."""
    parts = [_format(c, report[c]) for c in CATEGORIES if report.get(c) is not None]
    against = f"; lengths against the {report['against']}" if report.get("against") else ""
    return f"degeneration ({report['lines']} lines{against}): " + ", ".join(parts)


def scalars(report: dict) -> dict[str, float]:
    """{category share} for TensorBoard (measured categories only)."""
    return {f"degenerate_{c}": report[c]["share"] for c in CATEGORIES if report.get(c) is not None}
