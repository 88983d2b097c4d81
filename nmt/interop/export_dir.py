"""The directories `nmt export` writes, as both writers (nmt/interop/ct2_export.py, nmt/interop/hf_export.py)
and their readers (nmt/translation/ct2.py, `nmt evaluate`) see them; no torch at import.

- `nmt_export.json` (`METADATA_FILE`, `read_metadata`) marks a directory nmt wrote and names the
  checkpoint by file name and step; `langid.json` (`read_langid`): its language identifier, if any.
- Before writing: `check_export_paths` (the output does not hold the checkpoint), `check_output_dir`
  (only an earlier export or an empty directory is replaced, with --force); the directory is written
  by `textio.atomic_dir`.
- CTranslate2's side: `require_ctranslate2` and `vocabularies` (the piece lists in id order).
"""

from __future__ import annotations

import os
from typing import Any

from nmt import textio
from nmt.errors import UserError

FORMAT = "nmt-ctranslate2"
VERSION = 1
METADATA_FILE = "nmt_export.json"
LANGID_FILE = "langid.json"  # the checkpoint's language identifier (nmt/text/langid.py), when it has one
INSTALL_HINT = 'pip install -e ".[ct2]" (or: pip install "ctranslate2>=4.4")'


def require_ctranslate2():
    """The `ctranslate2` module, or UserError saying how to install it."""
    try:
        import ctranslate2
    except ImportError:
        raise UserError(f"CTranslate2 is not installed: {INSTALL_HINT}") from None
    return ctranslate2


def vocabularies(tokenizer) -> tuple[list[str], list[str]]:
    """(source pieces, target pieces) in id order (`tokenizer.vocab_pieces()`: nmt's SentencePiece
    models, or an imported tokenizer's vocabularies). CTranslate2 appends EOS to sources by its piece,
    so EOS (and UNK) must be the same piece on both sides."""
    src, tgt = tokenizer.vocab_pieces()
    ids = tokenizer.specials
    if (src[ids.eos], src[ids.unk]) != (tgt[ids.eos], tgt[ids.unk]):
        raise UserError(f"cannot export to CTranslate2: source and target special pieces differ "
                        f"({src[ids.eos]}, {src[ids.unk]} vs {tgt[ids.eos]}, {tgt[ids.unk]})")
    return src, tgt


def read_metadata(model_dir: str) -> dict[str, Any]:
    """nmt's metadata of an exported directory; UserError if it is not one."""
    path = os.path.join(model_dir, METADATA_FILE)
    if os.path.isfile(model_dir):
        raise UserError(f"{model_dir} is a file, not a CTranslate2 model directory (a checkpoint file loads with "
                        "engine torch or auto)")
    if not os.path.isdir(model_dir):
        raise UserError(f"CTranslate2 model directory not found: {model_dir}")
    if not os.path.isfile(os.path.join(model_dir, "model.bin")):
        raise UserError(f"{model_dir} is not a CTranslate2 model directory (no model.bin)")
    if not os.path.isfile(path):
        raise UserError(f"{model_dir} was not written by `nmt export` (no {METADATA_FILE})")
    try:
        meta = textio.read_json(path)
    except OSError as e:
        raise UserError(f"cannot read {path}: {e}") from None
    if meta.get("format") != FORMAT or meta.get("version", 0) > VERSION:
        raise UserError(f"{path}: unsupported export format {meta.get('format')!r} version {meta.get('version')}")
    return meta


def read_langid(model_dir: str) -> dict | None:
    """The language identifier an export holds (`LANGID_FILE`, `LanguageIdentifier.to_dict()`), or None."""
    path = os.path.join(model_dir, LANGID_FILE)
    if not os.path.isfile(path):
        return None
    return textio.read_json(path)


def check_export_paths(checkpoint: str, output_dir: str) -> None:
    """UserError when the output directory, which an export replaces as a whole (`--force`), is or contains
    the checkpoint (`textio.check_paths`). A missing checkpoint is left to `load_checkpoint`'s message."""
    from nmt import textio

    if os.path.exists(checkpoint):
        textio.check_paths({"--checkpoint": checkpoint}, {"--output": output_dir}, input_dirs=("--checkpoint",),
                           output_dirs=("--output",))


def check_output_dir(output_dir: str, force: bool) -> None:
    """UserError unless an export may be written to `output_dir`: a new directory, or with `force` an
    earlier nmt export (it has METADATA_FILE) or an empty directory, never an arbitrary one."""
    if not os.path.exists(output_dir):
        return
    if not os.path.isdir(output_dir):
        raise UserError(f"output {output_dir} exists and is not a directory")
    if not force:
        raise UserError(f"output directory {output_dir} already exists (use --force to overwrite it)")
    if os.listdir(output_dir) and not os.path.isfile(os.path.join(output_dir, METADATA_FILE)):
        raise UserError(f"refusing to overwrite {output_dir}: it is not empty and not an nmt export "
                        f"(no {METADATA_FILE}); choose another --output")
