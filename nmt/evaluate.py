"""Corpus-level scoring with sacreBLEU (BLEU, chrF, TER), and `nmt evaluate`.

Scores are computed with sacreBLEU's Python API using its defaults, so they
are identical to the `sacrebleu` command on the same files (BLEU: tokenizer
13a, exponential smoothing; chrF: chrF2, character order 6; TER: tercom).
Files are read by nmt's one rule (nmt/textio.py: UTF-8, split on "\\n", surrounding
whitespace stripped, gzip detected by content); sacreBLEU's tokenizers ignore
surrounding whitespace, so the scores equal the `sacrebleu` command's on the same files.

`evaluate_command` either scores an existing hypothesis file (or standard
input) against a reference, or first translates a source file with a
checkpoint and then scores. Output: one human-readable line per metric,

    BLEU = 34.56 66.0/41.2/28.1/19.6 (BP = 1.000 ratio = 1.012 hyp_len = 2530 ref_len = 2500) [nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0]
    chrF2 = 58.12 [nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.6.0]

(the score, sacreBLEU's verbose details, the signature in brackets), then one line of
the degeneration report (nmt/degeneration.py); or with `json_out=True` one JSON object:
see `corpus_metrics` for its fields.
"""

from __future__ import annotations

import json
import sys
from typing import IO, Any, Iterable, Sequence

from nmt import textio
from nmt.degeneration import degeneration, format_report
from nmt.errors import UserError

METRICS = ("bleu", "chrf", "ter")
TOKENIZERS = ("13a", "intl", "zh", "ja-mecab", "ko-mecab", "char", "none")  # sacreBLEU's, without downloads


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


def _make_metric(name: str, *, lowercase: bool, tokenize: str | None):
    """A sacreBLEU metric object with sacreBLEU's defaults.

    `lowercase` applies to BLEU and chrF, `tokenize` to BLEU; TER keeps its
    default (case-insensitive), as the `sacrebleu` command does.
    """
    from sacrebleu.metrics import BLEU, CHRF, TER

    if name == "bleu":
        return BLEU(lowercase=lowercase, tokenize=tokenize)
    if name == "chrf":
        return CHRF(lowercase=lowercase)
    if name == "ter":
        return TER()
    raise UserError(f"unknown metric {name!r} (choose from {', '.join(METRICS)})")


def corpus_metrics(hyps: Sequence[str], refs: Sequence[str], metrics: Iterable[str] = ("bleu", "chrf"), *,
                   lowercase: bool = False, tokenize: str | None = None) -> dict:
    """Corpus scores of `hyps` against one reference per line.

    Returns `{metric: {...}}` in the order asked, for each metric
    (`"bleu"`, `"chrf"`, `"ter"`, case-insensitive):
      - `name`: sacreBLEU's name (`BLEU`, `chrF2`, `TER`),
      - `score`: the full-precision corpus score (0-100),
      - `signature`: `metric.get_signature()` as a string,
      - `verbose`: sacreBLEU's details (BLEU: n-gram precisions, BP, lengths; else ""),
      - `text`: the human-readable line printed by `nmt evaluate`.
    BLEU also gets `precisions`, `bp`, `ratio`, `hyp_len`, `ref_len`.
    `tokenize=None` is sacreBLEU's default (13a). Raises UserError when the
    line counts differ, when there is nothing to score, or for an unknown metric.
    """
    hyps, refs = list(hyps), list(refs)
    if len(hyps) != len(refs):
        raise UserError(f"{len(hyps)} hypotheses but {len(refs)} references: the line counts must match")
    if not hyps:
        raise UserError("nothing to score: no hypotheses and no references")
    names = [m.lower() for m in metrics]
    if not names:
        raise UserError(f"no metric given (choose from {', '.join(METRICS)})")
    out: dict = {}
    for name in names:
        metric = _make_metric(name, lowercase=lowercase, tokenize=tokenize)
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


# --------------------------------------------------------------------------- command

def _check_command(hyp, ref, checkpoint, src, save_hyps, names, tokenize, overrides, stdin) -> None:
    """Everything `evaluate_command` can check before any work (UserError)."""
    for name in names:
        if name not in METRICS:
            raise UserError(f"unknown metric {name!r} (choose from {', '.join(METRICS)})")
    check_tokenize(tokenize)
    if checkpoint is not None:
        if hyp is not None:
            raise UserError("give either a hypothesis file or --checkpoint with --src, not both")
        if src is None:
            raise UserError("--checkpoint needs --src: the source file to translate")
        if overrides.get("nbest") not in (None, 1, "1"):
            raise UserError("evaluate scores one translation per line: --nbest must be 1 (use nmt translate for n-best lists)")
        inputs = {"--ref": ref, "--src": src, "--checkpoint": checkpoint}
    else:
        inputs = {"--ref": ref, "--hyp": hyp, **({"--src": src} if src is not None else {})}
    textio.check_paths(inputs, {"--save-hyps": save_hyps} if save_hyps else {}, stdin=stdin,
                       input_dirs=("--checkpoint",))


def _translate(checkpoint: str, engine: str, device: str, overrides: dict, lines: list[str], quiet: bool,
               stderr: IO[str]) -> tuple[list[str], list[bool]]:
    """(hypotheses, finished flags) of `lines` translated by the model at `checkpoint`."""
    from tqdm import tqdm

    from nmt.api import Translator
    from nmt.translate import truncation_warning

    translator = Translator(checkpoint, engine=engine, device=device, **{**overrides, "nbest": 1})
    translator.check_language()
    with tqdm(total=len(lines), disable=quiet, unit="sent", file=stderr, dynamic_ncols=True) as bar:
        results = translator.translate(lines, on_batch=bar.update)
    n_truncated = sum(r.truncated for r in results)
    if n_truncated and not quiet:
        print(truncation_warning(n_truncated, translator.max_positions), file=stderr)
    return [r.text for r in results], [r.finished for r in results]


def _write_report(results: dict, report: dict, json_out: bool, header: dict, stdout: IO[str]) -> None:
    """sacreBLEU's lines and the degeneration line, or one JSON object (`evaluate_command`)."""
    if json_out:
        obj = dict(header)
        for name, entry in results.items():
            obj[name] = {k: v for k, v in entry.items() if k != "text"}
        obj["degeneration"] = report
        stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")
    else:
        for entry in results.values():
            stdout.write(entry["text"] + "\n")
        stdout.write(format_report(report) + "\n")
    stdout.flush()


def evaluate_command(hyp: str | None, ref: str, *, checkpoint: str | None = None, engine: str = "auto",
                     src: str | None = None, save_hyps: str | None = None,
                     metrics: Sequence[str] = ("bleu", "chrf"), tokenize: str | None = None, lowercase: bool = False,
                     json_out: bool = False, device: str = "auto", overrides: dict[str, Any] | None = None,
                     quiet: bool = False, stdin: IO[bytes] | None = None, stdout: IO[str] | None = None,
                     stderr: IO[str] | None = None) -> int:
    """`nmt evaluate`: score `hyp` (None or "-" = standard input) against `ref`, or translate
    `src` with `checkpoint` (a checkpoint file or a CTranslate2 export; `engine` auto, torch or
    ctranslate2; `overrides`: decode settings, default the model's) and score the result.
    `save_hyps` writes the hypotheses (atomically). `tokenize` / `lowercase`: sacreBLEU's options.
    Prints one line per metric, or one JSON object with `json_out`:
    `{"hyp": path, "ref": path, "n_sentences": N, "bleu": {...}, ...}` with the fields of
    `corpus_metrics` (less `text`) and `degeneration` (nmt/degeneration.py, with the flagged line
    numbers); when translating, also `src` and `checkpoint`, and `hyp` is `save_hyps` (or null).
    With `hyp`, `src` is optional: the report then also counts copied sources. Everything is
    checked before any work. Returns 0.
    """
    stdout = stdout if stdout is not None else sys.stdout
    stderr = stderr if stderr is not None else sys.stderr
    overrides = dict(overrides or {})
    names = [m.lower() for m in metrics]
    _check_command(hyp, ref, checkpoint, src, save_hyps, names, tokenize, overrides, stdin)
    refs = textio.read_lines(ref)
    lines = textio.read_lines(src) if src is not None else None
    if lines is not None and len(lines) != len(refs):
        raise UserError(f"line counts differ: {len(lines)} lines in {src} but {len(refs)} in {ref}")
    finished = None
    if checkpoint is not None:
        hyps, finished = _translate(checkpoint, engine, device, overrides, lines, quiet, stderr)
        hyp_name = f"{src} (translated by {checkpoint})"
    else:
        hyps, hyp_name = textio.read_lines(hyp, stdin=stdin), textio.display_name(hyp)
    if len(hyps) != len(refs):
        raise UserError(f"line counts differ: {len(hyps)} lines in {hyp_name} but {len(refs)} in {ref}")
    results = corpus_metrics(hyps, refs, names, tokenize=tokenize, lowercase=lowercase)
    report = degeneration(hyps, refs, lines, finished, tokenize=tokenize)
    if save_hyps:
        textio.write_lines(save_hyps, hyps)
    header = {"hyp": hyp_name if checkpoint is None else save_hyps, "ref": ref, "n_sentences": len(refs),
              **({"src": src, "checkpoint": checkpoint} if checkpoint is not None else {})}
    _write_report(results, report, json_out, header, stdout)
    return 0
