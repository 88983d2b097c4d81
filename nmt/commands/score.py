"""`nmt score`: one line `LOG_PROB<TAB>LOG_PROB_PER_TOKEN<TAB>TOKENS` per (source, target) pair, in order,
through `nmt.Translator.score` (what the numbers are: nmt/translation/score.py)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import IO, Any

from nmt import textio
from nmt.api import Translator
from nmt.errors import UserError


@dataclass(frozen=True)
class ScoreOptions:
    """`nmt score`'s flags."""

    checkpoint: str  # a checkpoint file or an `nmt export` directory (--checkpoint, --model)
    src: str
    tgt: str
    output: str | None = None  # None: standard output
    engine: str = "auto"
    device: str = "auto"
    overrides: dict[str, Any] = field(default_factory=dict)  # {decode key: value}: batching, languages, protect
    quiet: bool = False


def score_command(opts: ScoreOptions, *, stdout: IO[bytes] | None = None, stderr: IO[str] | None = None) -> int:
    """`nmt score`: one line per (src, tgt) pair (module docstring) to `output` (stdout when None)."""
    from tqdm import tqdm

    stderr = stderr if stderr is not None else sys.stderr
    path, src, tgt, output, quiet = opts.checkpoint, opts.src, opts.tgt, opts.output, opts.quiet
    textio.check_paths({"--src": src, "--tgt": tgt, "--checkpoint": path}, {"--output": output},
                       stdout=stdout, input_dirs=("--checkpoint",))
    (n_src, src_lines), (n_tgt, tgt_lines) = textio.counted_lines(src), textio.counted_lines(tgt)
    if n_src != n_tgt:
        raise UserError(f"line counts differ: {n_src} lines in {src} but {n_tgt} in {tgt}")
    overrides = dict(opts.overrides)
    translator = Translator(path, engine=opts.engine, device=opts.device, **overrides)
    translator.check_language()
    if overrides.get("protect") is None:  # a model trained with data.protect sees its spans as placeholders
        overrides["protect"] = translator.knows_placeholders
    n_truncated = 0
    with textio.open_output(output, stdout) as out, \
            tqdm(total=n_src, disable=quiet, unit="pair", file=stderr, dynamic_ncols=True) as bar:
        for src_chunk, tgt_chunk in zip(textio.iter_chunks(src_lines, 10_000), textio.iter_chunks(tgt_lines, 10_000)):
            scores = translator.score(textio.cr_as_space(src_chunk), textio.cr_as_space(tgt_chunk), on_batch=bar.update,
                                      protect=overrides["protect"])
            n_truncated += sum(s.truncated for s in scores)
            out.write("".join(s.format() + "\n" for s in scores).encode("utf-8"))
            out.flush()
    if n_truncated and not quiet:
        print(f"warning: {n_truncated} pair{'s' if n_truncated != 1 else ''} longer than {translator.max_positions - 1} "
              f"tokens on a side {'were' if n_truncated != 1 else 'was'} truncated", file=stderr, flush=True)
    return 0
