"""Typed, frozen configuration: YAML -> dataclasses, checked at load.

A config file has the sections `data`, `model`, `train`, `decode` and the
top-level keys `name`, `seed`, `output_dir`. Every field below carries its
help text in `metadata["help"]`; configs/README.md and `nmt train --help`
are generated from it, so the documentation cannot drift from the code.

All errors in a file are collected and reported together, each naming its
full key (`train.warmup_steps`), as one line per error; the CLI prints them
and exits with code 2.

This module must stay importable without torch (fast `nmt --help`).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

import yaml


class ConfigError(ValueError):
    """Invalid configuration. `errors` holds one message per problem."""

    def __init__(self, errors: list[str] | str):
        self.errors = [errors] if isinstance(errors, str) else list(errors)
        super().__init__("; ".join(self.errors))


def _f(default: Any, help: str, *, min: float | None = None, max: float | None = None,
       exclusive_min: bool = False, train_only: bool = False) -> Any:
    """A dataclass field with help text and an optional numeric range (`train_only`: documented under
    `data.train` only)."""
    meta = {"help": help, "min": min, "max": max, "exclusive_min": exclusive_min, "train_only": train_only}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


REQUIRED: Any = dataclasses.MISSING


def _req(help: str) -> Any:
    return field(metadata={"help": help, "min": None, "max": None, "exclusive_min": False})


# --------------------------------------------------------------------------- data

@dataclass(frozen=True)
class CorpusConfig:
    """One parallel corpus: two text files, or a Hugging Face `datasets` source.

    Text files: set `src` and `tgt` (plain or .gz, one sentence a line).
    Hugging Face: set `hf_path` to a hub dataset name (e.g. `wmt14`), a local
    directory written by `save_to_disk`, or a builder name `json`/`csv`/`parquet`
    together with `hf_data_files`. The language fields default to the
    `translation` dict (`translation[src_lang]`); for flat columns set
    `src_field`/`tgt_field`.
    """

    src: Optional[str] = _f(None, "Source-language text file (plain or .gz), one sentence per line.")
    tgt: Optional[str] = _f(None, "Target-language text file, line-aligned with `src`.")
    hf_path: Optional[str] = _f(None, "Hugging Face dataset: hub name, `save_to_disk` directory, or `json`/`csv`/`parquet` with `hf_data_files`.")
    hf_name: Optional[str] = _f(None, "Dataset configuration name (e.g. `de-en` for wmt14).")
    hf_split: str = _f("train", "Dataset split to read.")
    hf_data_files: Optional[list[str]] = _f(None, "Local data files for the `json`/`csv`/`parquet` builders.")
    src_field: Optional[str] = _f(None, "Column holding the source sentence; default `translation[src_lang]`. A dotted path like `translation.de` also works.")
    tgt_field: Optional[str] = _f(None, "Column holding the target sentence; default `translation[tgt_lang]`.")
    max_sentences: Optional[int] = _f(None, "Read at most this many pairs (the first N); null = all.", min=1)
    weight: float = _f(1.0, "Sampling share per epoch (training corpora only). Each epoch has as many pairs as all training corpora together (after filtering); this corpus gives weight / (sum of weights) of them: whole passes, then a seeded random subset of the rest. 0 = not used.", min=0.0, train_only=True)
    src_tag: Optional[str] = _f(None, "A tag `<NAME>` (letters, digits, `_`, `-`, `.`) put before every non-empty source sentence of this corpus, e.g. `<BT>` for back-translated data (training corpora only). A trained tokenizer gets it as a user-defined symbol: always one token.", train_only=True)

    @property
    def kind(self) -> str:
        return "hf" if self.hf_path is not None else "text"


@dataclass(frozen=True)
class TokenizerConfig:
    """SentencePiece: trained on the training data, or loaded from files."""

    joint: bool = _f(True, "One SentencePiece model and vocabulary for both languages (needed for `model.share_embeddings`).")
    vocab_size: int = _f(8000, "Vocabulary size of each trained model (including the 4 special tokens).", min=8)
    model_type: Literal["unigram", "bpe", "char", "word"] = _f("unigram", "SentencePiece model type.")
    character_coverage: float = _f(1.0, "Share of characters covered by the model (0.9995 for languages with large alphabets).", min=0.0, max=1.0, exclusive_min=True)
    max_sentences: int = _f(1_000_000, "Train on a random sample of at most this many sentences (per model).", min=1)
    model: Optional[str] = _f(None, "Existing joint SentencePiece `.model` to load instead of training one.")
    src_model: Optional[str] = _f(None, "Existing source SentencePiece `.model` (with `joint: false`).")
    tgt_model: Optional[str] = _f(None, "Existing target SentencePiece `.model` (with `joint: false`).")
    threads: int = _f(2, "Threads for SentencePiece training and batch encoding.", min=1)


@dataclass(frozen=True)
class DataConfig:
    src_lang: str = _req("Source language code, e.g. `es`.")
    tgt_lang: str = _req("Target language code, e.g. `en`.")
    train: CorpusConfig | list[CorpusConfig] = _req("Training corpus, or a list of corpora mixed by their `weight` (see `data.train.weight`, `data.train.src_tag`).")
    valid: CorpusConfig = _req("Validation corpus (loss, BLEU, early stopping).")
    test: Optional[CorpusConfig] = _f(None, "Test corpus (optional; used by recipes and docs).")
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig, metadata={"help": "SentencePiece settings."})
    max_len: int = _f(256, "Drop training pairs with more than this many subword tokens on either side (BOS/EOS not counted).", min=1)
    max_ratio: float = _f(3.0, "Drop training pairs whose token-length ratio (longer/shorter) exceeds this.", min=1.0)
    batch_tokens: int = _f(4096, "Token budget per batch: B x max(S, T) <= batch_tokens, i.e. neither the padded source tensor nor the padded target tensor holds more than this many positions (fairseq's --max-tokens).", min=1)
    max_batch_size: int = _f(0, "Cap on sentences per batch; 0 = no cap.", min=0)
    protect: bool = _f(False, "Replace protected spans (placeholders such as `%s`, `{0}`, markup, `&amp;`: nmt/protect.py) in training and validation pairs by placeholder tokens `<ph_K>`, which become SentencePiece symbols: the model learns to copy them. Translate with `--protect`.")
    pool_size: int = _f(0, "Length bucketing pool: pairs are shuffled, then sorted by length inside pools of this many pairs; 0 = one pool per epoch (least padding).", min=0)

    @property
    def train_corpora(self) -> tuple[CorpusConfig, ...]:
        """`train` as a tuple, whether the config gives one corpus or a list."""
        return tuple(self.train) if isinstance(self.train, list) else (self.train,)

    def train_key(self, i: int) -> str:
        """The config key of training corpus i: `data.train` or `data.train[i]`."""
        return f"data.train[{i}]" if isinstance(self.train, list) else "data.train"


TAG_FORMAT = re.compile(r"<[A-Za-z0-9_.\-]+>")
RESERVED_TAGS = ("<pad>", "<unk>", "<s>", "</s>")


# --------------------------------------------------------------------------- model

@dataclass(frozen=True)
class ModelConfig:
    d_model: int = _f(512, "Model (embedding) dimension.", min=1)
    n_heads: int = _f(8, "Attention heads; must divide d_model.", min=1)
    layers: int = _f(6, "Layers in each stack, unless encoder_layers / decoder_layers say otherwise.", min=1)
    encoder_layers: Optional[int] = _f(None, "Encoder layers (default: `layers`).", min=1)
    decoder_layers: Optional[int] = _f(None, "Decoder layers (default: `layers`).", min=1)
    ffn_dim: int = _f(2048, "Inner dimension of the position-wise feed-forward network.", min=1)
    activation: Literal["relu", "gelu"] = _f("relu", "Feed-forward activation.")
    norm: Literal["pre", "post"] = _f("pre", "`pre`: layer norm before each sublayer plus a final norm per stack; `post`: the paper's norm after each residual.")
    dropout: float = _f(0.1, "Dropout on embeddings, sublayer outputs and residuals.", min=0.0, max=1.0)
    attention_dropout: float = _f(0.0, "Dropout on attention weights.", min=0.0, max=1.0)
    activation_dropout: float = _f(0.0, "Dropout after the feed-forward activation.", min=0.0, max=1.0)
    positions: Literal["sinusoidal", "learned"] = _f("sinusoidal", "Positional encoding.")
    max_positions: int = _f(1024, "Longest sequence the model accepts (positions table size).", min=1)
    share_embeddings: bool = _f(True, "Share source and target embeddings (requires `data.tokenizer.joint`).")
    tie_output: bool = _f(True, "Tie the output projection to the target embedding.")

    @property
    def n_encoder_layers(self) -> int:
        return self.encoder_layers if self.encoder_layers is not None else self.layers

    @property
    def n_decoder_layers(self) -> int:
        return self.decoder_layers if self.decoder_layers is not None else self.layers


# --------------------------------------------------------------------------- train

@dataclass(frozen=True)
class TrainConfig:
    optimizer: Literal["adam", "adamw"] = _f("adamw", "Optimizer (fused on CUDA).")
    lr: float = _f(5e-4, "Peak learning rate (with `schedule: noam`, a multiplier of d_model^-0.5).", min=0.0, exclusive_min=True)
    betas: tuple[float, float] = _f((0.9, 0.98), "Adam betas.")
    eps: float = _f(1e-9, "Adam epsilon.", min=0.0)
    weight_decay: float = _f(0.0, "Weight decay (decoupled for adamw).", min=0.0)
    schedule: Literal["inverse_sqrt", "noam", "cosine", "linear", "constant"] = _f("inverse_sqrt", "Learning-rate schedule; all warm up linearly over `warmup_steps`. inverse_sqrt: lr*sqrt(warmup/step) after warmup; noam: lr*d_model^-0.5*min(step^-0.5, step*warmup^-1.5); cosine/linear: decay to `min_lr` at `max_steps`.")
    warmup_steps: int = _f(4000, "Linear warmup steps.", min=0)
    warmup_fraction: float = _f(0.0, "If > 0: the warmup is this share of the budget (max_steps, or max_time with schedule_clock: time) instead of warmup_steps.", min=0.0, max=1.0)
    schedule_clock: Literal["steps", "time"] = _f("steps", "What the schedule follows: optimizer steps, or `time`: the seconds trained so far out of `max_time` (cosine/linear then reach min_lr exactly when the time budget ends; not reproducible bit for bit).")
    min_lr: float = _f(0.0, "Final learning rate of the cosine/linear schedules.", min=0.0)
    label_smoothing: float = _f(0.1, "Label smoothing epsilon (PyTorch's formula: epsilon spread over all V classes).", min=0.0, max=1.0)
    clip_norm: float = _f(1.0, "Clip the gradient norm to this; 0 = no clipping.", min=0.0)
    update_freq: int = _f(1, "Gradient accumulation: batches per optimizer step.", min=1)
    precision: Literal["auto", "fp32", "bf16", "fp16"] = _f("auto", "auto: bf16 autocast on GPUs that support it, else fp16 with a GradScaler; fp32 on CPU.")
    compile: bool = _f(False, "Compile the model with torch.compile.")
    max_steps: int = _f(0, "Stop after this many optimizer steps; 0 = no limit.", min=0)
    max_epochs: int = _f(0, "Stop after this many epochs; 0 = no limit.", min=0)
    max_time: float = _f(0.0, "Stop after this many seconds of wall clock; 0 = no limit.", min=0.0)
    valid_every: int = _f(1000, "Validate (and save) every this many steps; also at the end.", min=1)
    valid_every_minutes: float = _f(0.0, "Also validate (and save) whenever this many minutes of training passed since the last validation; 0 = off.", min=0.0)
    valid_bleu: bool = _f(True, "Greedy-decode the validation set for BLEU/chrF at each validation.")
    valid_max_sentences: int = _f(0, "Decode at most this many validation sentences for BLEU; 0 = all.", min=0)
    valid_tokenize: Literal["13a", "intl", "zh", "ja-mecab", "ko-mecab", "char", "none"] = _f(
        "13a", "sacreBLEU tokenizer for validation BLEU (zh for Chinese, ja-mecab for Japanese, ko-mecab for Korean targets; "
        "as `nmt evaluate --tokenize`).")
    num_samples: int = _f(3, "Sample translations shown at each validation.", min=0)
    metric: Literal["bleu", "chrf", "loss", "ppl"] = _f("bleu", "Validation metric that picks the best checkpoint and drives early stopping.")
    patience: int = _f(0, "Stop after this many validations without improvement; 0 = never.", min=0)
    save_every: int = _f(0, "Also save the latest checkpoint every this many steps; 0 = at validations only.", min=0)
    keep_last: int = _f(5, "Keep this many step checkpoints besides `latest.pt` and `best.pt`.", min=0)
    log_every: int = _f(100, "Log training statistics every this many steps.", min=1)
    max_nan_steps: int = _f(10, "Stop with an error after this many non-finite losses in a row.", min=1)
    device: str = _f("auto", "`auto` (CUDA if available), `cpu`, `cuda`, `cuda:N`.")
    init_from: Optional[str] = _f(None, "Start this NEW run from another run's checkpoint (fine-tuning): its weights and its tokenizer; the architecture and data.tokenizer must match it. Ignored by --resume.")
    init_reset: list[Literal["optimizer", "schedule", "counters"]] = _f(["optimizer", "schedule", "counters"], "With init_from, what starts fresh (leave an item out to carry it over from the checkpoint): optimizer (Adam moments), schedule (the learning-rate schedule's position), counters (the step count).")
    keep_best: int = _f(0, "Also keep the step checkpoints of the best this many validations (by `metric`), besides the last `keep_last`.", min=0)
    threads: int = _f(0, "CPU threads for torch; 0 = torch's default.", min=0)


# --------------------------------------------------------------------------- decode

@dataclass(frozen=True)
class DecodeConfig:
    beam_size: int = _f(5, "Beam size; 1 = greedy search.", min=1)
    nbest: int = _f(1, "Hypotheses to output per sentence (<= beam_size).", min=1)
    length_penalty: float = _f(1.0, "Length penalty alpha.", min=0.0)
    length_penalty_type: Literal["gnmt", "average", "none"] = _f("gnmt", "gnmt: score / ((5+len)/6)^alpha; average: score / len^alpha; none: raw log-probability.")
    max_len_a: float = _f(1.2, "Maximum output length = a * source_length + b.", min=0.0)
    max_len_b: int = _f(10, "See max_len_a.", min=1)
    min_len: int = _f(0, "Minimum output length (EOS forbidden before it).", min=0)
    batch_tokens: int = _f(8192, "Source-token budget of a translation batch (padded).", min=1)
    max_batch_size: int = _f(256, "Cap on sentences per translation batch.", min=1)
    workers: int = _f(0, "CPU: batches decoded at once, each with torch threads / workers intra-op threads "
                      "(as CTranslate2's inter_threads); 0 = auto: 2 on a CPU with at least 2 threads, else 1. "
                      "Each worker holds its own batch in memory. Ignored on GPU.", min=0)
    sampling: Literal["none", "topk", "topp"] = _f("none", "Sample instead of searching: `topk` draws each token from the `topk` most probable, `topp` from the smallest set reaching probability `topp` (nucleus); `nbest` samples per line. For back-translation.")
    topk: int = _f(10, "Tokens to sample from with `sampling: topk`.", min=1)
    topp: float = _f(0.9, "Probability mass to sample from with `sampling: topp`.", min=0.0, max=1.0, exclusive_min=True)
    temperature: float = _f(1.0, "Sampling temperature: the distribution is p^(1/T), renormalised (< 1 sharper, > 1 flatter).", min=0.0, exclusive_min=True)
    seed: int = _f(1, "Sampling seed: with it, each input line's samples depend only on the line number and the line.", min=0)
    no_repeat_ngram: int = _f(0, "Forbid any n-gram of this many target tokens from occurring twice in an output (greedy, beam and sampling); 0 = off.", min=0)
    protect: bool = _f(False, "Replace placeholders and markup (`%s`, `%1$s`, `%(name)s`, `{0}`, `{name}`, `<b>`, `&amp;`, ...) by placeholder tokens before translating and restore them after; needs a model trained with `data.protect: true`.")
    protect_pattern: Optional[str] = _f(None, "An extra regular expression whose matches are protected too (with `protect`).")
    alignment: bool = _f(False, "Also output, after ` ||| `, the source token each output token attends to most (last decoder layer's cross-attention, averaged over heads), as Pharaoh `src-tgt` subword indices.")


# --------------------------------------------------------------------------- top

@dataclass(frozen=True)
class Config:
    data: DataConfig = _req("Data, tokenizer, filtering and batching.")
    model: ModelConfig = field(default_factory=ModelConfig, metadata={"help": "Transformer architecture."})
    train: TrainConfig = field(default_factory=TrainConfig, metadata={"help": "Optimisation, schedule, precision, validation, checkpoints."})
    decode: DecodeConfig = field(default_factory=DecodeConfig, metadata={"help": "Search settings for translate/evaluate."})
    name: str = _f("run", "Run name: the run directory is `output_dir/name`.")
    seed: int = _f(1, "Random seed (data order, initialisation, dropout).", min=0)
    output_dir: str = _f("runs", "Parent directory of run directories.")

    @property
    def run_dir(self) -> str:
        return os.path.join(self.output_dir, self.name)


# --------------------------------------------------------------------------- loading

def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return " | ".join(_type_name(a) for a in args) + " | null"
    if origin in (list, tuple):
        return str(tp).replace("typing.", "")
    if dataclasses.is_dataclass(tp):
        return "mapping"
    return getattr(tp, "__name__", str(tp))


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
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            errors.append(f"invalid value for '{key}': {value!r} (expected a list of {len(args)} numbers)")
            return None
        out = [_convert(v, a, f"{key}[{i}]", errors) for i, (v, a) in enumerate(zip(value, args))]
        return tuple(out)
    if origin is list:
        (arg,) = typing.get_args(tp)
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list):
            errors.append(f"invalid value for '{key}': {value!r} (expected a list)")
            return None
        return [_convert(v, arg, f"{key}[{i}]", errors) for i, v in enumerate(value)]
    if tp is bool:
        if not isinstance(value, bool):
            errors.append(f"invalid value for '{key}': {value!r} (expected true or false)")
            return None
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            errors.append(f"invalid value for '{key}': {value!r} (expected an integer)")
            return None
        return value
    if tp is float:
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
    if tp is str:
        if not isinstance(value, str):
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return str(value)
            errors.append(f"invalid value for '{key}': {value!r} (expected a string)")
            return None
        return value
    raise TypeError(f"unsupported config type {tp!r} for {key}")  # programming error


def _check_range(value: Any, f: dataclasses.Field, key: str, errors: list[str]) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return
    lo, hi = f.metadata.get("min"), f.metadata.get("max")
    if lo is not None and (value < lo or (f.metadata.get("exclusive_min") and value == lo)):
        op = ">" if f.metadata.get("exclusive_min") else ">="
        errors.append(f"invalid value for '{key}': {value!r} (must be {op} {lo:g})")
    if hi is not None and value > hi:
        errors.append(f"invalid value for '{key}': {value!r} (must be <= {hi:g})")


def _build(cls: type, raw: dict, prefix: str, errors: list[str]) -> Any:
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


def _check_decode(dec: DecodeConfig, prefix: str, errors: list[str]) -> None:
    """Rules between decode keys (each key's own type and range are checked by `_build`)."""
    if dec.nbest > dec.beam_size and dec.sampling == "none":
        errors.append(f"invalid value for '{prefix}.nbest': {dec.nbest} (must be <= {prefix}.beam_size={dec.beam_size}, "
                      "or set sampling: nbest samples per line)")
    if dec.protect_pattern is not None:
        import re

        try:
            if re.compile(dec.protect_pattern).match(""):
                errors.append(f"invalid value for '{prefix}.protect_pattern': {dec.protect_pattern!r} (it matches the "
                              "empty string)")
        except re.error as e:
            errors.append(f"invalid value for '{prefix}.protect_pattern': {dec.protect_pattern!r} (not a regular "
                          f"expression: {e})")


def _check_semantics(cfg: Config, errors: list[str], check_files: bool) -> None:
    d, m, t, dec = cfg.data, cfg.model, cfg.train, cfg.decode
    if m.d_model % m.n_heads:
        errors.append(f"invalid value for 'model.n_heads': {m.n_heads} (must divide model.d_model={m.d_model})")
    elif (m.d_model // m.n_heads) % 2 and m.positions == "sinusoidal" and m.d_model % 2:
        errors.append(f"invalid value for 'model.d_model': {m.d_model} (sinusoidal positions need an even d_model)")
    if m.share_embeddings and not d.tokenizer.joint:
        errors.append("'model.share_embeddings' is true but 'data.tokenizer.joint' is false (shared embeddings need a joint vocabulary)")
    _check_decode(dec, "decode", errors)
    if t.metric in ("bleu", "chrf") and not t.valid_bleu:
        errors.append(f"'train.metric: {t.metric}' needs 'train.valid_bleu: true' (or choose metric loss/ppl)")
    if t.init_from is not None and check_files and not os.path.isfile(t.init_from):
        errors.append(f"checkpoint not found: 'train.init_from': {t.init_from}")
    if len(set(t.init_reset)) != len(t.init_reset):
        errors.append(f"invalid value for 'train.init_reset': {t.init_reset} (an item is repeated)")
    if t.schedule_clock == "time" and t.max_time == 0:
        errors.append("'train.schedule_clock: time' needs 'train.max_time' > 0 (the budget the schedule spans)")
    elif t.schedule in ("cosine", "linear") and t.schedule_clock == "steps" and t.max_steps == 0:
        errors.append(f"'train.schedule: {t.schedule}' needs 'train.max_steps' > 0 (the step where the decay ends), "
                      "or 'train.schedule_clock: time' with 'train.max_time'")
    if t.warmup_fraction >= 1:
        errors.append(f"invalid value for 'train.warmup_fraction': {t.warmup_fraction} (must be < 1)")
    if d.max_len + 2 > m.max_positions:
        errors.append(f"invalid value for 'data.max_len': {d.max_len} (max_len + 2 must be <= model.max_positions={m.max_positions})")
    tok = d.tokenizer
    if tok.joint and (tok.src_model or tok.tgt_model):
        errors.append("'data.tokenizer.src_model'/'tgt_model' need 'data.tokenizer.joint: false' (use 'data.tokenizer.model' for a joint model)")
    if not tok.joint and tok.model:
        errors.append("'data.tokenizer.model' is a joint model but 'data.tokenizer.joint' is false (use src_model and tgt_model)")
    if not tok.joint and bool(tok.src_model) != bool(tok.tgt_model):
        errors.append("'data.tokenizer.src_model' and 'data.tokenizer.tgt_model' must be given together")
    corpora = [(d.train_key(i), c) for i, c in enumerate(d.train_corpora)]
    corpora += [(f"data.{split}", getattr(d, split)) for split in ("valid", "test") if getattr(d, split) is not None]
    if not d.train_corpora:
        errors.append("'data.train' is an empty list (give at least one corpus)")
    for key, c in corpora:
        _check_corpus(c, key, errors, check_files)
    _check_mix(d, errors)
    if check_files:
        for key in ("model", "src_model", "tgt_model"):
            p = getattr(tok, key)
            if p and not os.path.isfile(p):
                errors.append(f"data file not found: 'data.tokenizer.{key}': {p}")


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


def _check_mix(d: DataConfig, errors: list[str]) -> None:
    """Weights and tags: only on training corpora; weights finite with a positive sum; tags <NAME>."""
    for split in ("valid", "test"):
        c = getattr(d, split)
        if c is not None and c.weight != 1.0:
            errors.append(f"'data.{split}.weight' is set, but weights apply only to training corpora (data.train)")
        if c is not None and c.src_tag is not None:
            errors.append(f"'data.{split}.src_tag' is set, but tags apply only to training corpora (data.train)")
    weights = [c.weight for c in d.train_corpora]
    for i, c in enumerate(d.train_corpora):  # (weights are finite: `_convert` rejects nan and inf)
        key = d.train_key(i)
        tag = c.src_tag
        if tag is None:
            continue
        if tag in RESERVED_TAGS:
            errors.append(f"invalid value for '{key}.src_tag': {tag!r} (reserved for SentencePiece's special "
                          f"tokens {', '.join(RESERVED_TAGS)}; choose another name, e.g. <BT>)")
        elif not TAG_FORMAT.fullmatch(tag):
            errors.append(f"invalid value for '{key}.src_tag': {tag!r} (expected <NAME> with NAME made of letters, "
                          "digits, '_', '-' and '.', e.g. <BT>)")
    if weights and not sum(weights) > 0:
        errors.append(f"the weights of 'data.train' sum to {sum(weights):g} (at least one corpus needs a weight > 0)")


class _NoAliasLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses aliases (`*name`, also in `<<: *name` merges): a few
    hundred bytes of nested aliases expand to gigabytes once the config is copied."""

    def compose_node(self, parent, index):  # type: ignore[override]
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise ConfigError(f"YAML alias *{event.anchor} at line {event.start_mark.line + 1}: aliases are not "
                              "supported in configs (write the values out, or use --set)")
        return super().compose_node(parent, index)


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


def config_from_dict(raw: dict, *, base_dir: str | None = None, check_files: bool = True) -> Config:
    """Build and validate a Config from a plain dict (already merged with overrides).

    Relative data paths are resolved against the current directory (as a user
    types them). Raises ConfigError listing every problem.
    """
    if not isinstance(raw, dict):
        raise ConfigError("the config must be a YAML mapping with sections data, model, train, decode")
    errors: list[str] = []
    cfg = _build(Config, raw, "", errors)
    if not errors:
        _check_semantics(cfg, errors, check_files)
    if errors:
        raise ConfigError(errors)
    return cfg


def decode_config(base: DecodeConfig | dict | None = None, overrides: dict[str, Any] | None = None, *,
                  check_rules: bool = True) -> DecodeConfig:
    """The one way decode settings are made, from any source, validated like a config file.

    base: a DecodeConfig (e.g. a checkpoint's `cfg.decode`), a raw `decode` mapping (e.g. the
    metadata of a CTranslate2 export) or None (defaults). overrides: {decode key: value}, None
    values skipped; a string value for a number or boolean key is parsed as YAML (command-line
    flags). Raises ConfigError listing every problem (unknown keys, types, ranges, and with
    check_rules the rules between keys, e.g. nbest <= beam_size).
    """
    raw = to_dict(base) if isinstance(base, DecodeConfig) else dict(base or {})
    hints = typing.get_type_hints(DecodeConfig)
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if isinstance(value, str) and hints.get(key) in (int, float, bool):
            try:
                value = _load_yaml(value)
            except yaml.YAMLError:
                pass
        raw[key] = value
    errors: list[str] = []
    dec = _build(DecodeConfig, raw, "decode", errors)
    if not errors and check_rules:
        _check_decode(dec, "decode", errors)
    if errors:
        raise ConfigError(errors)
    return dec


def load_config(path: str, overrides: list[str] | None = None, *, check_files: bool = True) -> Config:
    """Read a YAML config, apply `--set KEY=VALUE` overrides, validate, return a Config.

    If the file does not set `name`, the run is named after the file (stem).
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
    return config_from_dict(raw, check_files=check_files)


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
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(dump_config(cfg))
    os.replace(tmp, path)


def replace(cfg: Any, **changes: Any) -> Any:
    """dataclasses.replace, re-exported for frozen configs."""
    return dataclasses.replace(cfg, **changes)


def iter_fields(cls: type = Config, prefix: str = ""):
    """Yield (key, type name, default, help) for every leaf field: docs and --help."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}.{f.name}" if prefix else f.name
        if f.metadata.get("train_only") and prefix != "data.train":
            continue
        tp = hints[f.name]
        inner = [a for a in typing.get_args(tp) if a is not type(None)] if typing.get_origin(tp) in (typing.Union, types.UnionType) else [tp]
        if dataclasses.is_dataclass(inner[0]):
            yield key, "section", None, f.metadata.get("help", "")
            yield from iter_fields(inner[0], key)
            continue
        if f.default is not dataclasses.MISSING:
            default: Any = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = REQUIRED
        yield key, _type_name(tp), default, f.metadata.get("help", "")
