"""Importing a Hugging Face MarianMT / M2M100 / NLLB model as an ordinary nmt checkpoint (`nmt import`:
nmt/commands/import_model.py).

    nmt import Helsinki-NLP/opus-mt-es-en -o opus-es-en.pt
    nmt import ./nllb-200-distilled-600M -o nllb.pt --src-lang spa_Latn --tgt-lang eng_Latn

SRC is a local model directory (what `save_pretrained` writes: config.json, model.safetensors or
pytorch_model.bin, the tokenizer files) or a hub id, downloaded with `huggingface_hub`. The
checkpoint holds the weights (nmt/interop/hf.py), the tokenizer adapter (nmt/text/hf_tokenizer.py), a config
whose `model` section is the architecture, whose `data` section names the languages, and whose
`decode` section follows the model's generation_config.json (`decode_from_generation`); it has no
training state, like an averaged checkpoint. translate, evaluate, score, average, export and
`train.init_from` take it like any other.
"""

from __future__ import annotations

import math
import os
import re
from typing import TYPE_CHECKING, Any, Callable

from nmt.errors import UserError
from nmt.text.languages import target_languages

if TYPE_CHECKING:
    from nmt.model.checkpoint import ModelRecord

WEIGHTS_FIRST = ["*.safetensors", "*.safetensors.index.json"]  # transformers' preference
WEIGHTS_LAST = ["pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model-*.bin"]
OTHER_FILES = ["config.json", "generation_config.json", "tokenizer_config.json", "special_tokens_map.json",
               "vocab.json", "target_vocab.json", "source.spm", "target.spm", "sentencepiece.bpe.model",
               "tokenizer.json"]
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


# --------------------------------------------------------------------------- the source

def model_directory(source: str) -> str:
    """A local directory as it is; else a hub id downloaded with huggingface_hub (the weights in
    one format: safetensors when the repository has them)."""
    if os.path.exists(source):
        if not os.path.isdir(source):
            raise UserError(f"{source} is not a directory (give a Hugging Face model directory or a hub id)")
        return source
    if source.startswith(("/", ".", "~")) or not HUB_ID.fullmatch(source):
        raise UserError(f"Hugging Face model directory not found: {source}")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise UserError(f"downloading {source} needs huggingface_hub (pip install huggingface_hub); a local model "
                        "directory works without it") from None
    try:
        path = snapshot_download(source, allow_patterns=OTHER_FILES + WEIGHTS_FIRST)
        if not any(name.endswith(".safetensors") for name in os.listdir(path)):
            path = snapshot_download(source, allow_patterns=OTHER_FILES + WEIGHTS_LAST)
    except Exception as e:  # offline, unknown repository, gated model, ...: huggingface_hub's many error types
        reason = (str(e).splitlines() or [type(e).__name__])[0]
        raise UserError(f"could not download {source} from the Hugging Face Hub ({type(e).__name__}: {reason}); "
                        "a local model directory works too (e.g. one written by save_pretrained)") from None
    return path


# --------------------------------------------------------------------------- decode settings

def generation_settings(model_dir: str, config: dict) -> dict:
    """generation_config.json, or (absent) the generation keys of config.json, as transformers'
    `GenerationConfig.from_model_config` takes them; checked by `checked_generation`."""
    from nmt.text.hf_tokenizer import read_json

    found = read_json(model_dir, "generation_config.json")
    if found:
        return checked_generation(found, "generation_config.json")
    return checked_generation({k: config[k] for k in GENERATION_KEYS if k in config}, "config.json")


def _is_int(value: Any, minimum: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


MAX_BEAMS = 128  # the largest num_beams `nmt import` takes (hub models use a few; 100000 would run for minutes a line)

GENERATION_TYPES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "num_beams": (f"an integer from 1 to {MAX_BEAMS}", lambda v: _is_int(v, 1) and v <= MAX_BEAMS),
    "length_penalty": ("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)),
    "max_length": ("an integer >= 2 (it counts the decoder start token)", lambda v: _is_int(v, 2)),
    "max_new_tokens": ("an integer >= 1", lambda v: _is_int(v, 1)),
    "min_length": ("an integer >= 0", _is_int),
    "no_repeat_ngram_size": ("an integer >= 0", _is_int),
    "forced_eos_token_id": ("a token id or a list of token ids",
                            lambda v: _is_int(v) or (isinstance(v, list) and bool(v) and all(_is_int(i) for i in v))),
    "forced_bos_token_id": ("a token id (an integer >= 0)", _is_int),
    "bad_words_ids": ("a list of lists of token ids", lambda v: isinstance(v, list) and all(
        isinstance(ids, list) and ids and all(_is_int(i) for i in ids) for ids in v)),
    "do_sample": ("true or false", lambda v: isinstance(v, bool)),
    "renormalize_logits": ("true or false", lambda v: isinstance(v, bool)),
    "early_stopping": ('true, false or "never"', lambda v: isinstance(v, bool) or v == "never"),
}
GENERATION_KEYS = tuple(GENERATION_TYPES)  # what nmt reads of a generation config (decode_from_generation)


def checked_generation(gen: dict, name: str) -> dict:
    """The generation keys nmt reads (GENERATION_KEYS), each checked against the type transformers
    gives it: a one-line UserError naming `name`, the key and the value otherwise. A null value is a
    key not set (transformers' reading: its default applies), and is dropped."""
    out = {}
    for key in GENERATION_KEYS:
        value = gen.get(key)
        if value is None:
            continue
        what, valid = GENERATION_TYPES[key]
        if not valid(value):
            raise UserError(f"{name}: {key} must be {what}, got {value!r} (fix the file, or remove the key for "
                            "transformers' default)")
        out[key] = value
    return out


def decode_from_generation(gen: dict, tokenizer) -> tuple[dict, list[str]]:
    """nmt `decode` keys for a model's generation settings (checked by `checked_generation`), and notes
    on what does not map.

    - num_beams -> beam_size (default 1).
    - length_penalty alpha -> `average` with that alpha (transformers divides by L ** alpha, L the
      generated tokens with the forced language token and EOS: nmt's length).
    - max_new_tokens N, or max_length N + 1 -> max_len_a 0, max_len_b N (N - 1 with MarianMT's
      forced_eos_token_id, so an output cut at the limit is the same); absent: nmt's defaults.
    - min_length m -> min_len m - 1; no_repeat_ngram_size -> no_repeat_ngram.
    - bad_words_ids: nmt never generates <pad> (nor a start token other than EOS); other entries noted.
    - early_stopping: false or absent -> stopping `hf`; true -> patience 1.0; "never" -> `exact`.
    Not mapped (noted): sampling, renormalize_logits."""
    decode: dict[str, Any] = {"beam_size": gen.get("num_beams", 1), "length_penalty_type": "average",
                              "length_penalty": float(gen.get("length_penalty", 1.0))}
    notes = []
    if decode["length_penalty"] < 0:
        notes.append(f"length_penalty {decode['length_penalty']} < 0 is not supported: using 0 (no penalty)")
        decode["length_penalty"] = 0.0
    limit = gen.get("max_new_tokens") or (gen["max_length"] - 1 if "max_length" in gen else None)
    if limit:
        forced_eos = gen.get("forced_eos_token_id") is not None
        decode.update(max_len_a=0.0, max_len_b=max(1, limit - (1 if forced_eos else 0)))
    if gen.get("min_length"):
        decode["min_len"] = max(0, gen["min_length"] - 1)
    if gen.get("no_repeat_ngram_size"):
        decode["no_repeat_ngram"] = gen["no_repeat_ngram_size"]
    never = set(tokenizer.specials.never_generated)
    other = [ids for ids in gen.get("bad_words_ids") or [] if not (len(ids) == 1 and ids[0] in never)]
    if other:
        notes.append(f"bad_words_ids {other} not applied (nmt forbids only {sorted(never)})")
    stop = gen.get("early_stopping", False)  # (whatever the beam size: a greedy model may be asked for a beam)
    if stop is True:
        decode["patience"] = 1.0
    elif stop is False:
        decode["stopping"] = "hf"
    if gen.get("do_sample"):
        notes.append("do_sample not applied: nmt translates with beam search by default (--sampling topk|topp samples)")
    if gen.get("renormalize_logits"):
        notes.append("renormalize_logits not applied: nmt does not renormalise after forbidding tokens")
    return decode, notes


def default_language(gen: dict, tokenizer) -> str | None:
    """The target language generation_config.json forces (forced_bos_token_id), if it is one."""
    forced = gen.get("forced_bos_token_id")
    return next((code for code, i in tokenizer.languages.items() if i == forced), None)


# --------------------------------------------------------------------------- import

def imported_config(arch, tokenizer, src_lang: str, tgt_lang: str, decode: dict, name: str):
    """The nmt Config of an imported model (validated as a checkpoint's config)."""
    from nmt.config import config_from_dict, to_dict

    model = to_dict(arch.model)
    data = {"src_lang": src_lang, "tgt_lang": tgt_lang, "max_len": min(256, model["max_positions"] - 2),
            "tokenizer": {"joint": tokenizer.joint}}
    return config_from_dict({"name": name, "data": data, "model": model, "decode": decode},
                            check_files=False, training=False)


def _languages(model_dir: str, tokenizer, src_lang: str | None, tgt_lang: str | None) -> tuple[str, str]:
    """(source, target) language codes for the data section. A MarianMT model is bilingual: it translates
    the pair its tokenizer_config.json names (source_lang / target_lang), and --src-lang / --tgt-lang only
    name that pair: a flag that contradicts the file, or is not a language code, is refused (one line)."""
    languages = target_languages(tokenizer)
    if languages.multilingual:
        return tokenizer.settings["src_lang"], languages.default
    from nmt.text.hf_tokenizer import read_json
    from nmt.schema import LANG_FORMAT

    tok_config = read_json(model_dir, "tokenizer_config.json")
    pair = []
    for flag, given, key in (("--src-lang", src_lang, "source_lang"), ("--tgt-lang", tgt_lang, "target_lang")):
        known = tok_config.get(key)
        if given is not None and not LANG_FORMAT.fullmatch(given):
            raise UserError(f"{flag} {given!r} is not a language code (letters, digits, '_' and '-', e.g. es, pt_BR)")
        if given is not None and known and given != str(known):
            where = (f"{tok_config.get('source_lang')} -> {tok_config.get('target_lang')}"
                     if tok_config.get("source_lang") and tok_config.get("target_lang") else f"{key} {known}")
            raise UserError(f"{flag} {given}: this MarianMT model translates {where} (tokenizer_config.json); a Marian "
                            f"model is bilingual, the flag only names its languages: leave it out, or give {known}")
        pair.append(given or known)
    src, tgt = pair
    if not src or not tgt:
        raise UserError(f"{model_dir}: tokenizer_config.json names no source_lang/target_lang: give --src-lang and "
                        "--tgt-lang (they name the languages in the checkpoint's config)")
    return str(src), str(tgt)


def import_model(source: str, *, src_lang: str | None = None, tgt_lang: str | None = None,
                 model_dir: str | None = None) -> tuple[ModelRecord, list[str]]:
    """(checkpoint record: `nmt.model.checkpoint.ModelRecord`, notes) for a Hugging Face model directory or hub
    id (model_dir: where `model_directory(source)` already put it)."""
    from nmt.interop.hf import architecture, import_weights, read_config
    from nmt.text.hf_tokenizer import read_tokenizer

    model_dir = model_dir or model_directory(source)
    config = read_config(model_dir)
    arch = architecture(config)  # settings nmt cannot represent fail before the weights are read
    multilingual = config["model_type"] == "m2m_100"
    tokenizer = read_tokenizer(model_dir, config, src_lang=src_lang, tgt_lang=tgt_lang if multilingual else None)
    gen = generation_settings(model_dir, config)
    if tokenizer.languages and tokenizer.default_tgt_lang is None:
        tokenizer.default_tgt_lang = default_language(gen, tokenizer)
        if tokenizer.default_tgt_lang is None:
            raise UserError(f"{source}: a multilingual model needs --tgt-lang (the default target language; "
                            f"e.g. {', '.join(list(tokenizer.languages)[:5])})")
    src, tgt = _languages(model_dir, tokenizer, src_lang, tgt_lang)
    decode, notes = decode_from_generation(gen, tokenizer)
    model, arch, _ = import_weights(model_dir)
    name = re.sub(r"[^\w.-]+", "-", source.strip("/").rsplit("/", 1)[-1]) or "imported"
    cfg = imported_config(arch, tokenizer, src, tgt, decode, name)
    from nmt.model.checkpoint import record

    # (the tokenizer's vocabulary sizes are the model's: hf_tokenizer reads them from the same config.json)
    state = record(model.state_dict(), tokenizer, cfg,
                   imported_from={"source": source, "family": arch.family, "tokenizer": tokenizer.kind})
    return state, notes
