"""Corpus-level scoring with sacreBLEU (BLEU, chrF, TER), and `nmt evaluate`.

Scores are computed with sacreBLEU's Python API using its defaults, so they
are identical to the `sacrebleu` command on the same files (BLEU: tokenizer
13a, exponential smoothing; chrF: chrF2, character order 6; TER: tercom).
Files are read the way the `sacrebleu` command reads them: UTF-8, split on
"\\n" only, trailing whitespace stripped from each line, `.gz` allowed.

`evaluate_command` either scores an existing hypothesis file (or standard
input) against a reference, or first translates a source file with a
checkpoint and then scores. Output: one human-readable line per metric,

    BLEU = 34.56 66.0/41.2/28.1/19.6 (BP = 1.000 ratio = 1.012 hyp_len = 2530 ref_len = 2500) [nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0]
    chrF2 = 58.12 [nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.6.0]

(the score, sacreBLEU's verbose details, the signature in brackets), or with
`json_out=True` one JSON object: see `score` for its fields.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
from typing import IO, Iterable, Sequence

from nmt.errors import UserError

METRICS = ("bleu", "chrf", "ter")


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


def score(hyps: Sequence[str], refs: Sequence[str], metrics: Iterable[str] = ("bleu", "chrf"), *,
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


# --------------------------------------------------------------------------- files

def read_lines(path: str) -> list[str]:
    """Lines of a text file as the `sacrebleu` command reads them (UTF-8, rstrip, .gz)."""
    if not os.path.isfile(path):
        raise UserError(f"file not found: {path}")
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8", newline="\n") as f:
            return [line.rstrip() for line in f]
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not valid UTF-8 ({e.reason} at byte {e.start} of a block)") from None
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror or e}") from None


def _read_stream(stream: IO[bytes], name: str) -> list[str]:
    """Lines of a binary stream (standard input), read like `read_lines`."""
    lines = []
    for i, raw in enumerate(stream, 1):
        try:
            lines.append(raw.decode("utf-8").rstrip())
        except UnicodeDecodeError:
            raise UserError(f"{name}: line {i} is not valid UTF-8") from None
    return lines


def _write_lines(path: str, lines: Sequence[str]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for line in lines:
            f.write(line + "\n")


def evaluate_command(hyp: str | None, ref: str, *, checkpoint: str | None = None, src: str | None = None,
                     save_hyps: str | None = None, metrics: Sequence[str] = ("bleu", "chrf"),
                     json_out: bool = False, device: str = "auto", beam: int | None = None,
                     batch_tokens: int | None = None, max_len_a: float | None = None,
                     max_len_b: int | None = None, min_len: int | None = None,
                     length_penalty: float | None = None, workers: int | None = None, quiet: bool = False,
                     stdin: IO[bytes] | None = None, stdout: IO[str] | None = None,
                     stderr: IO[str] | None = None) -> int:
    """`nmt evaluate`: score `hyp` (None or "-" = standard input) against `ref`,
    or translate `src` with `checkpoint` (beam, batch_tokens, max_len_a/b,
    min_len, length_penalty, workers: None = the checkpoint's `decode` settings),
    optionally save the hypotheses, and score.
    Prints one line per metric, or one JSON object with `json_out`:
    `{"hyp": path, "ref": path, "n_sentences": N, "bleu": {...}, ...}` with the
    fields of `score` (less `text`); when translating, also `src` and
    `checkpoint`, and `hyp` is `save_hyps` (or null). Returns the exit code (0).
    """
    stdout = stdout if stdout is not None else sys.stdout
    stderr = stderr if stderr is not None else sys.stderr
    names = [m.lower() for m in metrics]
    for name in names:
        if name not in METRICS:
            raise UserError(f"unknown metric {name!r} (choose from {', '.join(METRICS)})")
    refs = read_lines(ref)
    if checkpoint is not None:
        if hyp is not None:
            raise UserError("give either a hypothesis file or --checkpoint with --src, not both")
        if src is None:
            raise UserError("--checkpoint needs --src: the source file to translate")
        overrides = dict(beam=beam, batch_tokens=batch_tokens, max_len_a=max_len_a, max_len_b=max_len_b,
                         min_len=min_len, length_penalty=length_penalty, workers=workers)
        hyps, hyp_name = _translate_file(checkpoint, src, len(refs), ref, device=device, overrides=overrides,
                                         quiet=quiet, stderr=stderr)
        if save_hyps:
            _write_lines(save_hyps, hyps)
    else:
        if src is not None:
            raise UserError("--src needs --checkpoint (to translate it)")
        if hyp is None or hyp == "-":
            stream = stdin if stdin is not None else sys.stdin.buffer
            hyps, hyp_name = _read_stream(stream, "<stdin>"), "<stdin>"
        else:
            hyps, hyp_name = read_lines(hyp), hyp
        if save_hyps:
            _write_lines(save_hyps, hyps)
    if len(hyps) != len(refs):
        raise UserError(f"line counts differ: {len(hyps)} lines in {hyp_name} but {len(refs)} in {ref}")
    results = score(hyps, refs, names)
    if json_out:
        obj: dict = {"hyp": hyp_name if checkpoint is None else save_hyps, "ref": ref, "n_sentences": len(refs)}
        if checkpoint is not None:
            obj.update(src=src, checkpoint=checkpoint)
        for name, entry in results.items():
            obj[name] = {k: v for k, v in entry.items() if k != "text"}
        stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")
    else:
        for entry in results.values():
            stdout.write(entry["text"] + "\n")
    stdout.flush()
    return 0


def _translate_file(checkpoint: str, src: str, n_refs: int, ref: str, *, device: str, overrides: dict,
                    quiet: bool, stderr: IO[str]) -> tuple[list[str], str]:
    """Translate `src` with `checkpoint` (its line count is checked against the reference first)."""
    from nmt import translate  # torch is imported only when translating

    with translate.open_input(src) as stream:
        lines = translate.read_source(stream, src)
    if len(lines) != n_refs:
        raise UserError(f"line counts differ: {len(lines)} lines in {src} but {n_refs} in {ref}")
    model, tokenizer, cfg = translate.load_model(checkpoint, device)
    decode = translate.decode_settings(cfg.decode, nbest=1, **overrides)
    warn = (lambda msg: None) if quiet else (lambda msg: print(msg, file=stderr))
    hyps = translate.translate_lines(model, tokenizer, lines, decode, translate.model_device(model),
                                     progress=not quiet, warn=warn)
    return hyps, f"{src} (translated by {checkpoint})"
