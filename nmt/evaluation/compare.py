"""Is system B really better than system A on this test set? (`nmt evaluate --compare`)

    nmt evaluate --ref test.en --compare base.hyp new.hyp [more.hyp ...] [--src test.es] [--json]

Every file is compared with the first (the baseline) on the same references:
- corpus BLEU / chrF with a 95% confidence interval (bootstrap resampling);
- paired bootstrap resampling (Koehn, 2004) and paired approximate randomization (Riezler and
  Maxwell, 2005), sacreBLEU's own `PairedTest`, so the p-values equal the sacrebleu command's;
- per-line wins, ties and losses by sentence-level chrF (sentence BLEU is mostly smoothing);
- each system's degeneration report (nmt/evaluation/degeneration.py) and its difference.
A p-value below 0.05 says the difference is unlikely to be chance on this test set.
"""

from __future__ import annotations

import math
from typing import Sequence

from nmt.evaluation.degeneration import CATEGORIES, degeneration
from nmt.evaluation.metrics import check_line_counts, make_metric
from nmt.errors import UserError

BOOTSTRAP_SAMPLES = 1000  # sacreBLEU's defaults
AR_TRIALS = 10000
METRIC_NAMES = {"bleu": "BLEU", "chrf": "chrF2"}


def check_comparison(metrics: Sequence[str], n_systems: int) -> None:
    """UserError for a metric the paired tests do not take (`METRIC_NAMES`), or fewer than two systems."""
    for name in metrics:
        if name not in METRIC_NAMES:
            raise UserError(f"--compare supports the metrics bleu and chrf, not {name!r}")
    if n_systems < 2:
        raise UserError("--compare needs at least two hypothesis files (the first is the baseline)")


def paired_tests(systems: Sequence[tuple[str, Sequence[str]]], refs: Sequence[str], metrics: Sequence[str] = ("bleu", "chrf"),
                 *, tokenize: str | None = None, lowercase: bool = False, bootstrap: int = BOOTSTRAP_SAMPLES,
                 trials: int = AR_TRIALS) -> dict:
    """{metric: [per system {"score", "mean", "ci", "p_bootstrap", "p_ar"}]} (baseline first, its p-values
    None) and {"signatures": {metric: {"bs": ..., "ar": ...}}}. sacreBLEU's PairedTest, both test types."""
    from sacrebleu.significance import PairedTest

    check_comparison(metrics, len(systems))
    out: dict = {"signatures": {}}
    for name in metrics:
        per_test = {}
        for test, n in (("bs", bootstrap), ("ar", trials)):
            metric = make_metric(name, lowercase=lowercase, tokenize=tokenize)
            # ar: a bootstrap of the same size as the bs test gives its confidence intervals
            sigs, scores = PairedTest(list(systems), {name: metric}, [list(refs)], test_type=test, n_samples=n,
                                      n_ar_confidence=bootstrap if test == "ar" else -1)()
            key = next(k for k in scores if k != "System")
            per_test[test] = (scores[key], str(sigs[key]))
        rows = []
        base = per_test["bs"][0][0].score
        for bs, ar in zip(per_test["bs"][0], per_test["ar"][0]):
            rows.append({"score": float(bs.score), "mean": float(bs.mean), "ci": float(bs.ci),
                         "p_bootstrap": _p_value(bs, base), "p_ar": _p_value(ar, base)})
        out[name] = rows
        out["signatures"][name] = {"bs": per_test["bs"][1], "ar": per_test["ar"][1]}
    return out


def _p_value(result, baseline_score: float) -> float | None:
    """sacreBLEU's p-value; 1.0 for a system that scores exactly the baseline's score (sacreBLEU counts
    resampled differences strictly larger than the real one, so a zero difference would get the
    smallest p-value, as if significant). None for the baseline itself."""
    if result.p_value is None:
        return None
    return 1.0 if result.score == baseline_score else float(result.p_value)


def line_wins(base: Sequence[str], other: Sequence[str], refs: Sequence[str], lowercase: bool = False) -> dict:
    """Per-line comparison by sentence-level chrF: {"wins", "ties", "losses"} of `other` against `base`
    (ties: equal scores, e.g. identical lines)."""
    from sacrebleu.metrics import CHRF

    chrf = CHRF(lowercase=lowercase)
    wins = ties = losses = 0
    for a, b, r in zip(base, other, refs):
        sa, sb = chrf.sentence_score(a, [r]).score, chrf.sentence_score(b, [r]).score
        if math.isclose(sa, sb, abs_tol=1e-9):
            ties += 1
        elif sb > sa:
            wins += 1
        else:
            losses += 1
    return {"wins": wins, "ties": ties, "losses": losses, "by": "sentence chrF"}


def compare(systems: Sequence[tuple[str, Sequence[str]]], refs: Sequence[str], srcs: Sequence[str] | None = None,
            metrics: Sequence[str] = ("bleu", "chrf"), *, tokenize: str | None = None, lowercase: bool = False,
            bootstrap: int = BOOTSTRAP_SAMPLES, trials: int = AR_TRIALS) -> dict:
    """The whole comparison as a dict (module docstring): {"n_sentences", "systems": [{"name",
    metric: {...}, "lines" (wins/ties/losses; not for the baseline), "degeneration", "degeneration_delta"}],
    "signatures"}."""
    check_comparison(metrics, len(systems))
    n = len(refs)
    if n == 0:
        raise UserError("nothing to compare: the reference is empty")
    check_line_counts(("the reference", refs), *systems, ("the source", srcs))
    tests = paired_tests(systems, refs, metrics, tokenize=tokenize, lowercase=lowercase, bootstrap=bootstrap,
                         trials=trials)
    reports = [degeneration(hyps, refs, srcs, tokenize=tokenize) for _, hyps in systems]
    out_systems = []
    for i, (name, hyps) in enumerate(systems):
        entry: dict = {"name": name, **{m: tests[m][i] for m in metrics}, "degeneration": reports[i]}
        if i:
            entry["lines"] = line_wins(systems[0][1], hyps, refs, lowercase)
            entry["degeneration_delta"] = {c: reports[i][c]["count"] - reports[0][c]["count"]
                                           for c in CATEGORIES if reports[i].get(c) is not None}
        out_systems.append(entry)
    return {"n_sentences": n, "baseline": systems[0][0], "systems": out_systems,
            "signatures": tests["signatures"]}
