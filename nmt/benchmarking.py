"""Measurements that scripts/ share (benchmarks and reports; no command or test depends on them).

- `forward_flops(src_len, tgt_len, d, f, V, Le, Ld)`: the matmul FLOPs of one forward pass of the
  Transformer over pairs of these lengths: the MFU formula of scripts/bench_train.py and scripts/bench_gpu.py.
- `eos_statistics(engine, src_lines, ref_lines, batch=)`: where a model puts EOS along the references,
  teacher-forced (scripts/length_report.py, scripts/length_sweep.py; the keys are described there).
- `run_script(name, body)`, `paired_lines(src, ref, lines)`, `first_lines`, `write_json(path, value)`: what the
  scripts share with the commands: one-line errors, line counts checked, outputs written atomically.
"""

from __future__ import annotations

import json
import sys
from typing import Callable



def run_script(name: str, body: Callable[[], int]) -> int:
    """A script's `main`: `body()`, with a UserError or ConfigError as one line on stderr (exit 2), an OSError as one
    line (exit 1) and Ctrl-C as "interrupted" (130), as the `nmt` commands do."""
    from nmt.errors import UserError
    from nmt.schema import ConfigError

    try:
        return body()
    except (UserError, ConfigError) as e:
        print(f"{name}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"{name}: error: {e.strerror or e}" + (f": {e.filename}" if e.filename else ""), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130


def paired_lines(src: str, ref: str, lines: int = 0) -> tuple[list[str], list[str]]:
    """The lines of `src` and `ref` (`first_lines`); UserError when their counts differ."""
    from nmt import textio
    from nmt.errors import UserError

    a, b = textio.read_lines(src), textio.read_lines(ref)
    if len(a) != len(b):
        raise UserError(f"line counts differ: {len(a)} lines in {src} but {len(b)} in {ref}")
    return first_lines(a, src, lines), first_lines(b, ref, lines)


def first_lines(texts: list[str], name: str, lines: int = 0) -> list[str]:
    """The first `lines` of the file `name`'s `texts` (0: all); UserError for a negative count or none left."""
    from nmt.errors import UserError

    if lines < 0:
        raise UserError(f"--lines must be at least 0 (0: every line), got {lines}")
    texts = texts[:lines] if lines else texts
    if not texts:
        raise UserError(f"{name} has no lines")
    return texts


def write_json(path: str | None, value) -> None:
    """`value` as indented JSON into `path` (atomically: nmt/textio.py), when a path is given."""
    if path:
        from nmt import textio

        textio.write_file(path, (json.dumps(value, indent=2) + "\n").encode("utf-8"))

def forward_flops(src_len, tgt_len, d: int, f: int, V: int, Le: int, Ld: int) -> float:
    """Matmul FLOPs of one forward pass over pairs with these real lengths (numpy arrays)."""
    s = src_len.astype("float64")
    t = tgt_len.astype("float64")
    return float((s * Le * (8 * d * d + 4 * d * f) + Le * 4 * s * s * d + s * Ld * 4 * d * d
                  + t * Ld * (12 * d * d + 4 * d * f) + Ld * (2 * t * t * d + 4 * t * s * d)
                  + t * 2 * d * V).sum())


def eos_statistics(engine, src_lines: list[str], ref_lines: list[str], batch: int = 64) -> dict:
    import torch
    import torch.nn.functional as F

    from nmt.layout import source_tensors, target_tensors

    model, tok = engine.model, engine.tokenizer
    PAD, START, EOS = tok.specials.pad, tok.specials.start, tok.specials.eos
    limit = engine.max_positions - 1
    pairs = [(x[:limit], y[:limit - 1]) for x, y in zip(tok.encode_src(src_lines), tok.encode_tgt(ref_lines))
             if x and y]
    early_mass = early_argmax = early_positions = sentences_early = final_logp = final_argmax = 0.0
    with torch.inference_mode():
        for i in range(0, len(pairs), batch):
            chunk = pairs[i:i + batch]
            src, mask = source_tensors([x for x, _ in chunk], tok.specials)
            tgt_in, _ = target_tensors([y for _, y in chunk], tok.specials)
            logp = F.log_softmax(model(src, mask, tgt_in).float(), dim=-1)  # [B,T,V]
            logp[:, :, PAD] = float("-inf")  # as the search sees them
            logp[:, :, START] = float("-inf")
            p_eos, best = logp[:, :, EOS].exp(), logp.argmax(dim=-1)  # [B,T]
            for b, (_, y) in enumerate(chunk):
                n = len(y)  # positions 0..n-1 predict y, position n predicts EOS
                early_mass += float(p_eos[b, :n].sum())
                argmax_early = int((best[b, :n] == EOS).sum())
                early_argmax += argmax_early
                early_positions += n
                sentences_early += argmax_early > 0
                final_logp += float(logp[b, n, EOS])
                final_argmax += int(best[b, n]) == EOS
    n = len(pairs)
    return {"sentences": n, "early_eos_mass": early_mass / early_positions, "early_eos_argmax": early_argmax / early_positions,
            "sentences_early_argmax": sentences_early / n, "final_eos_logp": final_logp / n,
            "final_eos_argmax": final_argmax / n}
