"""`nmt evaluate`: score a hypothesis file (or standard input) against a reference, or translate a source file
with a checkpoint or export first (through `nmt.Translator`) and score the result; `--compare`: two or more
hypothesis files against a baseline (nmt/evaluation/compare.py).

Output: one line per metric, as the `sacrebleu` command prints it (score, details, signature), then
the degeneration report (nmt/evaluation/degeneration.py); or one JSON object (`evaluate_command`).

The target language (`--tgt-lang`, else the model's) chooses BLEU's tokenizer unless `--tokenize`
does (`metrics.language_tokenize`) and, with a language identifier (a multilingual checkpoint's, or
`--langid CKPT`), lets the report count off-target outputs next to the references' own rate.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from typing import IO, Any, NamedTuple, Sequence

from nmt import textio
from nmt.api import Translator
from nmt.evaluation.compare import AR_TRIALS, BOOTSTRAP_SAMPLES, METRIC_NAMES, check_comparison, compare
from nmt.evaluation.degeneration import degeneration, format_report
from nmt.errors import UserError
from nmt.text.glossary import load_glossary
from nmt.interop.export_dir import read_langid, read_metadata
from nmt.text.languages import TargetLanguages, stored_target_languages
from nmt.evaluation.metrics import check_line_counts, check_metrics, check_tokenize, corpus_metrics, language_tokenize
from nmt.translation.translate import truncation_warning


class ModelInfo(NamedTuple):
    """What `nmt evaluate` reads from a model besides its weights."""

    languages: TargetLanguages  # what it translates into (nmt/text/languages.py); its `default` without --tgt-lang
    langid: dict | None  # its language identifier (`LanguageIdentifier.to_dict()`), if it has one


def model_info(path: str, engine: str = "auto") -> ModelInfo:
    """`ModelInfo` of a checkpoint file (its record, `checkpoint.load_record`: no tensor is read) or of a
    directory written by `nmt export` (its metadata; UserError if neither)."""
    if engine == "ctranslate2" or (engine == "auto" and os.path.isdir(path)):
        meta = read_metadata(path)
        return ModelInfo(stored_target_languages(meta, meta.get("config", {})), read_langid(path))
    from nmt.model.checkpoint import load_record

    record = load_record(path)
    return ModelInfo(record.languages, record.langid)


def _identifier(info: ModelInfo | None, lang: str | None, warn, given: str | None = None) -> Any:
    """The language identifier to count off-target outputs into `lang` with, or None (with a warning
    when there is one that cannot be used). given: the --langid the user named; what keeps its
    identifier from counting is then a UserError."""
    def cannot(why: str) -> None:
        if given is not None:
            raise UserError(f"--langid {given}: off-target outputs cannot be counted: {why}")
        warn(f"off-target outputs are not counted: {why}")

    if info is None or info.langid is None:
        if given is not None:
            cannot("it has no language identifier (multilingual models trained by nmt carry one)")
        return None
    from nmt.text.langid import LanguageIdentifier

    identifier = LanguageIdentifier.from_dict(info.langid)
    if lang is None:
        cannot("give the hypotheses' language with --tgt-lang")
    elif lang not in identifier.langs:
        cannot(f"the language identifier knows {', '.join(identifier.langs)}, not {lang}")
    else:
        return identifier
    return None


def _language(checkpoint: str | None, engine: str, langid: str | None, tgt_lang: str | None, tokenize: str | None,
              warn) -> tuple[str | None, str | None, Any]:
    """(target language, BLEU tokenizer, language identifier or None) of an evaluation: the language is
    `tgt_lang` (--tgt-lang), else the translating model's (or the --langid model's); the tokenizer
    `tokenize`, else `language_tokenize`'s choice; the identifier `langid`'s (UserError when it cannot
    count), else the checkpoint's (a warning when it cannot)."""
    info = model_info(checkpoint, engine) if checkpoint else None
    if langid:
        other = model_info(langid)
        info = ModelInfo(info.languages if info else other.languages, other.langid)
    lang = tgt_lang or (info.languages.default if info else None)
    if tokenize is None:
        tokenize, note = language_tokenize(lang)
        if note:
            warn(note)
    return lang, tokenize, _identifier(info, lang, warn, langid)


def _glossary(path: str | None, ignore_case: bool, src: str | None) -> Any:
    """The --glossary's compiled Glossary (None without one); it needs --src (UserError)."""
    if path is not None and src is None:
        raise UserError("--glossary needs --src: the source lines its terms are matched in")
    return load_glossary(path, ignore_case)


def term_report(hyps: Sequence[str], refs: Sequence[str], srcs: Sequence[str], glossary, names: Sequence[str], *,
                tokenize: str | None = None, lowercase: bool = False) -> dict:
    """How the hypotheses used the glossary (`nmt.text.glossary.term_use`: term_use, term_matches, terms_used,
    term_lines) and each metric's score on the lines with a term (`term_lines_<metric>`; None without one)."""
    from nmt.text.glossary import lines_with_terms, term_use

    report = term_use(hyps, srcs, glossary)
    rows = lines_with_terms(srcs, glossary)
    scores = corpus_metrics([hyps[i] for i in rows], [refs[i] for i in rows], names, tokenize=tokenize,
                            lowercase=lowercase) if rows else {}
    return {**report, **{f"term_lines_{name}": scores[name]["score"] if rows else None for name in names}}


def format_terms(report: dict, names: Sequence[str]) -> str:
    """The text line of a `term_report`."""
    if report["term_use"] is None:
        return "terms: no glossary entry matches a source line"
    scores = ", ".join(f"{n} {report[f'term_lines_{n}']:.2f}" for n in names)
    return (f"terms: {report['term_use']:.2f}% used ({report['terms_used']} of {report['term_matches']} matched "
            f"entries, {report['term_lines']} lines with a term; on those lines {scores})")


def _check_command(hyp, ref, checkpoint, src, save_hyps, names, tokenize, overrides, stdin, langid, glossary) -> None:
    """Everything `evaluate_command` can check before any work (UserError)."""
    check_metrics(names)
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
    if langid is not None:
        inputs["--langid"] = langid
    if glossary is not None:
        inputs["--glossary"] = glossary
    textio.check_paths(inputs, {"--save-hyps": save_hyps} if save_hyps else {}, stdin=stdin,
                       input_dirs=("--checkpoint", "--langid"))


def _translator(checkpoint: str, engine: str, device: str, overrides: dict):
    """The `nmt.Translator` of `checkpoint`, checked to have a target language to translate into."""
    translator = Translator(checkpoint, engine=engine, device=device, **{**overrides, "nbest": 1})
    translator.check_language()
    return translator


def _translate(translator, lines: list[str], quiet: bool, stderr: IO[str], glossary=None) -> tuple[list[str], list[bool]]:
    """(hypotheses, finished flags) of `lines` translated by `translator` (with the glossary's terms)."""
    from tqdm import tqdm

    with tqdm(total=len(lines), disable=quiet, unit="sent", file=stderr, dynamic_ncols=True) as bar:
        results = translator.translate(textio.cr_as_space(lines), on_batch=bar.update, glossary=glossary)
    n_truncated = sum(r.truncated for r in results)
    if n_truncated and not quiet:
        print(truncation_warning(n_truncated, translator.max_positions), file=stderr)
    return [r.text for r in results], [r.finished for r in results]


def _write_report(results: dict, report: dict, json_out: bool, header: dict, stdout: IO[str],
                  terms: dict | None = None) -> None:
    """sacreBLEU's lines, the degeneration line (and the terms line), or one JSON object (`evaluate_command`)."""
    if json_out:
        obj = dict(header)
        for name, entry in results.items():
            obj[name] = {k: v for k, v in entry.items() if k != "text"}
        obj["degeneration"] = report
        off = report.get("off_target")
        obj["off_target"] = {k: v for k, v in off.items() if k != "lines"} if off else None
        if terms is not None:
            obj["term_use"], obj["terms"] = terms["term_use"], terms
        stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")
    else:
        for entry in results.values():
            stdout.write(entry["text"] + "\n")
        stdout.write(format_report(report) + "\n")
        if terms is not None:
            stdout.write(format_terms(terms, list(results)) + "\n")
    stdout.flush()


@dataclass(frozen=True)
class EvaluateOptions:
    """`nmt evaluate`'s flags (`compare_command` reads ref, compare, src, metrics, tokenize, lowercase, json_out)."""

    hyp: str | None  # the hypotheses to score (None or "-": standard input), or None to translate src
    ref: str
    checkpoint: str | None = None  # translate src with this checkpoint or `nmt export` directory (--model)
    engine: str = "auto"
    src: str | None = None  # with hyp: only the degeneration report's copies use it
    save_hyps: str | None = None  # also write the translations here
    metrics: tuple[str, ...] = ("bleu", "chrf")
    tokenize: str | None = None  # sacreBLEU's BLEU tokenizer; None: from the target language
    lowercase: bool = False
    json_out: bool = False  # one JSON object instead of text
    device: str = "auto"
    overrides: dict[str, Any] = field(default_factory=dict)  # {decode key: value} over the model's decode section
    quiet: bool = False
    langid: str | None = None  # a checkpoint or export whose language identifier counts off-target outputs
    glossary: str | None = None  # report the use of its terms (needs src)
    glossary_ignore_case: bool = False
    compare: tuple[str, ...] | None = None  # hypothesis files to compare, the first the baseline


def evaluate_command(opts: EvaluateOptions, *, stdin: IO[bytes] | None = None, stdout: IO[str] | None = None,
                     stderr: IO[str] | None = None) -> int:
    """`nmt evaluate`: score `hyp` against `ref`, or translate `src` with `checkpoint` and score the result;
    print one line per metric, or with `json_out` one JSON object: `hyp`, `ref`, `n_sentences`, `tgt_lang`,
    each metric (`corpus_metrics` less `text`), `degeneration`, `off_target` (null when not measured); when
    translating also `src`, `checkpoint`, and `hyp` is `save_hyps`; with a glossary `term_use`, `terms`.
    The target language picks the BLEU tokenizer when `tokenize` is None. Everything is checked before
    any work. Returns 0."""
    stdout = stdout if stdout is not None else sys.stdout
    stderr = stderr if stderr is not None else sys.stderr
    hyp, ref, checkpoint, engine, src, save_hyps, tokenize, lowercase, langid, glossary = (
        opts.hyp, opts.ref, opts.checkpoint, opts.engine, opts.src, opts.save_hyps, opts.tokenize, opts.lowercase,
        opts.langid, opts.glossary)
    overrides = dict(opts.overrides)
    names = [m.lower() for m in opts.metrics]
    _check_command(hyp, ref, checkpoint, src, save_hyps, names, tokenize, overrides, stdin, langid, glossary)
    terms = _glossary(glossary, opts.glossary_ignore_case, src)
    translator = _translator(checkpoint, engine, opts.device, overrides) if checkpoint is not None else None
    if translator is not None and terms is not None:
        translator.check_glossary(glossary=terms)  # before any work
    lang, tokenize, identifier = _language(checkpoint, engine, langid, overrides.get("tgt_lang"), tokenize,
                                           lambda msg: print(f"nmt evaluate: warning: {msg}", file=stderr, flush=True))
    refs = textio.read_lines(ref)
    lines = textio.read_lines(src) if src is not None else None
    check_line_counts((ref, refs), (src, lines))
    finished = None
    if checkpoint is not None:
        hyps, finished = _translate(translator, lines, opts.quiet, stderr, terms)
        hyp_name = f"{src} (translated by {checkpoint})"
    else:
        hyps, hyp_name = textio.read_lines(hyp, stdin=stdin), textio.display_name(hyp)
    check_line_counts((ref, refs), (hyp_name, hyps))
    results = corpus_metrics(hyps, refs, names, tokenize=tokenize, lowercase=lowercase)
    report = degeneration(hyps, refs, lines, finished, tokenize=tokenize, identifier=identifier, lang=lang)
    if save_hyps:
        textio.write_lines(save_hyps, hyps)
    header = {"hyp": hyp_name if checkpoint is None else save_hyps, "ref": ref, "n_sentences": len(refs), "tgt_lang": lang,
              **({"src": src, "checkpoint": checkpoint} if checkpoint is not None else {}),
              **({"glossary": glossary} if terms is not None else {})}
    term_use = term_report(hyps, refs, lines, terms, names, tokenize=tokenize, lowercase=lowercase) \
        if terms is not None else None  # (an empty glossary too: a report of no term)
    _write_report(results, report, opts.json_out, header, stdout, term_use)
    return 0


# --------------------------------------------------------------------------- --compare

def format_comparison(result: dict, metrics: Sequence[str]) -> str:
    """The human-readable table: one line per system and metric, then wins/losses and degeneration."""
    lines = [f"{result['n_sentences']} lines; baseline {result['baseline']}; paired bootstrap "
             f"({BOOTSTRAP_SAMPLES} resamples) and approximate randomization ({AR_TRIALS} trials), sacreBLEU"]
    width = max(len(s["name"]) for s in result["systems"])
    for m in metrics:
        label = METRIC_NAMES[m]
        for i, s in enumerate(result["systems"]):
            r = s[m]
            delta = r["score"] - result["systems"][0][m]["score"]
            tail = "(baseline)" if i == 0 else (f"{delta:+.2f}  p(bootstrap) {r['p_bootstrap']:.4f}  "
                                              f"p(AR) {r['p_ar']:.4f}{'  *' if max(r['p_bootstrap'], r['p_ar']) < 0.05 else ''}")
            lines.append(f"{label:<6} {s['name']:<{width}}  {r['score']:6.2f}  "
                         f"(mean {r['mean']:.2f} +- {r['ci']:.2f})  {tail}")
    for s in result["systems"][1:]:
        w = s["lines"]
        delta = ", ".join(f"{c.replace('_', ' ')} {v:+d}" for c, v in s["degeneration_delta"].items())
        lines.append(f"lines  {s['name']:<{width}}  better {w['wins']}, same {w['ties']}, worse {w['losses']} "
                     f"(sentence chrF); degeneration vs baseline: {delta}")
    lines.append("* = p < 0.05 in both tests")
    return "\n".join(lines)


def compare_command(opts: EvaluateOptions, *, stdout: IO[str] | None = None) -> int:
    """`nmt evaluate --compare HYP...`: read the files, compare, print (text or one JSON object). Returns 0."""
    stdout = stdout if stdout is not None else sys.stdout
    hyps, ref, src, tokenize = opts.compare or (), opts.ref, opts.src, opts.tokenize
    names = [m.lower() for m in opts.metrics]
    check_comparison(names, len(hyps))
    check_tokenize(tokenize)
    textio.check_paths({"--ref": ref, **{f"--compare {i + 1}": h for i, h in enumerate(hyps)},
                        **({"--src": src} if src is not None else {})}, {})
    refs = textio.read_lines(ref)
    srcs = textio.read_lines(src) if src is not None else None
    systems = [(h, textio.read_lines(h)) for h in hyps]
    check_line_counts((ref, refs), *systems, (src, srcs))
    result = compare(systems, refs, srcs, names, tokenize=tokenize, lowercase=opts.lowercase)
    if opts.json_out:
        stdout.write(json.dumps({"ref": ref, **result}, ensure_ascii=False) + "\n")
    else:
        stdout.write(format_comparison(result, names) + "\n")
    stdout.flush()
    return 0
