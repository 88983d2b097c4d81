"""Corpus-level scores with sacreBLEU (BLEU, chrF, TER) and the choice of BLEU's tokenizer, for `nmt evaluate`
and validation (nmt/training/validation.py).

Scores use sacreBLEU's Python API with its defaults, so they equal the `sacrebleu` command's on the
same files. The target language chooses BLEU's tokenizer unless the user does (`language_tokenize`:
ja-mecab for Japanese, zh for Chinese, else 13a); `check_tokenize` refuses one sacreBLEU lacks.
"""

from __future__ import annotations

import functools
import re
from typing import Iterable, Sequence

from nmt.errors import UserError

METRICS = ("bleu", "chrf", "ter")
TOKENIZERS = ("13a", "intl", "zh", "ja-mecab", "ko-mecab", "char", "none")  # sacreBLEU's, without downloads


def check_metrics(names: Sequence[str]) -> None:
    """UserError for no metric, or one that is not in `METRICS` (names in lower case)."""
    if not names:
        raise UserError(f"no metric given (choose from {', '.join(METRICS)})")
    for name in names:
        if name not in METRICS:
            raise UserError(f"unknown metric {name!r} (choose from {', '.join(METRICS)})")


def check_line_counts(ref: tuple[str, Sequence[str]], *others: tuple[str, Sequence[str] | None]) -> None:
    """UserError naming the first of `others` (name, lines; None lines skipped) whose line count is not the
    reference's (name, lines)."""
    ref_name, refs = ref
    for name, lines in others:
        if lines is not None and len(lines) != len(refs):
            raise UserError(f"line counts differ: {len(lines)} lines in {name} but {len(refs)} in {ref_name}")


def check_tokenize(tokenize: str | None) -> None:
    """UserError for a tokenizer sacreBLEU does not have, or one whose extra packages are missing."""
    if tokenize is None:
        return
    if tokenize not in TOKENIZERS:
        raise UserError(f"unknown BLEU tokenizer {tokenize!r} (choose from {', '.join(TOKENIZERS)})")
    if tokenize in ("ja-mecab", "ko-mecab"):
        from sacrebleu.metrics import BLEU

        try:
            BLEU(tokenize=tokenize)
        except (RuntimeError, ImportError):
            extra = "ja" if tokenize == "ja-mecab" else "ko"
            raise UserError(f"--tokenize {tokenize} needs MeCab: pip install \"sacrebleu[{extra}]\"") from None


JAPANESE, CHINESE = ("ja", "jpn"), ("zh", "zho", "cmn")  # codes (before any '_' or '-') per family


@functools.lru_cache(maxsize=None)
def _has_mecab() -> bool:
    try:
        check_tokenize("ja-mecab")
    except UserError:
        return False
    return True


def language_tokenize(lang: str | None) -> tuple[str | None, str | None]:
    """(sacreBLEU BLEU tokenizer for hypotheses in `lang`, warning or None): "ja-mecab" for Japanese
    (`ja`, `ja_JP`, `jpn_Jpan`; "char" and a warning when MeCab is not installed), "zh" for Chinese
    (`zh`, `zh_CN`, `zho_Hans`, `cmn`), None (sacreBLEU's default, 13a) for any other language or None."""
    base = re.split(r"[_\-]", lang.lower())[0] if lang else ""
    if base in JAPANESE:
        if _has_mecab():
            return "ja-mecab", None
        return "char", (f"BLEU for Japanese ({lang}) uses sacreBLEU's char tokenizer: ja-mecab needs MeCab, which is "
                        "not installed (pip install \"sacrebleu[ja]\"); char BLEU is not comparable with ja-mecab BLEU")
    if base in CHINESE:
        return "zh", None
    return None, None


def make_metric(name: str, *, lowercase: bool, tokenize: str | None):
    """A sacreBLEU metric object with sacreBLEU's defaults (`name` one of `METRICS`).

    `lowercase` applies to BLEU and chrF, `tokenize` to BLEU; TER keeps its
    default (case-insensitive), as the `sacrebleu` command does.
    """
    from sacrebleu.metrics import BLEU, CHRF, TER

    if name == "bleu":
        return BLEU(lowercase=lowercase, tokenize=tokenize)
    if name == "chrf":
        return CHRF(lowercase=lowercase)
    return TER()


def corpus_metrics(hyps: Sequence[str], refs: Sequence[str], metrics: Iterable[str] = ("bleu", "chrf"), *,
                   lowercase: bool = False, tokenize: str | None = None) -> dict:
    """Corpus scores of `hyps` against one reference per line: `{metric: {...}}` in the order asked
    ("bleu", "chrf", "ter"), each with `name` (sacreBLEU's), `score` (0-100), `signature`, `verbose`
    (BLEU's details) and `text` (the line `nmt evaluate` prints); BLEU also `precisions`, `bp`, `ratio`,
    `hyp_len`, `ref_len`. `tokenize=None` is sacreBLEU's 13a. UserError when the line counts differ,
    nothing is scored, or a metric is unknown."""
    hyps, refs = list(hyps), list(refs)
    if len(hyps) != len(refs):
        raise UserError(f"{len(hyps)} hypotheses but {len(refs)} references: the line counts must match")
    if not hyps:
        raise UserError("nothing to score: no hypotheses and no references")
    names = [m.lower() for m in metrics]
    check_metrics(names)
    out: dict = {}
    for name in names:
        metric = make_metric(name, lowercase=lowercase, tokenize=tokenize)
        result = metric.corpus_score(hyps, [refs])
        signature = str(metric.get_signature())
        entry = {"name": result.name, "score": float(result.score), "signature": signature,
                 "verbose": getattr(result, "_verbose", "") or ""}
        if name == "bleu":
            entry.update(precisions=[float(p) for p in result.precisions], bp=float(result.bp),
                         ratio=float(result.ratio), hyp_len=int(result.sys_len), ref_len=int(result.ref_len))
        entry["text"] = f"{result.format(width=2)} [{signature}]"
        out[name] = entry
    return out
