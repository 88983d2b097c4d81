"""`nmt tune`: choose a checkpoint's decode settings on a dev set within a time budget (nmt/translation/tune.py), print the
table explored, and write the chosen settings into a copy of the checkpoint (-o) or into it (--in-place)."""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass

from nmt import textio

from nmt.translation import tune as tuning
from nmt.config import decode_config
from nmt.errors import UserError
from nmt.text.glossary import check_targets, load_glossary
from nmt.translation.tune import MAX_LOOPS, MAX_TIME, apply_to_checkpoint, format_result


@dataclass(frozen=True)
class TuneOptions:
    """`nmt tune`'s flags."""

    checkpoint: str
    src: str  # dev sources
    ref: str  # dev references
    output: str | None = None  # write a tuned copy here
    in_place: bool = False  # write the settings into the checkpoint itself
    max_time: float = MAX_TIME  # seconds
    metric: str = "bleu"
    max_loops: float = MAX_LOOPS  # largest share of looping outputs allowed
    device: str = "auto"
    quiet: bool = False
    tgt_lang: str | None = None
    src_lang: str | None = None
    glossary: str | None = None  # also tune the glossary's search (nmt/translation/tune.py `tune_glossary`)
    glossary_ignore_case: bool = False
    glossary_constrain: str | None = None  # default: the checkpoint's decode.glossary.constrain


def tune_command(opts: TuneOptions) -> int:
    """`nmt tune` (module docstring). Returns 0; a UserError, with nothing written, when no setting keeps
    its looping outputs within `max_loops`."""
    from nmt.translation.torch_engine import TorchEngine

    checkpoint, src, ref, output, max_time, max_loops = (opts.checkpoint, opts.src, opts.ref, opts.output,
                                                         opts.max_time, opts.max_loops)
    glossary, glossary_constrain = opts.glossary, opts.glossary_constrain

    if output is not None and opts.in_place:
        raise UserError("give -o FILE or --in-place, not both")
    if not (math.isfinite(max_time) and max_time > 0):
        raise UserError(f"--max-time must be a number of seconds > 0, got {max_time:g}")
    if not 0 <= max_loops <= 1:
        raise UserError(f"--max-loops is a share of the lines, between 0 and 1; got {max_loops:g}")
    outputs = {"--output": output} if output is not None else {}
    if glossary is None and (opts.glossary_ignore_case or glossary_constrain is not None):
        raise UserError("--glossary-ignore-case and --glossary-constrain go with --glossary FILE")
    if os.path.isdir(checkpoint):
        raise UserError(f"--checkpoint {checkpoint} is a directory: nmt tune takes a checkpoint file (a CTranslate2 "
                        "export is tuned as the checkpoint it was exported from, then exported again)")
    inputs = {"--checkpoint": checkpoint, "--src": src, "--ref": ref, **({"--glossary": glossary} if glossary else {})}
    textio.check_paths(inputs, outputs)
    src_lines, ref_lines = textio.read_lines(src), textio.read_lines(ref)
    terms = load_glossary(glossary, opts.glossary_ignore_case)
    engine = TorchEngine.load(checkpoint, opts.device)
    if terms is not None:
        check_targets(terms, engine.tokenizer, engine.max_positions)  # every entry, before any work
    if glossary_constrain is not None:
        engine.decode = decode_config(engine.decode, {"glossary_constrain": glossary_constrain})
    log = (lambda m: None) if opts.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    result = tuning.tune(engine, src_lines, ref_lines, metric=opts.metric, max_time=max_time, max_loops=max_loops,
                         log=log, tgt_lang=opts.tgt_lang, src_lang=opts.src_lang, glossary=terms)
    if not result.within_limit:
        accept = math.ceil(round(result.row.loops * 1000, 6)) / 1000  # rounded up to 0.1%: it accepts that share
        raise UserError(f"{result.over_limit()}; nothing written (--max-loops {accept:g} would accept it)")
    print(format_result(result, opts.metric), flush=True)
    target = checkpoint if opts.in_place else output
    if target is not None:
        keys = {**result.keys(), **({"glossary_constrain": glossary_constrain} if glossary_constrain else {})}
        apply_to_checkpoint(checkpoint, target, result, opts.metric, src, keys)
        print(f"tune: wrote decode settings {keys} into {target}", file=sys.stderr, flush=True)
    return 0
