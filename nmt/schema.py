"""The config schema: typed, frozen dataclasses, one per section, with help text and ranges.

A config file has the sections `data`, `model`, `train`, `decode` and the top-level keys
`name`, `seed`, `output_dir`. Every field carries its help text in `metadata["help"]` (and
a numeric range in `min`/`max`); configs/README.md and the command-line help are generated
from it, so the documentation cannot drift from the code. Loading and checking a config:
nmt/config.py (which re-exports these names). Importable without torch.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Optional


class ConfigError(ValueError):
    """Invalid configuration. `errors` holds one message per problem."""

    def __init__(self, errors: list[str] | str):
        self.errors = [errors] if isinstance(errors, str) else list(errors)
        super().__init__("; ".join(self.errors))


def _f(default: Any, help: str, *, min: float | None = None, max: float | None = None,
       exclusive_min: bool = False, exclusive_max: bool = False, train_only: bool = False) -> Any:
    """A dataclass field with help text and an optional numeric range (`train_only`: documented under
    `data.train` only)."""
    meta = {"help": help, "min": min, "max": max, "exclusive_min": exclusive_min, "exclusive_max": exclusive_max,
            "train_only": train_only}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


REQUIRED: Any = dataclasses.MISSING


def _req(help: str) -> Any:
    return field(metadata={"help": help, "min": None, "max": None, "exclusive_min": False})


# --------------------------------------------------------------------------- data

@dataclass(frozen=True)
class CorpusConfig:
    """One parallel corpus: two text files (`src`, `tgt`: plain or .gz, a sentence a line), or a Hugging Face
    `datasets` source (`hf_path`: a hub name, a `save_to_disk` directory, or `json`/`csv`/`parquet` with
    `hf_data_files`; `translation[lang]` fields by default, else `src_field`/`tgt_field`)."""

    src: Optional[str] = _f(None, "Source-language text file (plain or .gz), one sentence per line.")
    tgt: Optional[str] = _f(None, "Target-language text file, line-aligned with `src`.")
    hf_path: Optional[str] = _f(None, "Hugging Face dataset: hub name, `save_to_disk` directory, or `json`/`csv`/`parquet` with `hf_data_files`.")
    hf_name: Optional[str] = _f(None, "Dataset configuration name (e.g. `de-en` for wmt14).")
    hf_split: str = _f("train", "Dataset split to read.")
    hf_data_files: Optional[list[str]] = _f(None, "Local data files for the `json`/`csv`/`parquet` builders.")
    src_field: Optional[str] = _f(None, "Column holding the source sentence; default `translation[src_lang]`. A dotted path like `translation.de` also works.")
    tgt_field: Optional[str] = _f(None, "Column holding the target sentence; default `translation[tgt_lang]`.")
    max_sentences: Optional[int] = _f(None, "Read at most this many pairs (the first N); null = all.", min=1)
    weight: float = _f(1.0, "Sampling share per epoch (training corpora only): a direction's corpora give weight / (sum of their weights) of its pairs; whole passes, then a seeded random subset. 0 = not used.", min=0.0, train_only=True)
    src_tag: Optional[str] = _f(None, "A tag `<NAME>` put before every non-empty source sentence of this corpus, e.g. `<BT>` for back-translated data (training corpora only); always one token.", train_only=True)
    src_lang: Optional[str] = _f(None, "Source language of this corpus (default `data.src_lang`), also the key of a Hugging Face `translation` dict; an M2M100/NLLB model puts its token before each source.")
    tgt_lang: Optional[str] = _f(None, "Target language of this corpus (default `data.tgt_lang`). Several target languages make a multilingual model, with a language token forced first (`--tgt-lang`).")

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
    add_pieces: int = _f(0, "With `data.add_languages`: add at most this many SentencePiece pieces trained on the new languages' text to the vocabulary; existing ids stay. 0 = no growth.", min=0)


@dataclass(frozen=True)
class DataConfig:
    src_lang: str = _req("Source language code, e.g. `es`.")
    tgt_lang: str = _req("Target language code, e.g. `en`.")
    train: Optional[CorpusConfig | list[CorpusConfig]] = _f(None, "Training corpus, or a list of corpora mixed by their `weight` and `data.sampling_temperature`. Required to train (null only in a checkpoint written by `nmt import`).")
    valid: Optional[CorpusConfig | list[CorpusConfig]] = _f(None, "Validation corpus, or a list (e.g. one per direction): each is scored on its own and their mean is the validation metric. Required to train (null only when imported).")
    test: Optional[CorpusConfig] = _f(None, "Test corpus (optional; used by recipes and docs).")
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig, metadata={"help": "SentencePiece settings."})
    max_len: int = _f(256, "Drop training pairs with more than this many subword tokens on either side (BOS/EOS not counted).", min=1)
    max_ratio: float = _f(3.0, "Drop training pairs whose token-length ratio (longer/shorter) exceeds this.", min=1.0)
    drop_identical: bool = _f(False, "Drop training pairs whose target is the source as written (whitespace aside): untranslated messages, names, commands, which teach copying. Validation pairs are kept.")
    batch_tokens: int = _f(4096, "Token budget per batch: B x max(S, T) <= batch_tokens, i.e. neither the padded source tensor nor the padded target tensor holds more than this many positions (fairseq's --max-tokens).", min=1)
    max_batch_size: int = _f(0, "Cap on sentences per batch; 0 = no cap.", min=0)
    protect: bool = _f(False, "Replace protected spans (`%s`, `{0}`, markup, `&amp;`: nmt/text/protect.py) in training and validation pairs by `<ph_K>` symbols the model learns to copy. Translate with `--protect`.")
    sampling_temperature: float = _f(1.0, "Temperature T of the mix between directions: a direction's share grows as (its pairs)^(1/T) times its corpora's mean weight. 1 = by size; larger T flattens toward small ones.", min=0.0, exclusive_min=True)
    langid: Optional[bool] = _f(None, "Train a character n-gram language identifier on the training corpora and keep it in the checkpoints: validation and `nmt evaluate` count off-target outputs. null = if multilingual.")
    protect_inject: float = _f(0.2, "With protect: the share of training pairs without protected spans that get placeholders at aligned positions, so that copying is learned anyway. 0 = off.", min=0.0, max=1.0)
    terms: float = _f(0.0, "Train-time terminology (Dinu et al., 2019): the share of pairs with a dictionary term whose source gets it inline, `src <term> tgt </term>`, for `--glossary`. 0 = off; e.g. 0.5.", min=0.0, max=1.0)
    term_dictionary: Optional[str] = _f(None, "With `data.terms`: the term dictionary, a TSV file (source term, tab, target term). null = extracted from each training corpus (nmt/text/terms.py).")
    term_identical: bool = _f(False, "With `data.terms` and an extracted dictionary: also annotate words translated by themselves (names, identifiers). false = leave them out: a model copies them anyway.")
    add_languages: dict[str, Optional[str]] = _f({}, "With `train.init_from`: languages the model does not know, as new code -> the language whose token initialises the new one's (null = the mean), e.g. `{it: es}`.")
    replay_share: float = _f(0.25, "With `data.add_languages`: the least share of each epoch's pairs that the corpora without a new language (the old directions' replay) get together. 0 = the weights alone.", min=0.0, max=1.0, exclusive_max=True)
    prefetch: int = _f(2, "Training steps whose batches a background thread collates (and pins on a GPU) ahead of the running step; 0 = collate in the training loop. The batches are the same.", min=0)
    pool_size: int = _f(0, "Length bucketing pool: pairs are shuffled, then sorted by length inside pools of this many pairs; 0 = one pool per epoch (least padding).", min=0)
    length_buckets: list[int] = _f([], "Pad each training batch to the smallest of these lengths that holds it, and its rows to the budget's, so batches take a few shapes (`train.compile`: static graphs, CUDA graphs). [] = off.")
    same_source_length: bool = _f(False, "Batch only pairs whose sources have one length: no source padding, so attention runs without a mask (flash kernels on a GPU).")
    collate: Literal["host", "device"] = _f("host", "Where training batches are padded: `host` (numpy, in the prefetch thread) or `device` (tokens copied flat, padded there). The same batches.")

    @property
    def train_corpora(self) -> tuple[CorpusConfig, ...]:
        """`train` as a tuple, whether the config gives one corpus or a list."""
        if self.train is None:
            return ()
        return tuple(self.train) if isinstance(self.train, list) else (self.train,)

    def train_key(self, i: int) -> str:
        """The config key of training corpus i: `data.train` or `data.train[i]`."""
        return f"data.train[{i}]" if isinstance(self.train, list) else "data.train"

    @property
    def valid_corpora(self) -> tuple[CorpusConfig, ...]:
        """`valid` as a tuple, whether the config gives one corpus or a list."""
        if self.valid is None:  # an imported checkpoint's config
            return ()
        return tuple(self.valid) if isinstance(self.valid, list) else (self.valid,)

    def valid_key(self, i: int) -> str:
        """The config key of validation corpus i: `data.valid` or `data.valid[i]`."""
        return f"data.valid[{i}]" if isinstance(self.valid, list) else "data.valid"

    def langs(self, corpus: CorpusConfig) -> tuple[str, str]:
        """(source, target) language of a corpus: its own, else data.src_lang / data.tgt_lang."""
        return corpus.src_lang or self.src_lang, corpus.tgt_lang or self.tgt_lang

    @property
    def target_languages(self) -> tuple[str, ...]:
        """The distinct target languages of the training corpora, in order of first use."""
        return tuple(dict.fromkeys(self.langs(c)[1] for c in self.train_corpora))

    @property
    def multilingual(self) -> bool:
        """True when the training corpora have more than one target language (a language token each).
        One target language with several source languages is a bilingual-style model: no token."""
        return len(self.target_languages) > 1


TAG_FORMAT = re.compile(r"<[A-Za-z0-9_.\-]+>")
LANG_FORMAT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_\-]*")  # language codes: `de`, `pt_BR`, `zh-TW`, `deu_Latn`
RESERVED_TAGS = ("<pad>", "<unk>", "<s>", "</s>")
MAX_SPANS = 16  # protected spans per line (data.protect, decode.protect)
PLACEHOLDERS = tuple(f"<ph_{k}>" for k in range(MAX_SPANS))  # their SentencePiece symbols (nmt/text/protect.py)
TERM_START, TERM_END = "<term>", "</term>"
TERM_SYMBOLS = (TERM_START, TERM_END)  # a term's markers (data.terms: nmt/text/terms.py)


# --------------------------------------------------------------------------- model

@dataclass(frozen=True)
class ModelConfig:
    d_model: int = _f(512, "Model (embedding) dimension.", min=1)
    n_heads: int = _f(8, "Attention heads; must divide d_model.", min=1)
    layers: int = _f(6, "Layers in each stack, unless encoder_layers / decoder_layers say otherwise.", min=1)
    encoder_layers: Optional[int] = _f(None, "Encoder layers (default: `layers`).", min=1)
    decoder_layers: Optional[int] = _f(None, "Decoder layers (default: `layers`).", min=1)
    ffn_dim: int = _f(2048, "Inner dimension of the position-wise feed-forward network.", min=1)
    activation: Literal["relu", "gelu", "silu"] = _f("relu", "Feed-forward activation: `gelu` is the exact (erf) GELU; `silu` = swish, x * sigmoid(x) (Marian's `swish`).")
    norm: Literal["pre", "post"] = _f("pre", "`pre`: layer norm before each sublayer plus a final norm per stack; `post`: the paper's norm after each residual.")
    dropout: float = _f(0.1, "Dropout on embeddings, sublayer outputs and residuals.", min=0.0, max=1.0)
    attention_dropout: float = _f(0.0, "Dropout on attention weights.", min=0.0, max=1.0)
    activation_dropout: float = _f(0.0, "Dropout after the feed-forward activation.", min=0.0, max=1.0)
    positions: Optional[Literal["sinusoidal", "sinusoidal_halves", "sinusoidal_fairseq", "learned"]] = _f(None, "Positional encoding: `sinusoidal` (the paper's), `sinusoidal_halves` (MarianMT), `sinusoidal_fairseq` (M2M100/NLLB) or `learned`; null = M2M100's with pre-norm, MarianMT's with post-norm.")
    position_offset: Optional[int] = _f(None, "Sinusoidal tables: position p (from 0) uses row p + position_offset (2 in an imported M2M100); 0 with learned positions. null = 1 with `sinusoidal_fairseq`, else 0.", min=0)
    max_positions: int = _f(1024, "Longest sequence the model accepts (positions table size).", min=1)
    share_embeddings: bool = _f(True, "Share source and target embeddings (requires `data.tokenizer.joint`).")
    tie_output: bool = _f(True, "Tie the output projection to the target embedding.")
    scale_embeddings: bool = _f(True, "Multiply token embeddings by sqrt(d_model) before adding positions "
                                "(Hugging Face's `scale_embedding`).")
    output_bias: bool = _f(False, "A bias on the output projection, added to the logits (MarianMT's "
                           "`final_logits_bias`).")

    def __post_init__(self) -> None:
        """Resolve the null defaults of `positions` and `position_offset` (see their help): a ModelConfig
        always holds concrete values, and so does every config a checkpoint stores."""
        if self.positions is None:
            object.__setattr__(self, "positions", "sinusoidal_fairseq" if self.norm == "pre" else "sinusoidal_halves")
        if self.position_offset is None:
            object.__setattr__(self, "position_offset", 1 if self.positions == "sinusoidal_fairseq" else 0)

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
    schedule: Literal["inverse_sqrt", "noam", "cosine", "linear", "constant"] = _f("inverse_sqrt", "Learning-rate schedule after a linear warmup: inverse_sqrt lr*sqrt(warmup/step); noam lr*d_model^-0.5*min(step^-0.5, step*warmup^-1.5); cosine/linear: decay to `min_lr`.")
    warmup_steps: int = _f(4000, "Linear warmup, in optimizer steps; must be below max_steps when that is set. With schedule_clock: time, give the warmup as warmup_fraction instead (or 0).", min=0)
    decay_fraction: float = _f(1.0, "cosine/linear: the share of the budget (after warmup) at the end over which the lr decays to min_lr; before it the lr stays at its peak (warmup-stable-decay). 1 = decay all the way.", min=0.0, max=1.0, exclusive_min=True)
    warmup_fraction: float = _f(0.0, "If > 0 (and < 1): the warmup is this share of the budget (max_steps, or max_time with schedule_clock: time; one of them must be set) instead of warmup_steps.", min=0.0, max=1.0, exclusive_max=True)
    schedule_clock: Literal["steps", "time"] = _f("steps", "What the schedule follows: optimizer `steps`, or `time`: seconds trained out of `max_time` (cosine/linear reach min_lr as the time ends; not reproducible bit for bit).")
    min_lr: float = _f(0.0, "Final learning rate of the cosine/linear schedules.", min=0.0)
    label_smoothing: float = _f(0.1, "Label smoothing epsilon (PyTorch's formula: epsilon spread over all V classes).", min=0.0, max=1.0)
    clip_norm: float = _f(1.0, "Clip the gradient norm to this; 0 = no clipping.", min=0.0)
    update_freq: int = _f(1, "Gradient accumulation: batches per optimizer step.", min=1)
    loss_chunk: int = _f(0, "Compute the loss this many target tokens at a time (no [tokens, vocabulary] fp32 copy of the logits); 0 = all at once.", min=0)
    precision: Literal["auto", "fp32", "bf16", "fp16"] = _f("auto", "auto: bf16 autocast on GPUs that support it, else fp16 with a GradScaler; fp32 on CPU.")
    master_weights: bool = _f(False, "With bf16/fp16: the model's weights in that precision and fp32 master weights in the optimizer, instead of autocast (checkpoints stay fp32).")
    compile: bool = _f(False, "torch.compile each encoder/decoder layer and the loss (validation and decoding stay eager); costs compilation time at the start. For GPUs that Triton supports (slower on CPU).")
    max_steps: int = _f(0, "Stop after this many optimizer steps; 0 = no limit.", min=0)
    max_epochs: int = _f(0, "Stop after this many epochs; 0 = no limit.", min=0)
    max_time: float = _f(0.0, "Stop after this many seconds of wall clock; 0 = no limit.", min=0.0)
    valid_every: int = _f(1000, "Validate (and save) every this many steps (0 = by steps never; see valid_every_minutes); also at the end.", min=0)
    valid_every_minutes: float = _f(0.0, "Also validate (and save) whenever this many minutes of training passed since the last validation; 0 = off.", min=0.0)
    valid_bleu: bool = _f(True, "Greedy-decode the validation set for BLEU/chrF at each validation.")
    valid_max_sentences: int = _f(0, "Decode at most this many validation sentences for BLEU; 0 = all.", min=0)
    valid_tokenize: Literal["auto", "13a", "intl", "zh", "ja-mecab", "ko-mecab", "char", "none"] = _f("auto", "sacreBLEU tokenizer for validation BLEU, as `nmt evaluate --tokenize`. auto = from the target language: `ja-mecab` for Japanese, `zh` for Chinese, else `13a`.")
    num_samples: int = _f(3, "Sample translations shown at each validation.", min=0)
    metric: Literal["bleu", "chrf", "loss", "ppl"] = _f("bleu", "Validation metric that picks the best checkpoint and drives early stopping.")
    patience: int = _f(0, "Stop after this many validations without improvement; 0 = never.", min=0)
    save_every: int = _f(0, "Also save the latest checkpoint every this many steps; 0 = at validations only.", min=0)
    keep_last: int = _f(5, "Keep this many step checkpoints besides `latest.pt` and `best.pt`.", min=0)
    log_every: int = _f(100, "Log training statistics every this many steps.", min=1)
    max_nan_steps: int = _f(10, "Stop with an error when a log line finds this many non-finite losses in a row (or more).", min=1)
    device: str = _f("auto", "`auto` (CUDA if available), `cpu`, `cuda`, `cuda:N`.")
    init_from: Optional[str] = _f(None, "Start this NEW run from another run's checkpoint (fine-tuning): its weights and its tokenizer; the architecture and data.tokenizer must match it. Ignored by --resume.")
    init_reset: list[Literal["optimizer", "schedule", "counters"]] = _f(["optimizer", "schedule", "counters"], "With init_from, what starts fresh (leave an item out to carry it over): optimizer (Adam moments), schedule (its position), counters (the step count).")
    keep_best: int = _f(0, "Also keep the step checkpoints of the best this many validations (by `metric`), besides the last `keep_last`.", min=0)
    threads: int = _f(0, "CPU threads for torch; 0 = torch's default.", min=0)
    ema_decay: float = _f(0.0, "Decay of an exponential moving average of the weights (fairseq's ema_decay); validation and saved checkpoints use the average. 0 = off; e.g. 0.9999.", min=0.0, max=1.0, exclusive_max=True)
    tune_decode: bool = _f(False, "At the end of training, run `nmt tune` on the validation set with best.pt and write the chosen decode settings into it (up to tune_max_time seconds).")
    tune_max_time: float = _f(300.0, "Time budget of tune_decode, in seconds (the tuning stops early when the budget would be exceeded).", min=1.0)


# --------------------------------------------------------------------------- decode

MAX_BEAM = 1024  # the largest decode.beam_size (a beam of 10^9 asked for gigabytes a step and failed mid-search)


def max_finished(beam_size: int, patience: float) -> int:
    """Finished hypotheses after which beam search stops a sentence under `patience` > 0 (0 for
    patience 0: the exact stop only): CTranslate2's `std::round(float(beam_size) * patience)`, in
    float32 as it computes it (the product of two float32 values is exact in a Python float, then
    rounded to float32) and rounded half away from zero, so that both engines stop at the same count.
    A patience that rounds to 0 is refused by the config check (`nmt.config`)."""
    if patience <= 0:
        return 0
    import struct

    def f32(x: float) -> float:
        return struct.unpack("f", struct.pack("f", x))[0]
    return math.floor(f32(f32(float(beam_size)) * f32(patience)) + 0.5)


GLOSSARY_MARGIN = 6.0  # decode.glossary.margin's default (nmt.search.options.SearchOptions shares it)


@dataclass(frozen=True)
class SamplingConfig:
    method: Literal["none", "topk", "topp"] = _f("none", "Sample instead of searching (back-translation): `topk` or `topp` (nucleus); nbest samples per line; none = search.")
    topk: int = _f(10, "Tokens to sample each token from (method topk).", min=1)
    topp: float = _f(0.9, "Probability mass to sample each token from (method topp).", min=0.0, max=1.0, exclusive_min=True)
    temperature: float = _f(1.0, "Divides the log-probabilities before sampling: < 1 sharper, > 1 flatter.", min=0.0, exclusive_min=True)
    seed: int = _f(1, "With it, a line's samples depend only on the line and its line number.", min=0)


@dataclass(frozen=True)
class GlossaryConfig:
    constrain: Literal["always", "missing"] = _f("always", "Lines searched with their glossary terms as constraints: `always` every line with a term; `missing` those whose free output misses one.")
    margin: float = _f(GLOSSARY_MARGIN, "Beam search: a hypothesis tries a term's next token only within this many nats of its best token.", min=0.0)
    beam_size: Optional[int] = _f(None, "Beam size of the constrained search (at least nbest); null = beam_size. `nmt tune --glossary` chooses it.", min=1, max=MAX_BEAM)
    length_penalty: Optional[float] = _f(None, "Length penalty alpha of the constrained search; null = length_penalty. `nmt tune --glossary` chooses it.", min=0.0, max=10.0)


@dataclass(frozen=True)
class ContrastConfig:
    lang: Optional[str] = _f(None, "Contrastive decoding (multilingual models): languages the outputs must not be in, comma-separated; the target is left out.")
    weight: float = _f(0.1, "The weight of each contrast language; their sum must stay below 1.", min=0.0, max=1.0, exclusive_max=True)


@dataclass(frozen=True)
class DecodeConfig:
    beam_size: int = _f(5, "Beam size; 1 = greedy search.", min=1, max=MAX_BEAM)
    nbest: int = _f(1, "Hypotheses (or samples) to output per line, best first; at most beam_size.", min=1)
    length_penalty: float = _f(1.0, "Length penalty alpha (beam search).", min=0.0, max=10.0)
    length_penalty_type: Literal["gnmt", "average", "none"] = _f("gnmt", "gnmt: score / ((5+len)/6)^alpha; average: score / len^alpha; none: the log-probability.")
    patience: float = _f(0.0, "> 0: beam search also stops a sentence once round(beam_size * patience) hypotheses ended (fairseq: 1); 0 = `stopping` alone.", min=0.0, max=1000.0)
    stopping: Literal["exact", "hf"] = _f("exact", "`exact`: stop once no live beam can still win; `hf`: transformers' generate() rule (a heuristic with a length penalty).")
    max_len_a: float = _f(1.2, "Maximum output length = a * source length + b.", min=0.0)
    max_len_b: int = _f(10, "See max_len_a.", min=1)
    min_len: int = _f(0, "Minimum output length (EOS forbidden before it).", min=0)
    no_repeat_ngram: int = _f(0, "Forbid any n-gram of this many target tokens from occurring twice in an output; 0 = off.", min=0)
    batch_tokens: int = _f(8192, "Padded source tokens per translation batch, at most.", min=1)
    max_batch_size: int = _f(256, "Sentences per translation batch, at most.", min=1)
    workers: int = _f(0, "CPU: batches decoded at once (CTranslate2: replicas on any device); 0 = 2 with 2+ CPU threads, else 1.", min=0)
    precision: Literal["auto", "fp32", "bf16", "fp16", "int8"] = _f("auto", "Arithmetic, fixed when the model loads: fp32, bf16/fp16 (GPU), int8 (CPU); auto = fp32, or the CTranslate2 export's type.")
    protect: bool = _f(False, "Copy placeholders and markup (`%s`, `{0}`, `<b>`, `&amp;`, ...) exactly once; needs a model trained with data.protect.")
    protect_pattern: Optional[str] = _f(None, "An extra regular expression whose matches are protected too (with protect).")
    alignment: bool = _f(False, "Also output, after ` ||| `, the source token each output token attends to most (`src-tgt` subword indices).")
    tgt_lang: Optional[str] = _f(None, "Target language of a multilingual model, e.g. `de` or `deu_Latn` (its language token starts the output).")
    src_lang: Optional[str] = _f(None, "Source language of an imported M2M100/NLLB model; default: the model's data.src_lang.")
    sampling: SamplingConfig = field(default_factory=SamplingConfig, metadata={"help": "Sampling instead of search."})
    glossary: GlossaryConfig = field(default_factory=GlossaryConfig, metadata={"help": "The constrained search of lines with glossary terms (`--glossary`)."})
    contrast: ContrastConfig = field(default_factory=ContrastConfig, metadata={"help": "Language-contrastive decoding (Sennrich et al., 2024)."})


# The decode keys by their flat names (flags, `Translator` and `nmt serve` options, configs and checkpoints
# written before the sections): each name -> its (section, key).
DECODE_FLAT = {"sampling": ("sampling", "method"), "topk": ("sampling", "topk"), "topp": ("sampling", "topp"),
               "temperature": ("sampling", "temperature"), "seed": ("sampling", "seed"),
               "glossary_constrain": ("glossary", "constrain"), "glossary_margin": ("glossary", "margin"),
               "glossary_beam_size": ("glossary", "beam_size"), "glossary_length_penalty": ("glossary", "length_penalty"),
               "contrast_lang": ("contrast", "lang"), "contrast_weight": ("contrast", "weight")}
DECODE_REMOVED = {"glossary_annotate": False}  # removed keys: their old default is still accepted (and dropped)


def decode_value(decode: DecodeConfig, name: str) -> Any:
    """The value of the decode key with the flat name `name` (`decode_options`)."""
    if name in DECODE_FLAT:
        section, key = DECODE_FLAT[name]
        return getattr(getattr(decode, section), key)
    return getattr(decode, name)


def decode_options() -> list[tuple[str, dataclasses.Field, Any]]:
    """(flat name, field, type) of every decode key: the names of the flags, `Translator`'s and the
    server's options (a section's keys by their `DECODE_FLAT` name)."""
    hints, flat = typing.get_type_hints(DecodeConfig), {v: k for k, v in DECODE_FLAT.items()}
    out = []
    for f in dataclasses.fields(DecodeConfig):
        if dataclasses.is_dataclass(hints[f.name]):
            inner = typing.get_type_hints(hints[f.name])
            out += [(flat[(f.name, g.name)], g, inner[g.name]) for g in dataclasses.fields(hints[f.name])]
        else:
            out.append((f.name, f, hints[f.name]))
    return out


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


# --------------------------------------------------------------------------- documentation

def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return " | ".join(_type_name(a) for a in args) + " | null"
    if origin in (list, tuple):
        return str(tp).replace("typing.", "")
    if origin is dict:
        key, value = typing.get_args(tp)
        return f"mapping {_type_name(key)} -> {_type_name(value)}"
    if dataclasses.is_dataclass(tp):
        return "mapping"
    return getattr(tp, "__name__", str(tp))


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
