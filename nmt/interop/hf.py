"""Hugging Face MarianMT and M2M100/NLLB models <-> nmt Transformers: architecture and weights.

Reads a local model directory as transformers' `save_pretrained` writes it (config.json, then
model.safetensors, pytorch_model.bin, or their sharded `*.index.json` forms) without importing
transformers; tests/test_hf.py checks the result against transformers' own forward pass.

Families (`model_type` in config.json; NLLB checkpoints are `m2m_100`):
- `marian` (MarianMT, OPUS-MT): post-norm, no final norms, `positions: sinusoidal_halves`,
  `final_logits_bias` (`output_bias`), usually `swish` (= `silu`); separate vocabularies with
  `share_encoder_decoder_embeddings: false`.
- `m2m_100` (M2M100, NLLB): pre-norm with a final LayerNorm per stack, `sinusoidal_fairseq` whose
  first position is row pad_token_id + 1 (`position_offset`), no logits bias.
Both scale embeddings by sqrt(D) with `scale_embedding`. Embedding ties follow transformers 5:
`tie_word_embeddings` (the default) makes the embeddings and `lm_head` one matrix.

Weight names (HF -> nmt; nmt fuses q/k/v as rows q|k|v, cross-attention k/v as rows k|v):
`self_attn.{q,k,v}_proj` -> `self_attn.qkv_proj`, `encoder_attn.q_proj` -> `cross_attn.q_proj`,
`encoder_attn.{k,v}_proj` -> `cross_attn.kv_proj`, `*.out_proj` -> `*.out_proj`, `fc1/fc2` ->
`ffn.fc1/fc2`, `self_attn_layer_norm` -> `norm1`, `encoder_attn_layer_norm` -> `norm2` (decoder),
`final_layer_norm` -> `norm2` (encoder) / `norm3` (decoder), `model.{encoder,decoder}.layer_norm` ->
`{encoder,decoder}.final_norm`, `lm_head` -> `output_proj.weight`, `final_logits_bias[0]` ->
`output_proj.bias`. `weights_to_nmt` and `weights_to_hf` are inverse. The padding id is part of the
model (MarianMT: vocab_size - 1, M2M100: 1; `HFArchitecture.pad_id`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from nmt import textio
from nmt.config import ModelConfig
from nmt.errors import UserError

SUPPORTED = "marian (MarianMT, OPUS-MT) and m2m_100 (M2M100, NLLB)"
FAMILIES = ("marian", "m2m_100")
# In transformers' order of preference (modeling_utils: safetensors first).
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "silu", "silu": "silu"}  # transformers' ACT2FN name -> ours
# Static tables some checkpoints carry and transformers 5 ignores on load (non-persistent buffers in M2M100).
IGNORED_M2M100 = ("model.encoder.embed_positions.weights", "model.decoder.embed_positions.weights",
                  "model.encoder.embed_positions._float_tensor", "model.decoder.embed_positions._float_tensor")
MARIAN_POSITIONS = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")


@dataclass(frozen=True)
class HFArchitecture:
    """An HF model's architecture in nmt terms (what `Transformer(model, src_vocab_size, tgt_vocab_size,
    pad_id)` needs) plus the two HF settings that decide the embedding ties."""

    family: str  # "marian" | "m2m_100"
    model: ModelConfig
    src_vocab_size: int
    tgt_vocab_size: int
    pad_id: int
    tie_word_embeddings: bool = True
    share_encoder_decoder_embeddings: bool = True  # Marian's setting; always True for m2m_100


# --------------------------------------------------------------------------- reading a directory

def read_config(model_dir: str) -> dict[str, Any]:
    """config.json of a supported family; UserError (one line) otherwise."""
    if not os.path.isdir(model_dir):
        raise UserError(f"Hugging Face model directory not found: {model_dir}")
    path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(path):
        raise UserError(f"{model_dir} is not a Hugging Face model directory (no config.json)")
    config = textio.read_json(path)
    if not isinstance(config, dict):
        raise UserError(f"cannot read {path}: not a JSON object")
    family = config.get("model_type")
    if family not in FAMILIES:
        raise UserError(f"{path}: model_type {family!r} is not supported (supported: {SUPPORTED})")
    return config


def read_weights(model_dir: str) -> dict[str, Tensor]:
    """The state dict in the directory's weights file (or shards), on CPU, as stored."""
    name = next((n for n in WEIGHT_FILES if os.path.isfile(os.path.join(model_dir, n))), None)
    if name is None:
        raise UserError(f"{model_dir} has no weights file (looked for {', '.join(WEIGHT_FILES)})")
    path = os.path.join(model_dir, name)
    if not name.endswith(".index.json"):
        return _read_weights_file(path)
    try:
        with open(path, encoding="utf-8") as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise UserError(f"cannot read {path}: not a weights index ({type(e).__name__}: {e})") from None
    state: dict[str, Tensor] = {}
    for shard in shards:
        shard_path = os.path.join(model_dir, shard)
        if not os.path.isfile(shard_path):
            raise UserError(f"{path} names a missing shard {shard}")
        state.update(_read_weights_file(shard_path))
    return state


def _read_weights_file(path: str) -> dict[str, Tensor]:
    try:
        if path.endswith(".safetensors"):
            from safetensors.torch import load_file

            return load_file(path, device="cpu")
        state = torch.load(path, map_location="cpu", weights_only=True)
    except ImportError:
        raise UserError(f"reading {path} needs the safetensors package: pip install safetensors") from None
    except Exception as e:  # safetensors' SafetensorError, torch's RuntimeError/OSError/EOFError/pickle errors
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"cannot read weights {path}: truncated or not a weights file ({reason})") from None
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise UserError(f"cannot read weights {path}: not a state dict of tensors")
    return state


# --------------------------------------------------------------------------- architecture

def architecture(config: dict[str, Any]) -> HFArchitecture:
    """The nmt architecture of an HF config.json (a dict from `read_config`); UserError for settings
    nmt cannot represent."""
    c = _Settings(config)
    family = config["model_type"]
    heads = c.same("encoder_attention_heads", "decoder_attention_heads")
    ffn_dim = c.same("encoder_ffn_dim", "decoder_ffn_dim")
    d_model = c.int("d_model", minimum=4)
    activation = c.get("activation_function", "gelu" if family == "marian" else "relu")
    if activation not in ACTIVATIONS:
        raise UserError(f"config.json: activation_function {activation!r} is not supported "
                        f"(supported: {', '.join(ACTIVATIONS)})")
    if d_model % heads or d_model % 2:
        raise UserError(f"config.json: d_model={d_model} must be even and divisible by the {heads} heads")
    enc, dec = c.int("encoder_layers", minimum=1), c.int("decoder_layers", minimum=1)
    pad_id, vocab = c.int("pad_token_id"), c.int("vocab_size", minimum=1)
    tie = bool(c.get("tie_word_embeddings", True))
    common = dict(d_model=d_model, n_heads=heads, layers=enc, decoder_layers=None if dec == enc else dec,
                  ffn_dim=ffn_dim, activation=ACTIVATIONS[activation], dropout=c.rate("dropout", 0.1),
                  attention_dropout=c.rate("attention_dropout", 0.1 if family == "m2m_100" else 0.0),
                  activation_dropout=c.rate("activation_dropout", 0.0),
                  max_positions=c.int("max_position_embeddings", minimum=1), tie_output=tie,
                  scale_embeddings=bool(c.get("scale_embedding", family == "m2m_100")))
    if family == "m2m_100":
        model = ModelConfig(norm="pre", positions="sinusoidal_fairseq", position_offset=pad_id + 1,
                            share_embeddings=tie, output_bias=False, **common)
        return HFArchitecture(family, model, vocab, vocab, pad_id, tie, True)
    share = bool(c.get("share_encoder_decoder_embeddings", True))
    tgt_vocab = c.int("decoder_vocab_size") if c.get("decoder_vocab_size") is not None else vocab
    if share and tgt_vocab != vocab:
        raise UserError(f"config.json: decoder_vocab_size={tgt_vocab} differs from vocab_size={vocab} although "
                        "share_encoder_decoder_embeddings is true")
    model = ModelConfig(norm="post", positions="sinusoidal_halves", share_embeddings=share and tie,
                        output_bias=True, **common)
    return HFArchitecture(family, model, vocab, tgt_vocab, pad_id, tie, share)


class _Settings:
    """Typed reads of config.json values with one-line errors."""

    def __init__(self, config: dict[str, Any]):
        self.config = config

    def get(self, key: str, default: Any = None) -> Any:
        return self.config.get(key, default)

    def int(self, key: str, minimum: int = 0) -> int:
        value = self.config.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise UserError(f"config.json: {key} must be an integer >= {minimum}, got {value!r}")
        return value

    def rate(self, key: str, default: float) -> float:
        value = self.config.get(key, default)
        if not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise UserError(f"config.json: {key} must be a number in [0, 1], got {value!r}")
        return float(value)

    def same(self, enc_key: str, dec_key: str) -> int:
        a, b = self.int(enc_key, minimum=1), self.int(dec_key, minimum=1)
        if a != b:
            raise UserError(f"config.json: {enc_key}={a} and {dec_key}={b} must be equal "
                            "(nmt uses one value for both stacks)")
        return a


# --------------------------------------------------------------------------- weight names

def _layer_pairs(arch: HFArchitecture) -> list[tuple[str, list[str]]]:
    """(nmt name, HF names concatenated along dim 0) for every tensor but the embeddings and the
    output projection's weight."""
    pairs: list[tuple[str, list[str]]] = []
    m = arch.model
    for side, n_layers in (("encoder", m.n_encoder_layers), ("decoder", m.n_decoder_layers)):
        norms = ["self_attn_layer_norm", "final_layer_norm"] if side == "encoder" else \
            ["self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"]
        for i in range(n_layers):
            ours, hf = f"{side}.layers.{i}", f"model.{side}.layers.{i}"
            for p in ("weight", "bias"):
                pairs.append((f"{ours}.self_attn.qkv_proj.{p}", [f"{hf}.self_attn.{x}_proj.{p}" for x in "qkv"]))
                pairs.append((f"{ours}.self_attn.out_proj.{p}", [f"{hf}.self_attn.out_proj.{p}"]))
                if side == "decoder":
                    pairs.append((f"{ours}.cross_attn.q_proj.{p}", [f"{hf}.encoder_attn.q_proj.{p}"]))
                    pairs.append((f"{ours}.cross_attn.kv_proj.{p}", [f"{hf}.encoder_attn.{x}_proj.{p}" for x in "kv"]))
                    pairs.append((f"{ours}.cross_attn.out_proj.{p}", [f"{hf}.encoder_attn.out_proj.{p}"]))
                pairs += [(f"{ours}.ffn.{fc}.{p}", [f"{hf}.{fc}.{p}"]) for fc in ("fc1", "fc2")]
                pairs += [(f"{ours}.norm{j + 1}.{p}", [f"{hf}.{norm}.{p}"]) for j, norm in enumerate(norms)]
        if m.norm == "pre":
            pairs += [(f"{side}.final_norm.{p}", [f"model.{side}.layer_norm.{p}"]) for p in ("weight", "bias")]
    return pairs


def _embedding_groups(arch: HFArchitecture) -> list[tuple[list[str], list[str]]]:
    """(nmt names, HF names) of each distinct embedding/output matrix. The HF names of a group are one
    tied matrix in transformers; the first is the one `save_pretrained` writes."""
    enc, dec = "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"
    lm, shared = "lm_head.weight", "model.shared.weight"
    if arch.tie_word_embeddings and arch.share_encoder_decoder_embeddings:
        return [(["src_embed.weight", "tgt_embed.weight", "output_proj.weight"], [shared, enc, dec, lm])]
    if arch.tie_word_embeddings:  # Marian with separate vocabularies
        return [(["src_embed.weight"], [enc]), (["tgt_embed.weight", "output_proj.weight"], [dec, lm])]
    return [(["src_embed.weight"], [enc]), (["tgt_embed.weight"], [dec]), (["output_proj.weight"], [lm])]


def _unused_hf_names(arch: HFArchitecture) -> list[str]:
    """HF tensors that exist in the model but do not enter its forward pass (untied `model.shared`)."""
    return ["model.shared.weight"] if not arch.tie_word_embeddings and arch.share_encoder_decoder_embeddings else []


# --------------------------------------------------------------------------- mapping

def weights_to_nmt(hf_state: dict[str, Tensor], arch: HFArchitecture) -> dict[str, Tensor]:
    """HF state dict -> nmt state dict (float32; tied nmt names share one tensor). UserError when a
    weight is missing, tied copies differ, or a weight is left over."""
    used: set[str] = set()

    def take(name: str) -> Tensor:
        if name not in hf_state:
            raise UserError(f"the weights lack {name} (is it a {arch.family} checkpoint saved with save_pretrained?)")
        used.add(name)
        return hf_state[name].float()

    state = {ours: torch.cat([take(h) for h in hf]) if len(hf) > 1 else take(hf[0]) for ours, hf in _layer_pairs(arch)}
    for ours, hf in _embedding_groups(arch):
        tensor = _tied(hf_state, hf, arch.family)
        used.update(h for h in hf if h in hf_state)
        state.update({name: tensor for name in ours})
    if arch.family == "marian":
        state["output_proj.bias"] = take("final_logits_bias").reshape(-1)
        used.update(_check_marian_positions(hf_state, arch))
    else:
        used.update(h for h in IGNORED_M2M100 if h in hf_state)
    used.update(h for h in _unused_hf_names(arch) if h in hf_state)
    left = sorted(set(hf_state) - used)
    if left:
        shown = ", ".join(left[:5]) + (f" and {len(left) - 5} more" if len(left) > 5 else "")
        raise UserError(f"unexpected weight(s) {shown} for a {arch.family} model with this config.json")
    return state


def _tied(hf_state: dict[str, Tensor], names: list[str], family: str) -> Tensor:
    """The one matrix of a tied group: every copy present must be equal; at least one must be."""
    present = [n for n in names if n in hf_state]
    if not present:
        raise UserError(f"the weights lack {names[0]} (is it a {family} checkpoint saved with save_pretrained?)")
    first = hf_state[present[0]]
    for other in present[1:]:
        if hf_state[other].shape != first.shape or not torch.equal(hf_state[other], first):
            raise UserError(f"tied weights {present[0]} and {other} differ in the checkpoint "
                            "(config.json ties them: tie_word_embeddings)")
    return first.float()


def _check_marian_positions(hf_state: dict[str, Tensor], arch: HFArchitecture) -> list[str]:
    """Old Marian checkpoints store their (fixed) position tables: they must be the formula's."""
    from nmt.model.transformer import position_table

    present = [n for n in MARIAN_POSITIONS if n in hf_state]
    expected = position_table(arch.model) if present else None
    for name in present:
        table = hf_state[name].float()
        if table.shape != expected.shape or not torch.allclose(table, expected, atol=1e-5, rtol=0):
            raise UserError(f"{name} in the checkpoint is not MarianMT's sinusoidal table")
    return present


def weights_to_hf(state: dict[str, Tensor], arch: HFArchitecture) -> dict[str, Tensor]:
    """nmt state dict -> the tensors transformers' `save_pretrained` writes for this architecture
    (one name per tied matrix; Marian's fixed position tables left out, as transformers does).
    Contiguous copies, ready for safetensors."""
    out: dict[str, Tensor] = {}
    for ours, hf in _layer_pairs(arch):
        for name, chunk in zip(hf, state[ours].chunk(len(hf))):
            out[name] = chunk.detach().float().contiguous().clone()
    for ours, hf in _embedding_groups(arch):
        out[hf[0]] = state[ours[0]].detach().float().clone()
    for name in _unused_hf_names(arch):
        out[name] = state["src_embed.weight"].detach().float().clone()
    if arch.family == "marian":  # a model without output_bias has a zero bias
        bias = state.get("output_proj.bias", torch.zeros(arch.tgt_vocab_size))
        out["final_logits_bias"] = bias.detach().float().reshape(1, -1).clone()
    return out


# --------------------------------------------------------------------------- the other direction

def architecture_from_nmt(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int, pad_id: int) -> HFArchitecture:
    """The HF family that represents an nmt model (post-norm -> marian, pre-norm -> m2m_100);
    UserError naming the options it cannot represent. Ties nmt has and the family cannot express are
    written as equal copies (`weights_to_hf` reads every nmt name)."""
    if cfg.norm == "post":
        family, wanted = "marian", dict(positions="sinusoidal_halves", position_offset=0)
    else:
        family, wanted = "m2m_100", dict(positions="sinusoidal_fairseq", position_offset=pad_id + 1, output_bias=False)
    problems = [f"model.{k}={getattr(cfg, k)!r} (needs {v!r})" for k, v in wanted.items() if getattr(cfg, k) != v]
    if family == "m2m_100" and src_vocab_size != tgt_vocab_size:
        problems.append(f"separate vocabularies ({src_vocab_size} and {tgt_vocab_size}; M2M100 has one)")
    if problems:
        hint = ""
        if cfg.positions == "sinusoidal":  # nmt's default before `positions: null` chose the family's table
            hint = (" (the paper's interleaved table, nmt's default for models trained before the default became "
                    "the family's table: a model trained with `positions` and `position_offset` left out exports)")
        raise UserError(f"cannot represent this model as Hugging Face {family} ({cfg.norm}-norm): "
                        + "; ".join(problems) + hint)
    if family == "marian":  # every share/tie combination exists in MarianMT
        return HFArchitecture(family, cfg, src_vocab_size, tgt_vocab_size, pad_id, cfg.tie_output, cfg.share_embeddings)
    return HFArchitecture(family, cfg, src_vocab_size, tgt_vocab_size, pad_id,
                          cfg.share_embeddings and cfg.tie_output, True)


def config_to_hf(arch: HFArchitecture, token_ids: dict[str, Any]) -> dict[str, Any]:
    """config.json for `arch`. token_ids: pad_token_id, eos_token_id, decoder_start_token_id and
    optionally bos_token_id / forced_eos_token_id (the tokenizer's special ids)."""
    m = arch.model
    config = dict(
        model_type=arch.family, is_encoder_decoder=True, d_model=m.d_model,
        encoder_layers=m.n_encoder_layers, decoder_layers=m.n_decoder_layers,
        encoder_attention_heads=m.n_heads, decoder_attention_heads=m.n_heads,
        encoder_ffn_dim=m.ffn_dim, decoder_ffn_dim=m.ffn_dim,
        activation_function={"silu": "swish"}.get(m.activation, m.activation),
        dropout=m.dropout, attention_dropout=m.attention_dropout, activation_dropout=m.activation_dropout,
        encoder_layerdrop=0.0, decoder_layerdrop=0.0, max_position_embeddings=m.max_positions,
        scale_embedding=m.scale_embeddings, vocab_size=arch.src_vocab_size,
        tie_word_embeddings=arch.tie_word_embeddings, **token_ids)
    if arch.family == "marian":
        config.update(architectures=["MarianMTModel"], decoder_vocab_size=arch.tgt_vocab_size,
                      share_encoder_decoder_embeddings=arch.share_encoder_decoder_embeddings)
    else:
        config.update(architectures=["M2M100ForConditionalGeneration"])
    if config["pad_token_id"] != arch.pad_id:
        raise ValueError(f"pad_token_id {config['pad_token_id']} differs from the model's pad id {arch.pad_id}")
    return config


# --------------------------------------------------------------------------- import

def import_weights(model_dir: str):
    """(nmt Transformer in eval mode, HFArchitecture, config.json dict) of a local HF model directory."""
    from nmt.model.checkpoint import check_finite
    from nmt.model.transformer import Transformer

    config = read_config(model_dir)
    arch = architecture(config)
    hf_state = read_weights(model_dir)
    check_finite(hf_state, f"cannot import {model_dir}")
    state = weights_to_nmt(hf_state, arch)
    model = Transformer(arch.model, arch.src_vocab_size, arch.tgt_vocab_size, pad_id=arch.pad_id)
    expected = model.state_dict()
    for name, tensor in state.items():
        if tensor.shape != expected[name].shape:
            raise UserError(f"weights do not match config.json: {name} has shape {tuple(tensor.shape)}, "
                            f"the config gives {tuple(expected[name].shape)}")
    model.load_state_dict(state, strict=True)
    return model.eval(), arch, config

