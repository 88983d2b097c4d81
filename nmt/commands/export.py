"""`nmt export`: a checkpoint -> a model directory for CTranslate2 (nmt/interop/ct2_export.py), Hugging Face
transformers (nmt/interop/hf_export.py), onnxruntime / optimum / transformers.js (nmt/interop/onnx_export.py), or
a web page that translates in the browser (nmt/interop/web_export.py).

The formats register here, in `FORMATS` (the CLI's --format choices): each entry loads the checkpoint, calls
its writer and prints what it wrote. The writers share the lower nmt/interop/export_dir.py (the metadata file,
the checks before writing) and `textio.atomic_dir`; the CTranslate2 and Hugging Face writers do not import each
other, the ONNX writer builds on the Hugging Face one, the web writer on the ONNX one.
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass
from typing import Callable

from nmt.errors import UserError
from nmt.interop.export_dir import check_export_paths, check_output_dir, require_ctranslate2


def _load(checkpoint: str):
    """(model in eval mode, tokenizer, config, the checkpoint's record)."""
    from nmt.model.checkpoint import build_model_from_checkpoint, load_record

    record = load_record(checkpoint)  # UserError if missing or not an nmt checkpoint; only the weights are read
    model, tokenizer, cfg = build_model_from_checkpoint(record, checkpoint)
    return model.eval(), tokenizer, cfg, record


def export_ctranslate2(checkpoint: str, output_dir: str, *, quantization: str | None, force: bool, quiet: bool) -> None:
    """A CTranslate2 model directory (nmt/interop/ct2_export.py)."""
    from nmt.interop.ct2_export import ct2_decode, write_export

    require_ctranslate2()
    check_output_dir(output_dir, force)
    model, tokenizer, cfg, record = _load(checkpoint)
    step, langid = record.step, record.langid
    del record
    write_export(model, tokenizer, cfg, output_dir, quantization=quantization, force=force,
                 checkpoint=checkpoint, step=step, langid=langid)
    if not quiet:
        note = ct2_decode(cfg.decode)[1]
        if note:
            print(f"nmt export: note: {note}", file=sys.stderr)
        size = os.path.getsize(os.path.join(output_dir, "model.bin"))
        print(f"exported {checkpoint} to {output_dir} (CTranslate2, {quantization or 'float32'}, "
              f"model.bin {size / 2**20:.1f} MiB)", flush=True)


def export_hf(checkpoint: str, output_dir: str, *, quantization: str | None, force: bool, quiet: bool) -> None:
    """A Hugging Face model directory (nmt/interop/hf_export.py)."""
    import json

    from nmt.interop.hf_export import require_safetensors, write_hf

    if quantization is not None:
        raise UserError("--quantization applies to the ctranslate2, onnx and web formats, not to hf")
    require_safetensors()
    check_output_dir(output_dir, force)
    model, tokenizer, cfg, record = _load(checkpoint)
    files, notes = write_hf(model, tokenizer, cfg, output_dir, force=force, checkpoint=checkpoint,
                            step=record.step)
    if not quiet:
        for note in notes:
            print(f"nmt export: note: {note}", file=sys.stderr)
        family = json.loads(files["config.json"])["model_type"]
        tok = json.loads(files["tokenizer_config.json"])["tokenizer_class"]
        print(f"exported {checkpoint} to {output_dir} (Hugging Face {family}, {tok})", file=sys.stderr)


def export_onnx(checkpoint: str, output_dir: str, *, quantization: str | None, force: bool, quiet: bool,
                web: bool = False) -> None:
    """An ONNX directory (nmt/interop/onnx_export.py), or with `web` a page around one (nmt/interop/web_export.py)."""
    from nmt.interop.onnx_export import check_quantization, require_onnx, write_onnx
    from nmt.interop.web_export import require_npm_packages, write_web

    require_onnx()
    check_quantization(quantization)
    check_output_dir(output_dir, force)
    packages = require_npm_packages() if web else None  # before the slow part: the one-line error comes first
    model, tokenizer, cfg, record = _load(checkpoint)
    write = functools.partial(write_web, packages=packages) if web else write_onnx
    graphs, notes = write(model, tokenizer, cfg, output_dir, quantization=quantization, force=force,
                          checkpoint=checkpoint, step=record.step)
    if not quiet:
        for note in notes:
            print(f"nmt export: note: {note}", file=sys.stderr)
        sizes = ", ".join(f"{name} {os.path.getsize(os.path.join(output_dir, path)) / 2**20:.1f} MiB"
                          for name, path in graphs.items())
        print(f"exported {checkpoint} to {output_dir} ({'web page' if web else 'ONNX'}: {sizes})", file=sys.stderr)


FORMATS: dict[str, Callable[..., None]] = {"ctranslate2": export_ctranslate2, "hf": export_hf, "onnx": export_onnx,
                                           "web": functools.partial(export_onnx, web=True)}


@dataclass(frozen=True)
class ExportOptions:
    """`nmt export`'s flags."""

    checkpoint: str
    output: str  # the directory to write
    format: str = "ctranslate2"  # a key of FORMATS
    quantization: str | None = None  # CTranslate2's (default float32)
    force: bool = False  # replace an earlier export
    quiet: bool = False


def export_command(opts: ExportOptions) -> int:
    """`nmt export`: write the `format` directory of the checkpoint. Returns 0."""
    check_export_paths(opts.checkpoint, opts.output)
    if opts.format not in FORMATS:
        raise UserError(f"unknown export format {opts.format!r} (supported: {', '.join(FORMATS)})")
    FORMATS[opts.format](opts.checkpoint, opts.output, quantization=opts.quantization, force=opts.force,
                         quiet=opts.quiet)
    return 0
