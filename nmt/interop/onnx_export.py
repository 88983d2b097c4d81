"""The ONNX writer of `nmt export --format onnx` (nmt/commands/export.py): an nmt model -> a directory that
optimum's `ORTModelForSeq2SeqLM` and transformers.js load as it is (`write_onnx`); docs/onnx.md is the guide.

    onnx/encoder_model.onnx, onnx/decoder_model_merged.onnx   the graphs (nmt/interop/onnx_graphs.py)
    onnx/*_quantized.onnx                                     with quantization int8 (transformers.js: dtype "q8")
    config.json, generation_config.json                       as `nmt export --format hf` writes them
    tokenizer.json, tokenizer_config.json                     nmt/interop/onnx_tokenizer.py (an imported MarianMT
                                                              or M2M100 model also keeps its own tokenizer files)
    nmt_export.json, README.md

The graphs are exported from transformers' own MarianMTModel (a post-norm model) or
M2M100ForConditionalGeneration (pre-norm; the imported family otherwise), built from the Hugging Face
export's config and weights (nmt/interop/hf_export.py `build_directory`): a model that format cannot
represent is refused with its one-line error, and the graphs compute what transformers computes, which
tests/test_hf*.py hold to nmt's own model. generation_config.json maps the decode section as that export
does (its notes say what has no counterpart); on top of them this export notes the decode settings that
are nmt's text pipeline or search and not a generation setting (protect, glossary, contrast, sampling).
`require_onnx` names the pip command when a package of the `onnx` extra is missing.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil

from nmt import textio
from nmt.errors import UserError
from nmt.interop.export_dir import METADATA_FILE, check_output_dir

FORMAT = "nmt-onnx"
QUANTIZATIONS = ("int8",)
INSTALL_HINT = 'pip install -e ".[onnx]"'
PACKAGES = {"onnx": "onnx", "onnxruntime": "onnxruntime", "onnxscript": "onnxscript", "transformers": "transformers"}
KEEP_TOKENIZER_FILES = {"marian": ("source.spm", "target.spm", "vocab.json"),
                        "m2m100": ("sentencepiece.bpe.model", "vocab.json", "special_tokens_map.json")}


def require_onnx() -> None:
    """UserError naming the missing packages of the `onnx` extra and how to install them."""
    import importlib.util

    missing = [pip for module, pip in PACKAGES.items() if importlib.util.find_spec(module) is None]
    if missing:
        raise UserError(f"exporting to ONNX needs {', '.join(missing)}: {INSTALL_HINT}")


def check_quantization(quantization: str | None) -> None:
    """UserError unless `quantization` is None (fp32) or one of QUANTIZATIONS."""
    if quantization not in (None, *QUANTIZATIONS):
        raise UserError(f"--quantization {quantization} is not an ONNX quantization (choose from "
                        f"{', '.join(QUANTIZATIONS)})")


def decode_notes(cfg) -> list[str]:
    """The checkpoint's settings that no generation_config.json key carries (and a grown unigram vocabulary's ties)."""
    d, notes = cfg.decode, []
    if d.protect or cfg.data.protect:
        notes.append("protect (placeholders for markup and variables) is nmt's text pipeline: tokenizer.json "
                     "encodes the text as it is")
    if d.sampling.method != "none":
        notes.append(f"decode.sampling.method {d.sampling.method} is not written (generation_config.json searches)")
    if (d.contrast.lang or "").strip():
        notes.append("decode.contrast.lang (language-contrastive decoding) has no counterpart")
    tok = cfg.data.tokenizer
    if tok.add_pieces and tok.model_type in ("unigram", "word", "char"):
        notes.append("a grown vocabulary (data.tokenizer.add_pieces): an added unigram piece scores exactly as the "
                     "pieces it replaces, a tie SentencePiece and tokenizer.json may break differently (new-language "
                     "text can get other pieces of equal score)")
    return notes


def build_files(model, tokenizer, cfg) -> tuple[dict[str, bytes], dict, list[str], object, int]:
    """({file name: bytes} but the graphs, the Hugging Face weights, notes, the tokenizer numbered as they are,
    the number of ids tokenizer.json gives)."""
    from nmt.interop.hf_export import build_directory, hf_numbering
    from nmt.interop.onnx_tokenizer import dumps, tokenizer_config, tokenizer_json

    hf_files, weights, notes = build_directory(model, tokenizer, cfg)
    tokenizer = hf_numbering(model.state_dict(), tokenizer)[1]  # (as build_directory numbers the weights)
    data, tok_notes, n_ids = tokenizer_json(tokenizer)
    config = tokenizer_config(tokenizer, cfg.model.max_positions)
    if tokenizer.kind != "spm":
        config = {**json.loads(hf_files["tokenizer_config.json"]), **config}
    files = {name: hf_files[name] for name in ("config.json", "generation_config.json",
                                               *KEEP_TOKENIZER_FILES.get(tokenizer.kind, ())) if name in hf_files}
    files.update({"tokenizer.json": data, "tokenizer_config.json": dumps(config)})
    return files, weights, notes + tok_notes + decode_notes(cfg), tokenizer, n_ids


@contextlib.contextmanager
def _quiet_transformers():
    """transformers' log and progress bars off while the export loads its model; restored after."""
    from transformers.utils import logging

    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()


def _transformers_model(files: dict[str, bytes], weights: dict, directory: str):
    """transformers' model of the Hugging Face directory (written to `directory`, then removed), eval, fp32."""
    from safetensors.torch import save_file
    from transformers import AutoModelForSeq2SeqLM

    os.makedirs(directory)
    save_file(weights, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(directory, "config.json"), "wb") as f:
        f.write(files["config.json"])
    with _quiet_transformers():
        model = AutoModelForSeq2SeqLM.from_pretrained(directory, attn_implementation="eager").eval()
    shutil.rmtree(directory)
    return model


def write_onnx(model, tokenizer, cfg, output_dir: str, *, quantization: str | None = None, force: bool = False,
               checkpoint: str = "", step: int | None = None) -> tuple[dict[str, str], list[str]]:
    """Write the ONNX directory of (model in eval mode, tokenizer, cfg) to `output_dir`, atomically
    (`textio.atomic_dir`; with `force` an earlier export or an empty directory is replaced, nothing else).
    Returns ({file name: path relative to output_dir} of the graphs, notes)."""
    require_onnx()
    check_quantization(quantization)
    check_output_dir(output_dir, force)
    with textio.atomic_dir(output_dir, what="export") as tmp:
        graphs, notes = write_into(tmp, model, tokenizer, cfg, quantization=quantization)
        meta = {"format": FORMAT, "checkpoint": os.path.basename(checkpoint), "step": step,
                "quantization": quantization or "float32", "graphs": graphs}
        textio.write_file(os.path.join(tmp, METADATA_FILE), json.dumps(meta, indent=1).encode())
    return graphs, notes


def write_into(directory: str, model, tokenizer, cfg, *, quantization: str | None) -> tuple[dict[str, str], list[str]]:
    """The ONNX directory's files (all but nmt_export.json) in an existing, empty `directory` (also the model
    folder of the web export); returns (graphs, notes) as `write_onnx`."""
    from nmt.interop.onnx_graphs import export_graphs, quantize_int8

    files, weights, notes, tokenizer, n_ids = build_files(model, tokenizer, cfg)
    hf_model = _transformers_model(files, weights, os.path.join(directory, ".hf"))
    del weights
    os.makedirs(os.path.join(directory, "onnx"))
    unk = tokenizer.specials.unk if n_ids > tokenizer.src_vocab_size else None  # ids past the vocabulary: <unk>
    paths = export_graphs(hf_model, os.path.join(directory, "onnx"), unk_past_vocab=unk)
    if quantization == "int8":
        paths.update({os.path.basename(q): q for q in map(quantize_int8, list(paths.values()))})
    for name, data in files.items():
        textio.write_file(os.path.join(directory, name), data)
    config = json.loads(files["config.json"])
    textio.write_file(os.path.join(directory, "README.md"), README.format(
        family=config["architectures"][0], tokenizer=json.loads(files["tokenizer_config.json"])["tokenizer_class"],
        quantization=quantization or "float32").encode())
    return {name: os.path.relpath(path, directory) for name, path in sorted(paths.items())}, notes


README = """# ONNX model exported by nmt

The layout of optimum's ONNX exports ({family}; weights {quantization}; tokenizer: tokenizer.json,
{tokenizer}). nmt's guide: docs/onnx.md in the nmt repository.

With optimum (`pip install optimum-onnx[onnxruntime]`, where it supports your transformers):

```python
from optimum.onnxruntime import ORTModelForSeq2SeqLM
from transformers import AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained("DIR")
model = ORTModelForSeq2SeqLM.from_pretrained("DIR")
print(tokenizer.batch_decode(model.generate(**tokenizer(["a sentence"], return_tensors="pt")),
                             skip_special_tokens=True))
```

With transformers.js (`dtype: "q8"` loads the `*_quantized.onnx` files):

```js
import {{ pipeline }} from "@huggingface/transformers";
const translate = await pipeline("translation", "DIR", {{ dtype: "fp32" }});
console.log(await translate("a sentence", {{ num_beams: 1 }}));
```

With onnxruntime alone: run onnx/encoder_model.onnx once, then onnx/decoder_model_merged.onnx per token
(`use_cache_branch` false and empty past tensors on the first step; then the presents of the step
before), as docs/onnx.md shows.
"""
