"""`nmt import`: write the checkpoint of a Hugging Face MarianMT / M2M100 / NLLB model (`hf_io.import_model`),
with `--config` a fine-tuning config for it, and print a summary.

    nmt import Helsinki-NLP/opus-mt-es-en -o opus-es-en.pt
    nmt import ./nllb-200-distilled-600M -o nllb.pt --src-lang spa_Latn --tgt-lang eng_Latn --config finetune.yaml
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nmt import textio
from nmt.interop.hf_io import import_model, model_directory

if TYPE_CHECKING:
    from nmt.model.checkpoint import ModelRecord


FINETUNE_HEADER = """\
# Fine-tuning config for {output}, written by `nmt import {source}`.
# Fill in data.train and data.valid (your corpus), then: nmt train --config {config}
# The model section is the imported architecture (only dropout rates may change); data.tokenizer is left
# out: the imported tokenizer is used as it is. The train settings are starting points for fine-tuning
# a pretrained model (small learning rate, short warmup), not tuned values.
"""


def finetune_config(state: ModelRecord, checkpoint: str) -> dict:
    """A fine-tuning config (as a dict) for an imported checkpoint: its model, decode and languages,
    train.init_from = the checkpoint; data.train / data.valid are placeholders to fill in."""
    c = state.config
    data = {"src_lang": c["data"]["src_lang"], "tgt_lang": c["data"]["tgt_lang"],
            "train": {"src": "TRAIN_SOURCE_FILE", "tgt": "TRAIN_TARGET_FILE"},
            "valid": {"src": "VALID_SOURCE_FILE", "tgt": "VALID_TARGET_FILE"},
            "max_len": c["data"]["max_len"], "batch_tokens": 4096}
    if not c["data"]["tokenizer"]["joint"]:
        data["tokenizer"] = {"joint": False}
    train = {"init_from": os.path.abspath(checkpoint), "lr": 5e-5, "schedule": "constant", "warmup_steps": 200,
             "max_steps": 5000, "valid_every": 500, "keep_best": 3}
    return {"name": f"{c['name']}-finetuned", "data": data, "model": c["model"], "train": train, "decode": c["decode"]}


def _stop_summary(d: dict) -> str:
    """How the imported decode section stops beam search, for the summary line."""
    if d["beam_size"] == 1:
        return ""
    if d["patience"]:
        return f" (patience {d['patience']:g})"
    return " (stopping hf)" if d["stopping"] == "hf" else " (exact stop)"


@dataclass(frozen=True)
class ImportOptions:
    """`nmt import`'s arguments."""

    source: str  # a model directory or hub id
    output: str  # the checkpoint to write
    src_lang: str | None = None
    tgt_lang: str | None = None
    config: str | None = None  # also write a fine-tuning config here (a new file)
    quiet: bool = False


def import_command(opts: ImportOptions, *, stderr=None) -> int:
    """`nmt import`: write the checkpoint of a Hugging Face model to `output` (and, with `config`, a
    fine-tuning config for it). Returns 0."""
    import yaml

    from nmt.model.checkpoint import save_checkpoint

    stderr = stderr or sys.stderr
    source, output, config = opts.source, opts.output, opts.config
    outputs = {"--output": output, **({"--config": config} if config else {})}
    textio.check_paths({}, outputs, new_files=("--config",))  # before a download
    model_dir = model_directory(source)
    files = {f"SRC/{name}": os.path.join(model_dir, name) for name in sorted(os.listdir(model_dir))
             if os.path.isfile(os.path.join(model_dir, name))}
    textio.check_paths(files, outputs, new_files=("--config",))  # no output replaces a file of the model
    state, notes = import_model(source, src_lang=opts.src_lang, tgt_lang=opts.tgt_lang, model_dir=model_dir)
    save_checkpoint(state, output)
    if config:
        text = yaml.safe_dump(finetune_config(state, output), sort_keys=False, allow_unicode=True)
        textio.write_lines(config, (FINETUNE_HEADER.format(output=output, source=source, config=config) + text)
                           .rstrip("\n").split("\n"))
    if not opts.quiet:
        for note in notes:
            print(f"nmt import: note: generation_config: {note}", file=stderr)
        c, info, targets = state.config, state.imported_from, state.languages
        langs = f"{c['data']['src_lang']} -> {c['data']['tgt_lang']}"
        if targets.multilingual:
            langs += f" (default; {len(targets.tokens)} target languages: --tgt-lang)"
        d = c["decode"]
        n_params = sum(t.numel() for t in {t.data_ptr(): t for t in state.model.values()}.values())
        print(f"imported {source} ({info['family']}, {info['tokenizer']} tokenizer, {n_params:,} parameters, "
              f"vocab {state.vocab['src']}/{state.vocab['tgt']}, {langs}) into {output}; decode: beam "
              f"{d['beam_size']}{_stop_summary(d)}, length penalty {d['length_penalty_type']} {d['length_penalty']:g}, "
              f"max length {d['max_len_a']:g} * source + {d['max_len_b']}", file=stderr)
    return 0
