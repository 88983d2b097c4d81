"""Configuration: YAML (and --set overrides) -> the dataclasses of nmt/schema.py, checked at load.

    cfg = load_config("configs/quickstart.yaml", ["train.lr=5e-4"])   # Config, or ConfigError
    decode = decode_config(cfg.decode, {"beam_size": "4"})             # decode settings from flags or options

All errors in a file are collected and reported together, each naming its full key
(`train.warmup_steps`), as one line per error; the CLI prints them and exits with code 2.
YAML aliases are refused; numbers must be finite. The schema's names (Config, DataConfig,
DecodeConfig, ...) are re-exported here. This module must stay importable without torch
(fast `nmt --help`).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import types
import typing
from typing import Any, Literal, Optional

import yaml

from nmt.schema import (DECODE_FLAT, DECODE_REMOVED, LANG_FORMAT, PLACEHOLDERS, REQUIRED, RESERVED_TAGS, TAG_FORMAT,
                        TERM_SYMBOLS, Config, ConfigError, ContrastConfig, CorpusConfig, DataConfig, DecodeConfig,
                        GlossaryConfig, ModelConfig, SamplingConfig, TokenizerConfig, TrainConfig, decode_options,
                        decode_value, iter_fields, max_finished)

__all__ = ["Config", "ConfigError", "ContrastConfig", "CorpusConfig", "DataConfig", "DecodeConfig", "GlossaryConfig",
           "ModelConfig", "REQUIRED", "SamplingConfig", "decode_options", "decode_value",
           "TokenizerConfig", "TrainConfig", "apply_overrides", "config_from_dict", "decode_config", "dump_config",
           "init_from_problem", "iter_fields", "load_config", "parse_override", "replace", "save_config", "to_dict"]


# --------------------------------------------------------------------------- loading

def _convert(value: Any, tp: Any, key: str, errors: list[str]) -> Any:
    """Check `value` against the annotation `tp`; return it converted or record errors."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        lists = [a for a in inner if typing.get_origin(a) is list]
        others = [a for a in inner if typing.get_origin(a) is not list]
        arm = (lists or others) if isinstance(value, list) else (others or lists)  # a list takes the list arm
        return _convert(value, arm[0], key, errors)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            errors.append(f"'{key}' must be a mapping, got {value!r}")
            return None
        return _build(tp, value, key, errors)
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            errors.append(f"invalid value for '{key}': {value!r} (choose from {', '.join(map(str, choices))})")
            return None
        return value
    if origin in (tuple, list):
        return _convert_sequence(value, tp, key, errors)
    if origin is dict:
        return _convert_mapping(value, tp, key, errors)
    if tp in _SCALARS:
        return _SCALARS[tp](value, key, errors)
    raise TypeError(f"unsupported config type {tp!r} for {key}")  # programming error


def _convert_sequence(value: Any, tp: Any, key: str, errors: list[str]) -> Any:
    """A fixed-length tuple or a list (a single string is a list of one)."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            errors.append(f"invalid value for '{key}': {value!r} (expected a list of {len(args)} numbers)")
            return None
        return tuple(_convert(v, a, f"{key}[{i}]", errors) for i, (v, a) in enumerate(zip(value, args)))
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        errors.append(f"invalid value for '{key}': {value!r} (expected a list)")
        return None
    return [_convert(v, args[0], f"{key}[{i}]", errors) for i, v in enumerate(value)]


def _convert_mapping(value: Any, tp: Any, key: str, errors: list[str]) -> Any:
    """A mapping of string keys (null or absent: empty), each value checked against the value type."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        errors.append(f"invalid value for '{key}': {value!r} (expected a mapping, e.g. {{it: es}})")
        return None
    _, inner = typing.get_args(tp)
    return {str(k): _convert(v, inner, f"{key}.{k}", errors) for k, v in value.items()}


def _to_bool(value: Any, key: str, errors: list[str]) -> Any:
    if not isinstance(value, bool):
        errors.append(f"invalid value for '{key}': {value!r} (expected true or false)")
        return None
    return value


def _to_int(value: Any, key: str, errors: list[str]) -> Any:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        errors.append(f"invalid value for '{key}': {value!r} (expected an integer)")
        return None
    return value


def _to_float(value: Any, key: str, errors: list[str]) -> Any:
    if isinstance(value, str):  # YAML reads 5e-4 (no dot) as a string
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        errors.append(f"invalid value for '{key}': {value!r} (expected a number)")
        return None
    if not math.isfinite(value):
        errors.append(f"invalid value for '{key}': {value!r} (must be a finite number)")
        return None
    return float(value)


def _to_str(value: Any, key: str, errors: list[str]) -> Any:
    if not isinstance(value, str):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        errors.append(f"invalid value for '{key}': {value!r} (expected a string)")
        return None
    return value


_SCALARS = {bool: _to_bool, int: _to_int, float: _to_float, str: _to_str}


def _check_range(value: Any, f: dataclasses.Field, key: str, errors: list[str]) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return
    lo, hi = f.metadata.get("min"), f.metadata.get("max")
    if lo is not None and (value < lo or (f.metadata.get("exclusive_min") and value == lo)):
        op = ">" if f.metadata.get("exclusive_min") else ">="
        errors.append(f"invalid value for '{key}': {value!r} (must be {op} {lo:g})")
    if hi is not None and (value > hi or (f.metadata.get("exclusive_max") and value == hi)):
        op = "<" if f.metadata.get("exclusive_max") else "<="
        errors.append(f"invalid value for '{key}': {value!r} (must be {op} {hi:g})")


def _decode_sections(raw: dict, prefix: str, errors: list[str]) -> dict:
    """A raw decode mapping with the keys given by their flat names (`DECODE_FLAT`: flags, options,
    configs and checkpoints written before the sections) moved into their sections (a flat name wins over
    the same key in its section), and the removed keys dropped where they hold their old default."""
    out: dict = {}
    for key, value in raw.items():
        if key in DECODE_REMOVED:
            if value not in (None, DECODE_REMOVED[key]):
                errors.append(f"'{prefix}.{key}' was removed (docs/glossaries.md): leave it out")
            continue
        if key in DECODE_FLAT and not (key == "sampling" and isinstance(value, dict)):
            section, name = DECODE_FLAT[key]
            given = out.get(section)
            out[section] = {**(given if isinstance(given, dict) else {}), name: value}
        elif isinstance(value, dict) and isinstance(out.get(key), dict):  # a section after some of its flat keys
            out[key] = {**value, **out[key]}
        else:
            out[key] = value
    return out


def _build(cls: type, raw: dict, prefix: str, errors: list[str]) -> Any:
    if cls is DecodeConfig:
        raw = _decode_sections(raw, prefix, errors)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        full = f"{prefix}.{key}" if prefix else str(key)
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.5)
            where = f"section '{prefix}'" if prefix else "the top level"
            hint = f" - did you mean '{prefix + '.' if prefix else ''}{close[0]}'?" if close else f" (valid keys in {where}: {', '.join(fields)})"
            errors.append(f"unknown key '{full}'{hint}")
            continue
        n_before = len(errors)
        converted = _convert(value, hints[key], full, errors)
        if len(errors) == n_before:
            _check_range(converted, fields[key], full, errors)
        kwargs[key] = converted
    for name, f in fields.items():
        if name not in raw and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            errors.append(f"missing required key '{prefix + '.' if prefix else ''}{name}'")
            kwargs[name] = None
    try:
        return cls(**kwargs)
    except TypeError as e:  # only reachable after errors were recorded
        errors.append(str(e))
        return None


def _check_decode(dec: DecodeConfig, prefix: str, errors: list[str], pattern_needs_protect: bool = False) -> None:
    """Rules between decode keys (each key's own type and range are checked by `_build`).
    pattern_needs_protect: a protect_pattern without protect is an error (in a config file, or
    given as a flag: not in a checkpoint's decode section, which a flag may turn protect off in)."""
    if dec.nbest > dec.beam_size and dec.sampling.method == "none":
        errors.append(f"invalid value for '{prefix}.nbest': {dec.nbest} (must be <= {prefix}.beam_size={dec.beam_size}, "
                      "or set sampling: nbest samples per line)")
    if dec.patience > 0 and dec.beam_size > 1 and dec.sampling.method == "none":
        most = max_finished(dec.beam_size, dec.patience)
        if most < 1:
            errors.append(f"invalid value for '{prefix}.patience': {dec.patience:g} (beam_size * patience rounds to 0 "
                          f"finished hypotheses: use at least {0.5 / dec.beam_size:g}, or 0 for the exact stop)")
        elif dec.nbest > most:
            errors.append(f"invalid value for '{prefix}.nbest': {dec.nbest} (with patience {dec.patience:g} the search "
                          f"stops after round(beam_size * patience) = {most} finished hypotheses: nbest must be <= {most})")
    if dec.protect_pattern is not None:
        import re

        try:  # (compiled as nmt/text/protect.py joins it: a global flag such as (?i) must be scoped, (?i:...))
            compiled = re.compile(f"(?:{dec.protect_pattern})")
            if any(m.start() == m.end() for m in compiled.finditer(PROTECT_PROBE)):
                errors.append(f"invalid value for '{prefix}.protect_pattern': {dec.protect_pattern!r} (it matches the "
                              "empty string)")
            elif pattern_needs_protect and not dec.protect:
                errors.append(f"'{prefix}.protect_pattern' (--protect-pattern) is set but '{prefix}.protect' (--protect) "
                              "is false: the pattern adds spans to protect, so alone it does nothing")
        except re.error as e:
            hint = ": write a flag as a group, e.g. (?i:word)" if "global flags" in str(e) else ""
            errors.append(f"invalid value for '{prefix}.protect_pattern': {dec.protect_pattern!r} (not a regular "
                          f"expression: {e}{hint})")


PROTECT_PROBE = "Ab 12, %s {0} <b>x</b>. — ¿Sí?\tÉ_z"  # a protect_pattern may match no empty span in it


def _check_semantics(cfg: Config, errors: list[str], check_files: bool, training: bool = True,
                     resume: bool = False) -> None:
    d, m, t, dec = cfg.data, cfg.model, cfg.train, cfg.decode
    name = os.path.normpath(cfg.name) if cfg.name else ""
    if training and (os.path.isabs(cfg.name) or name in ("", ".", "..") or name.startswith(".." + os.sep)):
        errors.append(f"invalid value for 'name': {cfg.name!r} (the run directory output_dir/name must be inside "
                      "output_dir: give a directory name)")
    if m.d_model % m.n_heads:
        errors.append(f"invalid value for 'model.n_heads': {m.n_heads} (must divide model.d_model={m.d_model})")
    elif m.positions != "learned" and m.d_model % 2:
        errors.append(f"invalid value for 'model.d_model': {m.d_model} (sinusoidal positions need an even d_model)")
    if m.positions == "sinusoidal_fairseq" and m.d_model < 4:
        errors.append(f"invalid value for 'model.d_model': {m.d_model} (sinusoidal_fairseq positions need d_model >= 4)")
    if m.positions == "learned" and m.position_offset:
        errors.append(f"invalid value for 'model.position_offset': {m.position_offset} (must be 0 with learned positions)")
    if m.share_embeddings and not d.tokenizer.joint:
        errors.append("'model.share_embeddings' is true but 'data.tokenizer.joint' is false (shared embeddings need a joint vocabulary)")
    _check_decode(dec, "decode", errors, pattern_needs_protect=training)
    if t.metric in ("bleu", "chrf") and not t.valid_bleu:
        errors.append(f"'train.metric: {t.metric}' needs 'train.valid_bleu: true' (or choose metric loss/ppl)")
    if training:
        _check_schedule(t, errors)
        _check_growth(cfg, errors)
        if t.init_from is not None and check_files and not resume:  # --resume ignores init_from
            problem = init_from_problem(t.init_from)
            if problem:
                errors.append(f"'train.init_from': {problem}")
    if len(set(t.init_reset)) != len(t.init_reset):
        errors.append(f"invalid value for 'train.init_reset': {t.init_reset} (an item is repeated)")
    if d.max_len + 2 > m.max_positions:
        errors.append(f"invalid value for 'data.max_len': {d.max_len} (max_len + 2 must be <= model.max_positions={m.max_positions})")
    tok = d.tokenizer
    if tok.joint and (tok.src_model or tok.tgt_model):
        errors.append("'data.tokenizer.src_model'/'tgt_model' need 'data.tokenizer.joint: false' (use 'data.tokenizer.model' for a joint model)")
    if not tok.joint and tok.model:
        errors.append("'data.tokenizer.model' is a joint model but 'data.tokenizer.joint' is false (use src_model and tgt_model)")
    if not tok.joint and bool(tok.src_model) != bool(tok.tgt_model):
        errors.append("'data.tokenizer.src_model' and 'data.tokenizer.tgt_model' must be given together")
    corpora = [(d.train_key(i), c) for i, c in enumerate(d.train_corpora)] + _eval_corpora(d)
    for split in ("train", "valid"):
        if isinstance(getattr(d, split), list) and not getattr(d, split):
            errors.append(f"'data.{split}' is an empty list (give at least one corpus)")
    for key, c in corpora:
        _check_corpus(c, key, errors, check_files)
    _check_mix(d, errors)
    _check_languages(d, errors)
    if t.tune_decode and d.multilingual:
        errors.append("'train.tune_decode' is for a model with one target language (nmt tune tunes one set of "
                      "decode settings on one validation set; a multilingual model has a set per direction)")
    if check_files:
        for key in ("model", "src_model", "tgt_model"):
            p = getattr(tok, key)
            if p and not os.path.isfile(p):
                errors.append(f"data file not found: 'data.tokenizer.{key}': {p}")
    _check_terms(d, errors, check_files)
    _check_shapes(d, m, errors)


def _check_shapes(d: DataConfig, m: ModelConfig, errors: list[str]) -> None:
    """data.length_buckets: increasing, the last one holding the longest pair a training batch can have
    (data.max_len + 2: EOS, and a language token) within model.max_positions; it pads sources, so it
    excludes data.same_source_length."""
    b = d.length_buckets
    if any(not isinstance(x, int) or isinstance(x, bool) or x < 2 for x in b) or list(b) != sorted(set(b)):
        errors.append(f"invalid value for 'data.length_buckets': {list(b)!r} (increasing whole numbers >= 2, "
                      f"the last one from data.max_len + 2 to model.max_positions, e.g. [16, 32, 64, 128, {d.max_len + 2}])")
    elif b and not d.max_len + 2 <= b[-1] <= m.max_positions:
        errors.append(f"invalid value for 'data.length_buckets': its last bucket {b[-1]} must hold the longest training "
                      f"pair (data.max_len + 2 = {d.max_len + 2}) and fit model.max_positions ({m.max_positions})")
    elif b and d.same_source_length:
        errors.append("'data.length_buckets' pads sources to a bucket and 'data.same_source_length' batches them "
                      "without padding: choose one")


def _check_terms(d: DataConfig, errors: list[str], check_files: bool) -> None:
    """data.term_dictionary and data.term_identical go with data.terms > 0, the file exists, and
    data.term_identical goes with an extracted dictionary."""
    if d.term_identical and (d.terms == 0 or d.term_dictionary is not None):
        errors.append("'data.term_identical' is for the dictionary extracted from the training data: it needs "
                      "'data.terms' > 0 and no 'data.term_dictionary'")
    if d.term_dictionary is None:
        return
    if d.terms == 0:
        errors.append("'data.term_dictionary' is set but 'data.terms' is 0 (the share of training pairs to annotate "
                      "with its terms; e.g. 0.5)")
    elif check_files and not os.path.isfile(d.term_dictionary):
        errors.append(f"data file not found: 'data.term_dictionary': {d.term_dictionary}")


def _check_schedule(t: TrainConfig, errors: list[str]) -> None:
    """The learning-rate schedule against the budget: the warmup must end inside it (as
    transformers' warmup_ratio, `warmup_fraction` is a share of a budget that is set), and
    `warmup_steps` always counts optimizer steps."""
    timed = t.schedule_clock == "time"
    if timed and t.max_time == 0:
        errors.append("'train.schedule_clock: time' needs 'train.max_time' > 0 (the budget the schedule spans)")
        return
    if t.schedule in ("cosine", "linear") and not timed and t.max_steps == 0:
        errors.append(f"'train.schedule: {t.schedule}' needs 'train.max_steps' > 0 (the step where the decay ends), "
                      "or 'train.schedule_clock: time' with 'train.max_time'")
        return
    if t.warmup_fraction > 0:
        if not timed and t.max_steps == 0:
            errors.append(f"'train.warmup_fraction: {t.warmup_fraction:g}' is a share of 'train.max_steps', which is 0 "
                          "(no step budget): set train.max_steps (or schedule_clock: time with max_time), or give the "
                          "warmup in 'train.warmup_steps'")
    elif timed and t.warmup_steps > 0:
        errors.append(f"'train.warmup_steps: {t.warmup_steps}' counts optimizer steps, but 'train.schedule_clock: time' "
                      "follows seconds of max_time: give the warmup as 'train.warmup_fraction' (a share of "
                      "train.max_time, e.g. 0.05), or set warmup_steps: 0")
    elif not timed and 0 < t.max_steps <= t.warmup_steps:
        errors.append(f"'train.warmup_steps: {t.warmup_steps}' is not below 'train.max_steps: {t.max_steps}': "
                      "training would stop before the learning rate reaches train.lr; lower warmup_steps "
                      "(or set train.warmup_fraction)")


def _check_growth(cfg: Config, errors: list[str]) -> None:
    """data.add_languages and data.tokenizer.add_pieces grow a fine-tuning source (nmt/training/grow/): they need
    train.init_from; language codes as for per-corpus languages. (What the source knows is checked when
    it is loaded: nmt/training/grow/.)"""
    d = cfg.data
    if d.tokenizer.add_pieces and not d.add_languages:
        errors.append("'data.tokenizer.add_pieces' is set but 'data.add_languages' is empty: new pieces are learnt from "
                      "the training text of the new languages")
    if d.add_languages and cfg.train.init_from is None:
        errors.append("'data.add_languages' needs 'train.init_from' (it adds languages to a pretrained model; a model "
                      "trained from scratch gets its languages from data.train)")
    for code in d.add_languages:
        if not LANG_FORMAT.fullmatch(code):
            errors.append(f"invalid key in 'data.add_languages': {code!r} (a language code: letters, digits, '_' and "
                          "'-', e.g. it, pt_BR, ita_Latn)")


def init_from_problem(path: str) -> str | None:
    """Why `path` cannot be a fine-tuning source (train.init_from), in a few words; None if it is a file."""
    if os.path.isfile(path):
        return None
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, "model.bin")):
            return (f"{path} is a CTranslate2 model directory (written by nmt export), not an nmt checkpoint: "
                    "fine-tuning starts from a checkpoint file, e.g. runs/NAME/checkpoints/best.pt")
        return f"{path} is a directory, not a checkpoint file (e.g. runs/NAME/checkpoints/best.pt)"
    return f"checkpoint not found: {path}"


def _check_corpus(c: CorpusConfig, key: str, errors: list[str], check_files: bool) -> None:
    if c.hf_path is None:
        if not c.src or not c.tgt:
            errors.append(f"'{key}' needs either 'src' and 'tgt' text files or 'hf_path'")
            return
        if check_files:
            for side in ("src", "tgt"):
                path = getattr(c, side)
                if not os.path.isfile(path):
                    errors.append(f"data file not found: '{key}.{side}': {path}")
    else:
        if c.src or c.tgt:
            errors.append(f"'{key}' sets both text files ('src'/'tgt') and 'hf_path'; choose one")
        if c.hf_path in ("json", "csv", "parquet") and not c.hf_data_files:
            errors.append(f"'{key}.hf_path: {c.hf_path}' needs '{key}.hf_data_files'")
        if check_files and c.hf_data_files:
            for p in c.hf_data_files:
                if not os.path.exists(p):
                    errors.append(f"data file not found: '{key}.hf_data_files': {p}")


def _eval_corpora(d: DataConfig) -> list[tuple[str, CorpusConfig]]:
    """(config key, corpus) of the validation corpora and the test corpus."""
    return [(d.valid_key(i), c) for i, c in enumerate(d.valid_corpora)] + ([("data.test", d.test)] if d.test is not None else [])


def _check_mix(d: DataConfig, errors: list[str]) -> None:
    """Weights and tags: only on training corpora; weights finite with a positive sum; tags <NAME>."""
    for key, c in _eval_corpora(d):
        if c.weight != 1.0:
            errors.append(f"'{key}.weight' is set, but weights apply only to training corpora (data.train)")
        if c.src_tag is not None:
            errors.append(f"'{key}.src_tag' is set, but tags apply only to training corpora (data.train)")
    weights = [c.weight for c in d.train_corpora]
    for i, c in enumerate(d.train_corpora):  # (weights are finite: `_convert` rejects nan and inf)
        key = d.train_key(i)
        tag = c.src_tag
        if tag is None:
            continue
        if tag in RESERVED_TAGS:
            errors.append(f"invalid value for '{key}.src_tag': {tag!r} (reserved for SentencePiece's special "
                          f"tokens {', '.join(RESERVED_TAGS)}; choose another name, e.g. <BT>)")
        elif tag in TERM_SYMBOLS:
            errors.append(f"invalid value for '{key}.src_tag': {tag!r} (reserved for the term annotations of "
                          "data.terms; choose another name, e.g. <BT>)")
        elif tag in PLACEHOLDERS:
            errors.append(f"invalid value for '{key}.src_tag': {tag!r} (reserved for the placeholders of protected "
                          f"spans, {PLACEHOLDERS[0]} ... {PLACEHOLDERS[-1]}: data.protect; choose another name, e.g. <BT>)")
        elif not TAG_FORMAT.fullmatch(tag):
            errors.append(f"invalid value for '{key}.src_tag': {tag!r} (expected <NAME> with NAME made of letters, "
                          "digits, '_', '-' and '.', e.g. <BT>)")
    if weights and not sum(weights) > 0:
        errors.append(f"the weights of 'data.train' sum to {sum(weights):g} (at least one corpus needs a weight > 0)")


def _check_languages(d: DataConfig, errors: list[str]) -> None:
    """A multilingual model's target languages become tokens `__CODE__`: codes of letters, digits, '_'
    and '-'. Every validation corpus translates into a target language of the training corpora."""
    if not d.train_corpora:
        return
    targets = d.target_languages
    if d.multilingual:
        for i, c in enumerate(d.train_corpora):
            code = d.langs(c)[1]
            if not LANG_FORMAT.fullmatch(code):
                key = f"{d.train_key(i)}.tgt_lang" if c.tgt_lang else "data.tgt_lang"
                errors.append(f"invalid value for '{key}': {code!r} (a target language of a multilingual model "
                              "becomes a token: use letters, digits, '_' and '-', e.g. de, pt_BR, deu_Latn)")
    for i, c in enumerate(d.valid_corpora):
        code = d.langs(c)[1]
        if code not in targets:
            key = f"{d.valid_key(i)}.tgt_lang" if c.tgt_lang else "data.tgt_lang"
            errors.append(f"'{key}' is {code!r}, which is not a target language of data.train "
                          f"({', '.join(targets)}): the model cannot be validated into it")


class _NoAliasLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses aliases (`*name`, also in `<<: *name` merges): a few
    hundred bytes of nested aliases expand to gigabytes once the config is copied."""

    def compose_node(self, parent, index):  # type: ignore[override]
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise ConfigError(f"YAML alias *{event.anchor} at line {event.start_mark.line + 1}: aliases are not "
                              "supported in configs (write the values out, or use --set)")
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):  # type: ignore[override]
        """A key given twice in one mapping is an error (YAML would keep the last: a second `train:` section
        silently replaced the whole first one)."""
        if isinstance(node, yaml.MappingNode):
            seen: set = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                if isinstance(key, (str, int, float, bool)) and key in seen:
                    raise ConfigError(f"duplicate key {key!r} at line {key_node.start_mark.line + 1} (a key may be "
                                      "given once in each mapping)")
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _load_yaml(stream: Any) -> Any:
    return yaml.load(stream, Loader=_NoAliasLoader)


def parse_override(text: str) -> tuple[list[str], Any]:
    """`train.lr=5e-4` -> (['train', 'lr'], 0.0005). The value is parsed as YAML."""
    if "=" not in text:
        raise ConfigError(f"invalid override {text!r} (expected KEY=VALUE, e.g. train.lr=5e-4)")
    key, _, value = text.partition("=")
    key = key.strip()
    if not key:
        raise ConfigError(f"invalid override {text!r} (empty key)")
    try:
        parsed = _load_yaml(value) if value.strip() else None
    except yaml.YAMLError:
        parsed = value
    return key.split("."), parsed


_INDEXED = re.compile(r"(.+)\[(\d+)\]")


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """Apply `KEY=VALUE` overrides to a copy of raw; `data.train[1].weight=0.5` indexes a list of corpora."""
    raw = _deepcopy(raw)
    for text in overrides:
        path, value = parse_override(text)
        node = raw
        for depth, part in enumerate(path):
            indexed = _INDEXED.fullmatch(part)
            name = indexed.group(1) if indexed else part
            last = depth == len(path) - 1
            if indexed:
                items = node.get(name)
                i = int(indexed.group(2))
                if not isinstance(items, list) or i >= len(items):
                    size = len(items) if isinstance(items, list) else 0
                    raise ConfigError(f"invalid override {text!r}: '{'.'.join(path[:depth] + [name])}' has no item {i} "
                                      f"(it is {'a list of ' + str(size) if isinstance(items, list) else 'not a list'})")
                if last:
                    items[i] = value
                    break
                if not isinstance(items[i], dict):
                    items[i] = {}
                node = items[i]
                continue
            if last:
                node[part] = value
                break
            child = node.get(part)
            if isinstance(child, list):
                raise ConfigError(f"invalid override {text!r}: '{'.'.join(path[:depth + 1])}' is a list; "
                                  f"name an item, e.g. {'.'.join(path[:depth] + [part + '[0]'] + path[depth + 1:])}=...")
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
    return raw


def _deepcopy(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _deepcopy(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_deepcopy(v) for v in x]
    return x


def config_from_dict(raw: dict, *, check_files: bool = True, training: bool = True, resume: bool = False) -> Config:
    """Build and validate a Config from a plain dict (already merged with overrides); relative data paths
    are resolved against the current directory. Raises ConfigError listing every problem. check_files:
    data files and train.init_from must exist. training=False: a checkpoint's config, without the rules
    that only matter to start training. resume: `nmt train --resume`, which ignores train.init_from."""
    if not isinstance(raw, dict):
        raise ConfigError("the config must be a YAML mapping with sections data, model, train, decode")
    errors: list[str] = []
    cfg = _build(Config, raw, "", errors)
    data = raw.get("data")
    if training and isinstance(data, dict):  # only a checkpoint written by `nmt import` has no corpora
        errors += [f"missing required key 'data.{k}'" for k in ("train", "valid") if data.get(k) is None]
    if not errors:
        _check_semantics(cfg, errors, check_files, training, resume)
    if errors:
        raise ConfigError(errors)
    return cfg


def decode_config(base: DecodeConfig | dict | None = None, overrides: dict[str, Any] | None = None, *,
                  check_rules: bool = True) -> DecodeConfig:
    """Decode settings from outside the code, validated like a config file: options of the API, the command
    line and requests, an export's metadata, a tuned setting. (A config's `decode` section is checked by
    `config_from_dict`.)

    base: a DecodeConfig, a raw `decode` mapping or None (defaults). overrides: {decode key: value}, None
    values skipped; a string for a number or boolean key is parsed as YAML (flags). Raises ConfigError
    listing every problem (with check_rules also the rules between keys, e.g. nbest <= beam_size)."""
    raw = to_dict(base) if isinstance(base, DecodeConfig) else dict(base or {})
    types = {name: tp for name, _, tp in decode_options()}
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if isinstance(value, str) and types.get(key) in (int, float, bool, Optional[int], Optional[float]):
            try:
                value = _load_yaml(value)
            except yaml.YAMLError:
                pass
        raw[key] = value
    errors: list[str] = []
    dec = _build(DecodeConfig, raw, "decode", errors)
    if not errors and check_rules:
        _check_decode(dec, "decode", errors, pattern_needs_protect=(overrides or {}).get("protect_pattern") is not None)
    if errors:
        raise ConfigError(errors)
    return dec


def load_config(path: str, overrides: list[str] | None = None, *, check_files: bool = True,
                resume: bool = False) -> Config:
    """Read a YAML config, apply `--set KEY=VALUE` overrides, validate, return a Config.

    If the file does not set `name`, the run is named after the file (stem). resume: see
    `config_from_dict`.
    """
    if not os.path.isfile(path):
        raise ConfigError(f"config file not found: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            raw = _load_yaml(f)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}: invalid YAML{where}: {getattr(e, 'problem', e)}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not valid UTF-8") from None
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the config must be a YAML mapping with sections data, model, train, decode")
    raw = apply_overrides(raw, overrides or [])
    if "name" not in raw:
        raw["name"] = os.path.splitext(os.path.basename(path))[0]
    return config_from_dict(raw, check_files=check_files, resume=resume)


def to_dict(cfg: Any) -> Any:
    """Config -> plain dict of YAML-friendly values (tuples become lists)."""
    if dataclasses.is_dataclass(cfg):
        return {f.name: to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, (list, tuple)):
        return [to_dict(v) for v in cfg]
    return cfg


def dump_config(cfg: Config) -> str:
    """The fully resolved config as YAML; `load_config` of it gives an equal Config."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False, allow_unicode=True)


def save_config(cfg: Config, path: str) -> None:
    """Write `dump_config(cfg)` to `path` (atomically: nmt/textio.py `atomic_file`), unless the file there
    already holds these settings (`same_settings`: a config written by hand, with its comments, stays)."""
    from nmt.textio import atomic_file

    if same_settings(path, cfg):
        return
    with atomic_file(path) as f:
        f.write(dump_config(cfg).encode("utf-8"))


def same_settings(path: str, cfg: Config) -> bool:
    """Whether the config file `path` exists and loads (without checking its data files) to `cfg`'s settings."""
    try:
        return os.path.isfile(path) and to_dict(load_config(path, check_files=False)) == to_dict(cfg)
    except (ConfigError, OSError):
        return False


def replace(cfg: Any, **changes: Any) -> Any:
    """dataclasses.replace, re-exported for frozen configs."""
    return dataclasses.replace(cfg, **changes)
