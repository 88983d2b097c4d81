"""`nmt translate`: input file or stdin -> output file or stdout, through `nmt.Translator`.

The input is read in chunks of `CHUNK_LINES` lines (one line at a time when stdin is a terminal), each
sorted, translated and written in order (the pipeline: nmt/translation/translate.py). Output: one line per input line;
with nbest > 1, `nbest` lines per input line, `INDEX ||| TEXT ||| SCORE` (INDEX the 0-based input line,
SCORE the hypothesis score after the length penalty, best first). A file output is written under a
temporary name and renamed when complete.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import IO, Any, Sequence

from nmt import textio

from nmt.text import protect
from nmt.api import Translator
from nmt.config import DecodeConfig
from nmt.errors import UserError
from nmt.text.glossary import load_glossary, term_use
from nmt.translation.translate import Translation, TranslationResult, truncation_warning

CHUNK_LINES = 10_000  # lines sorted and translated together by translate_command


def format_nbest(index: int, hyps: Sequence[Translation], alignment: bool = False) -> list[str]:
    """n-best lines `INDEX ||| TEXT ||| SCORE` (`||| ALIGNMENT` added with alignment) for input line
    `index` (0-based)."""
    return [f"{index} ||| {h.text} ||| {h.score:.4f}" + (f" ||| {h.format_alignment()}" if alignment else "")
            for h in hyps]


def format_results(results: Sequence[TranslationResult], decode: DecodeConfig, first_line: int) -> str:
    """The output lines of `nmt translate` for consecutive input lines, newline-terminated."""
    if decode.nbest > 1:
        return "".join(line + "\n" for k, r in enumerate(results)
                       for line in format_nbest(first_line + k, r.hypotheses, decode.alignment))
    if decode.alignment:
        return "".join(f"{r.text} ||| {r.hypotheses[0].format_alignment()}\n" for r in results)
    return "".join(r.text + "\n" for r in results)


def protect_report(n_lines: int, n_exact: int) -> str:
    return (f"protect: {n_exact} of {n_lines} line{'s' if n_lines != 1 else ''} with protected spans had every span "
            f"restored exactly once ({n_lines - n_exact} dropped or duplicated a span)")


def glossary_report(n_lines: int, report: dict, ignore_case: bool) -> str:
    """The line `nmt translate --glossary` ends with: how many entries matched on how many lines and
    how many of their target terms the outputs hold (`nmt.text.glossary.term_use`, summed over the chunks)."""
    if not report["term_matches"]:
        hint = "" if ignore_case else "; matching is case-sensitive: --glossary-ignore-case"
        return f"glossary: no entry matched any of the {n_lines} input line{'s' if n_lines != 1 else ''}{hint}"
    share = 100.0 * report["terms_used"] / report["term_matches"]
    return (f"glossary: {report['term_matches']} entr{'ies' if report['term_matches'] != 1 else 'y'} matched on "
            f"{report['term_lines']} of {n_lines} lines; the outputs hold {report['terms_used']} of their target terms "
            f"({share:.2f}%)")


class _TermCounts:
    """The glossary report's sums over the chunks: `nmt.text.glossary.term_use` of each chunk's outputs, the
    terms matched in the lines as translation matches them (protected spans masked)."""

    def __init__(self, terms, decode: DecodeConfig):
        self.terms, self.decode = terms, decode
        self.sums = dict.fromkeys(("term_matches", "terms_used", "term_lines"), 0)

    def add(self, chunk: list[str], results: Sequence[TranslationResult]) -> None:
        if self.terms is None:
            return
        d = self.decode
        lines = [protect.mask(x, d.protect_pattern)[0] for x in chunk] if d.protect else chunk
        report = term_use([r.text for r in results], lines, self.terms)
        self.sums = {k: v + report[k] for k, v in self.sums.items()}


def _prefix_chunks(prefix: str | None, input: str | None):
    """An iterator over the lines of the --prefix file (checked against the input's line count when
    that is a regular file: a pipe is read once, as it is translated), or None."""
    if prefix is None:
        return None
    if textio.is_stdin(prefix):
        raise UserError("--prefix must be a file (standard input is the text to translate)")
    n_prefixes, lines = textio.counted_lines(prefix)
    if textio.rereadable(input) and n_prefixes != (n_input := textio.count_lines(input)):
        raise UserError(f"line counts differ: {n_input} lines in {input} but {n_prefixes} prefixes in {prefix}")
    return lines


@dataclass(frozen=True)
class TranslateOptions:
    """`nmt translate`'s flags (nmt/cli.py builds it from the parsed command line)."""

    checkpoint: str  # a checkpoint file or an `nmt export` directory (--checkpoint, --model)
    input: str | None = None  # None or "-": standard input
    output: str | None = None  # None: standard output
    engine: str = "auto"
    device: str = "auto"
    overrides: dict[str, Any] = field(default_factory=dict)  # {decode key: value} over the model's decode section
    prefix: str | None = None  # a file of target prefixes, one per input line
    quiet: bool = False  # no progress bar, warnings or reports
    glossary: str | None = None  # a TSV glossary whose terms every output holds (nmt/text/glossary.py)
    glossary_ignore_case: bool = False
    chunk_lines: int = CHUNK_LINES


def translate_command(opts: TranslateOptions, *, stdin: IO[bytes] | None = None, stdout: IO[bytes] | None = None,
                      stderr: IO[str] | None = None) -> int:
    """`nmt translate`: input file or stdin -> output file or stdout. A progress bar (stderr) is shown
    when reading a file, unless quiet. Returns 0."""
    from tqdm import tqdm

    stderr = stderr if stderr is not None else sys.stderr
    path, input, output, prefix, quiet, glossary = (opts.checkpoint, opts.input, opts.output, opts.prefix, opts.quiet,
                                                    opts.glossary)
    inputs = {"--input": input, "--checkpoint": path, **({"--prefix": prefix} if prefix is not None else {}),
              **({"--glossary": glossary} if glossary is not None else {})}
    textio.check_paths(inputs, {"--output": output}, stdin=stdin, stdout=stdout, input_dirs=("--checkpoint",))
    from_file = not textio.is_stdin(input)
    terms = load_glossary(glossary, opts.glossary_ignore_case)
    prefix_lines = _prefix_chunks(prefix, input)
    translator = Translator(path, engine=opts.engine, device=opts.device, **opts.overrides)
    translator.check_language()  # before any output
    if terms is not None:
        translator.check_glossary(glossary=terms)  # before any output
    decode = translator.decode
    total = textio.count_lines(input) if textio.rereadable(input) and not quiet else None  # (a pipe: no total)
    interactive = not from_file and getattr(stdin if stdin is not None else sys.stdin, "isatty", lambda: False)()
    chunk_lines = 1 if interactive else opts.chunk_lines  # interactive: answer each line as it is typed
    n_truncated = n_prefix_cut = index = protected = exact = 0
    term_counts = _TermCounts(terms, decode)
    with textio.open_output(output, stdout) as out, \
            tqdm(total=total, disable=quiet or not from_file, unit="sent", file=stderr, dynamic_ncols=True) as bar:
        for chunk in textio.iter_chunks(textio.iter_lines(input, stdin), chunk_lines):
            chunk = textio.cr_as_space(chunk)
            prefixes = None
            if prefix_lines is not None:
                prefixes = textio.cr_as_space([line for _, line in zip(chunk, prefix_lines)])
                if len(prefixes) < len(chunk):
                    raise UserError(f"{prefix} has fewer lines ({index + len(prefixes)}) than the input")
            results = translator.translate(chunk, prefixes=prefixes, first_line=index, on_batch=bar.update,
                                           glossary=terms)
            n_truncated += sum(r.truncated for r in results)
            n_prefix_cut += sum(r.prefix_truncated for r in results)
            protected += sum(r.protected is not None for r in results)
            exact += sum(bool(r.protected) for r in results)
            term_counts.add(chunk, results)
            out.write(format_results(results, decode, index).encode("utf-8"))
            out.flush()
            index += len(chunk)
        if prefix_lines is not None and next(prefix_lines, None) is not None:
            raise UserError(f"{prefix} has more lines than the input ({index})")
    if n_truncated and not quiet:
        print(truncation_warning(n_truncated, translator.max_positions), file=stderr, flush=True)
    if n_prefix_cut and not quiet:
        print(truncation_warning(n_prefix_cut, translator.max_positions, "prefix", 2), file=stderr, flush=True)
    if decode.protect and not quiet:
        print(protect_report(protected, exact), file=stderr, flush=True)
    if terms is not None and not quiet:
        print(glossary_report(index, term_counts.sums, terms.ignore_case), file=stderr, flush=True)
    return 0
