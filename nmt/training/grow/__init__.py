"""Adding languages to a pretrained model: `data.add_languages`, `data.tokenizer.add_pieces` (with `train.init_from`).

A fine-tuning run (nmt/training/finetune.py) lists the languages its source model does not know in
`data.add_languages` (new code -> the existing language whose token initialises the new one's, or null: the
mean of the language tokens). `grow_source` makes the source checkpoint larger before the run starts; ids the
model had never change, so old directions translate as before until training moves the weights. By job:
plan.py the languages (`check_languages`), pieces.py the new SentencePiece pieces, tokenizers.py nmt's and
the imported tokenizers grown with both and the rows of the new ids, here the weights (`grow_weights`).
"""

from __future__ import annotations

import itertools
from typing import Callable

import torch

from nmt.config import Config
from nmt.errors import UserError
from nmt.model.checkpoint import ModelRecord
from nmt.training.grow.pieces import KEEP, SAMPLE, new_texts, old_texts
from nmt.training.grow.plan import Plan, check_languages, known_languages
from nmt.training.grow.tokenizers import Rows, grow_imported, grow_spm

__all__ = ["Plan", "check_languages", "grow_source", "known_languages"]


def grow_source(cfg: Config, source: ModelRecord, log: Callable[[str], None] = print) -> ModelRecord:
    """The source checkpoint with the new languages' tokens and pieces (module docstring); `source`
    itself when nothing is added."""
    old = source.load_tokenizer(cfg.data.tokenizer.threads)
    plan = check_languages(cfg, old, source.load_config())
    if not plan.tokens and not cfg.data.tokenizer.add_pieces:
        return source
    new_codes = set(plan.init)
    notes: list[str] = []
    grow = grow_spm if old.kind == "spm" else grow_imported
    tokenizer, src, tgt = grow(old, cfg, plan, new_codes, log, notes)
    state = grow_weights(source.model, src, tgt)
    _log_growth(cfg, old, tokenizer, plan, new_codes, log, notes)
    return source.with_tokenizer(tokenizer, state)


def grow_weights(state: dict, src: Rows, tgt: Rows) -> dict:
    """The state dict with rows appended to the embeddings and the output projection (and its bias)."""
    out = dict(state)
    for name, rows in (("src_embed.weight", src), ("tgt_embed.weight", tgt), ("output_proj.weight", tgt),
                       ("output_proj.bias", tgt)):
        if name not in state or not rows.init:
            continue
        old = state[name]
        if old.shape[0] != rows.old_size:
            raise UserError(f"train.init_from: {name} has {old.shape[0]} rows, the tokenizer {rows.old_size} ids")
        new = [old[list(ids)].float().mean(0) if ids else old.float().mean(0) for ids in rows.init]
        out[name] = torch.cat([old, torch.stack(new).to(old.dtype)])
    return out


def _log_growth(cfg: Config, old, new, plan: Plan, codes: set[str], log: Callable[[str], None],
                notes: list[str]) -> None:
    """One line: what was added; one line: the pieces, and how new-language and held-out old-language
    text (training lines after the KEEP checked ones, when there are any) segment now."""
    tokens = ", ".join(f"{c} (id {new.languages[c]}, from {plan.init[c] or 'the mean of the language tokens'})"
                       for c in plan.tokens)
    grew = (new.src_vocab_size - old.src_vocab_size, new.tgt_vocab_size - old.tgt_vocab_size)
    log(f"add languages {', '.join(plan.init)}: language tokens {tokens or 'none'}; vocabulary {old.src_vocab_size}"
        f"/{old.tgt_vocab_size} -> {new.src_vocab_size}/{new.tgt_vocab_size} (+{grew[0]}/+{grew[1]} ids)")
    if not cfg.data.tokenizer.add_pieces:
        return
    parts = list(notes)
    for side, name, encode_old, encode_new in (("src", "source", old.encode_src, new.encode_src),
                                               ("tgt", "target", old.encode_tgt, new.encode_tgt)):
        held_out = old_texts(cfg, codes, side, KEEP, KEEP + SAMPLE)
        if held_out:
            changed = sum(a != b for a, b in zip(encode_old(held_out), encode_new(held_out)))
            parts.append(f"{changed / len(held_out):.1%} of {len(held_out)} held-out old-language {name} lines "
                         "segmented differently")
        fresh = list(itertools.islice(new_texts(cfg, codes, side)(), SAMPLE))
        if fresh:
            a, b = (sum(map(len, enc(fresh))) / len(fresh) for enc in (encode_old, encode_new))
            parts.append(f"new-language {name} lines {a:.1f} -> {b:.1f} tokens")
    log("add_pieces: " + "; ".join(parts))
