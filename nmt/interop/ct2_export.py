"""The CTranslate2 writer of `nmt export` (nmt/commands/export.py): a model, its tokenizer and config -> a
CTranslate2 model directory (`write_export`); nmt/translation/ct2.py translates with the result.

The directory holds everything needed to translate without nmt or PyTorch:

    model.bin, config.json                 CTranslate2 weights and settings
    shared_vocabulary.json                 (or source_/target_vocabulary.json) SentencePiece pieces in id order
    spm.model | spm.src.model + spm.tgt.model   (an imported model: its own tokenizer files + hf_tokenizer.json)
    nmt_export.json                        the checkpoint's config (decode: `stopping: hf` becomes exact) and step
    langid.json                            the checkpoint's language identifier, if it has one (nmt evaluate)
    README.md                              how to load it

Mapping (our names -> CTranslate2's TransformerSpec, as its fairseq/OpenNMT-py converters):
- `src_embed` / `tgt_embed` -> `encoder.embeddings[0]` / `decoder.embeddings` (scaled by sqrt(D) with
  model.scale_embeddings); `output_proj` (and its bias) -> `decoder.projection`.
- Positions: always an explicit table (`position_encodings.encodings`, model.position_offset applied),
  since CTranslate2's built-in sinusoids are only the tensor2tensor variant.
- Activations: relu -> RELU, gelu (erf) -> GELU, silu -> SWISH.
- `self_attn.qkv_proj` (rows q|k|v) -> `self_attention.linear[0]`, `out_proj` -> `linear[1]`;
  `cross_attn.q_proj` -> `attention.linear[0]`, `kv_proj` (rows k|v) -> `linear[1]`,
  `out_proj` -> `linear[2]`; `ffn.fc1/fc2` -> `ffn.linear_0/linear_1`.
- Layer norms: encoder `norm1, norm2` -> `self_attention.layer_norm, ffn.layer_norm`; decoder
  `norm1, norm2, norm3` -> `self_attention`, `attention`, `ffn` `.layer_norm`; `final_norm` ->
  `layer_norm` (`pre_norm` as model.norm); our epsilon goes to `config.layer_norm_epsilon`.
- Sequences: sources are `pieces + </s>`; targets start with the tokenizer's start token
  (`decoder_start_token`) and end with `</s>`.

Every parameter must be consumed by the mapping, else the export refuses; options CTranslate2
cannot represent raise UserError naming the option.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import TYPE_CHECKING, Any

from nmt import textio
from nmt.errors import UserError
from nmt.interop.export_dir import (FORMAT, LANGID_FILE, METADATA_FILE, VERSION, check_output_dir,
                            require_ctranslate2, vocabularies)

if TYPE_CHECKING:
    import numpy as np

QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16", "float32")

# ModelConfig fields the mapping below knows (dropouts do not matter at inference). A field added
# later is refused unless it keeps its default value.
KNOWN_FIELDS = frozenset({
    "d_model", "n_heads", "layers", "encoder_layers", "decoder_layers", "ffn_dim", "activation", "norm",
    "dropout", "attention_dropout", "activation_dropout", "positions", "position_offset", "max_positions",
    "share_embeddings", "tie_output", "scale_embeddings", "output_bias"})

CT2_ACTIVATIONS = {"relu": "RELU", "gelu": "GELU", "silu": "SWISH"}  # ours -> ctranslate2.specs.common_spec.Activation

# Values of our ModelConfig fields that CTranslate2's TransformerSpec can represent.
SUPPORTED_OPTIONS = {
    "activation": tuple(CT2_ACTIVATIONS),  # gelu = exact erf GELU (PyTorch's F.gelu default) = Activation.GELU
    "norm": ("pre", "post"),
    "positions": ("sinusoidal", "sinusoidal_halves", "sinusoidal_fairseq", "learned"),
}


def check_exportable(model_cfg) -> None:
    """UserError naming every `model.*` option CTranslate2 cannot represent."""
    problems = []
    for f in dataclasses.fields(model_cfg):
        value = getattr(model_cfg, f.name)
        if f.name not in KNOWN_FIELDS and f.default is not dataclasses.MISSING and value != f.default:
            problems.append(f"model.{f.name}={value!r} (an option the exporter does not know; default {f.default!r})")
    for key, allowed in SUPPORTED_OPTIONS.items():
        value = getattr(model_cfg, key)
        if value not in allowed:
            problems.append(f"model.{key}={value!r} (CTranslate2 supports {', '.join(allowed)})")
    if problems:
        raise UserError("cannot export to CTranslate2: unsupported " + "; ".join(problems))


# --------------------------------------------------------------------------- weights -> spec

class _Weights:
    """The model's tensors as float32 numpy arrays; remembers which names were used."""

    def __init__(self, model):
        # Copies: CTranslate2's quantization works in place on the arrays it is given, and
        # .numpy() of an fp32 CPU tensor shares the parameter's memory.
        self.arrays = {k: v.detach().float().cpu().numpy().copy() for k, v in model.state_dict().items()}
        self.used: set[str] = set()

    def __call__(self, name: str) -> np.ndarray:
        if name not in self.arrays:
            raise UserError(f"cannot export to CTranslate2: the checkpoint has no parameter {name!r} "
                            "(is it an nmt Transformer checkpoint?)")
        self.used.add(name)
        return self.arrays[name]

    def check_all_used(self) -> None:
        left = sorted(set(self.arrays) - self.used)
        if left:
            shown = ", ".join(left[:5]) + (f" and {len(left) - 5} more" if len(left) > 5 else "")
            raise UserError(f"cannot export to CTranslate2: no mapping for parameter(s) {shown} "
                            "(an architecture option the exporter does not know)")


def _linear(spec, w: _Weights, name: str) -> None:
    spec.weight = w(f"{name}.weight")
    if f"{name}.bias" in w.arrays:
        spec.bias = w(f"{name}.bias")


def _norm(spec, w: _Weights, name: str) -> None:
    spec.gamma = w(f"{name}.weight")
    spec.beta = w(f"{name}.bias")


def _self_attention(spec, w: _Weights, layer: str) -> None:
    """An encoder or decoder layer's self-attention (fused q/k/v) and the norm before or after it."""
    _linear(spec.linear[0], w, f"{layer}.self_attn.qkv_proj")
    _linear(spec.linear[1], w, f"{layer}.self_attn.out_proj")
    _norm(spec.layer_norm, w, f"{layer}.norm1")


def _ffn(spec, w: _Weights, layer: str, norm: str) -> None:
    """A layer's feed-forward block and its norm (`norm`: norm2 in the encoder, norm3 in the decoder)."""
    _linear(spec.linear_0, w, f"{layer}.ffn.fc1")
    _linear(spec.linear_1, w, f"{layer}.ffn.fc2")
    _norm(spec.layer_norm, w, f"{layer}.{norm}")


def _layer_norm_epsilon(model) -> float:
    """The one epsilon of all LayerNorms (CTranslate2 has a single setting)."""
    import torch

    norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    eps = {m.eps for m in norms}
    if len(eps) > 1:
        raise UserError(f"cannot export to CTranslate2: layer norms use different epsilons {sorted(eps)}")
    if any(not m.elementwise_affine or m.bias is None for m in norms):
        raise UserError("cannot export to CTranslate2: layer norms without weight and bias are not supported")
    return eps.pop() if eps else 1e-5


def _position_table(model, w: _Weights, side: str) -> np.ndarray:
    """[max_positions, D] rows added to the embeddings of positions 0, 1, ..."""
    if model.cfg.positions == "learned":
        return w(f"{side}_positions.weight")
    return model.sinusoids.detach().float().cpu().numpy().copy()


def build_spec(model, tokenizer, cfg):
    """A validated-to-be-complete CTranslate2 `TransformerSpec` for our Transformer.

    model: nmt.model.transformer.Transformer (any device); tokenizer: either family (nmt.text.tokens.TokenizerLike); cfg: Config.
    """
    require_ctranslate2()
    from ctranslate2.specs import common_spec, transformer_spec

    m = cfg.model
    check_exportable(m)
    activation = getattr(common_spec.Activation, CT2_ACTIVATIONS[m.activation])
    spec = transformer_spec.TransformerSpec.from_config(
        (m.n_encoder_layers, m.n_decoder_layers), m.n_heads, pre_norm=m.norm == "pre", activation=activation)
    w = _Weights(model)
    scale = float(model.embed_scale)

    enc = spec.encoder
    enc.embeddings[0].weight = w("src_embed.weight")
    enc.scale_embeddings = scale
    enc.position_encodings.encodings = _position_table(model, w, "src")
    for i, layer in enumerate(enc.layer):
        _self_attention(layer.self_attention, w, f"encoder.layers.{i}")
        _ffn(layer.ffn, w, f"encoder.layers.{i}", "norm2")

    dec = spec.decoder
    dec.embeddings.weight = w("tgt_embed.weight")
    dec.scale_embeddings = scale
    dec.position_encodings.encodings = _position_table(model, w, "tgt")
    for i, layer in enumerate(dec.layer):
        p = f"decoder.layers.{i}"
        _self_attention(layer.self_attention, w, p)
        _linear(layer.attention.linear[0], w, f"{p}.cross_attn.q_proj")
        _linear(layer.attention.linear[1], w, f"{p}.cross_attn.kv_proj")
        _linear(layer.attention.linear[2], w, f"{p}.cross_attn.out_proj")
        _norm(layer.attention.layer_norm, w, f"{p}.norm2")
        _ffn(layer.ffn, w, p, "norm3")
    _linear(dec.projection, w, "output_proj")
    if m.norm == "pre":
        _norm(enc.layer_norm, w, "encoder.final_norm")
        _norm(dec.layer_norm, w, "decoder.final_norm")
    w.check_all_used()
    _set_vocabularies(spec, tokenizer)
    spec.config.layer_norm_epsilon = _layer_norm_epsilon(model)
    return spec


def _set_vocabularies(spec, tokenizer) -> None:
    """The spec's vocabularies and its special pieces, from the tokenizer."""
    src_pieces, tgt_pieces = vocabularies(tokenizer)
    spec.register_source_vocabulary(src_pieces)
    spec.register_target_vocabulary(tgt_pieces)
    c, ids = spec.config, tokenizer.specials  # nmt's own: unk 1, <s> 2 = start, </s> 3; imported: their own
    c.unk_token, c.eos_token = tgt_pieces[ids.unk], tgt_pieces[ids.eos]
    c.decoder_start_token = tgt_pieces[ids.start]  # MarianMT: <pad>; M2M100/NLLB: </s>
    c.bos_token = "<s>" if "<s>" in tgt_pieces else c.decoder_start_token
    c.add_source_bos, c.add_source_eos = False, True


# --------------------------------------------------------------------------- writing

def _converter_class():
    """A ctranslate2 Converter whose `_load` returns a prepared spec (built on first use:
    the base class lives in the optional package)."""
    from ctranslate2.converters import Converter

    class NmtConverter(Converter):
        """Converts an nmt Transformer (already loaded) to a CTranslate2 model directory."""

        def __init__(self, model, tokenizer, cfg):
            self._args = (model, tokenizer, cfg)

        def _load(self):
            return build_spec(*self._args)

    return NmtConverter


README = """# CTranslate2 model exported by nmt

Source checkpoint: `{checkpoint}` (step {step}); weights: {quantization}.
Architecture: {layers} layers, d_model {d_model}, {heads} heads, {norm}-norm, {activation}, {positions} positions.

With nmt:

    nmt translate --engine ctranslate2 --model {name} -i input.txt -o output.txt

With CTranslate2 and SentencePiece only (sources get `</s>` appended by the model config;
pass the pieces, not ids):

```python
import ctranslate2, sentencepiece as spm
sp_src = spm.SentencePieceProcessor(model_file="{name}/{src_spm}")
sp_tgt = spm.SentencePieceProcessor(model_file="{name}/{tgt_spm}")
translator = ctranslate2.Translator("{name}", device="cpu")
pieces = sp_src.encode(["a source sentence"], out_type=str)
results = translator.translate_batch(pieces, beam_size=5, max_decoding_length={max_len},
                                     min_decoding_length=0, suppress_sequences=[["<pad>"], ["<s>"]])
print(sp_tgt.decode(results[0].hypotheses[0]))
```

`max_decoding_length` must stay below the model's {max_positions} positions. `{meta}` keeps the
checkpoint's config (its `decode` section gives nmt's default search settings; nmt ranks beam
hypotheses with its own length penalty, see nmt/translation/ct2.py).
"""


def ct2_decode(decode) -> tuple[Any, str | None]:
    """The decode defaults an export writes for the ctranslate2 engine, and a note when they differ from
    the checkpoint's: `stopping: hf` (transformers' heuristic, an imported model's) cannot be searched by
    CTranslate2 with a length penalty (nmt/translation/engine.py `check_decode`), so the export says `exact`; and
    `contrast_lang` (a decoder per contrast language in step) is left out: the export searches without it."""
    notes = []
    if (decode.contrast.lang or "").strip():
        decode = dataclasses.replace(decode, contrast=dataclasses.replace(decode.contrast, lang=None))
        notes.append("decode.contrast.lang (language-contrastive decoding) has no CTranslate2 counterpart: the "
                     "export's decode defaults leave it out (translate with the checkpoint to use it)")
    if decode.stopping == "hf" and decode.length_penalty_type != "none" and decode.length_penalty:  # (greedy too: --beam)
        decode = dataclasses.replace(decode, stopping="exact")
        notes.append("decode.stopping hf (transformers' heuristic stop) has no CTranslate2 counterpart with a length "
                     "penalty: the export's decode defaults say stopping exact (translate with the checkpoint for the "
                     "heuristic)")
    return decode, "; ".join(notes) or None


def write_export(model, tokenizer, cfg, output_dir: str, *, quantization: str | None = None,
                 force: bool = False, checkpoint: str = "", step: int | None = None, langid: dict | None = None) -> str:
    """Write the CTranslate2 directory for (model, tokenizer, cfg); returns `output_dir`. Built next to it
    and renamed into place (`textio.atomic_dir`); with `force` only an earlier nmt export (or an empty
    directory) is replaced."""
    require_ctranslate2()
    from nmt.config import to_dict

    if quantization is not None and quantization not in QUANTIZATIONS:
        raise UserError(f"unknown quantization {quantization!r} (choose from {', '.join(QUANTIZATIONS)})")
    check_output_dir(output_dir, force)
    check_exportable(cfg.model)
    from nmt.model.checkpoint import check_finite  # (torch: imported with the model)

    check_finite(model.state_dict(), "cannot export to CTranslate2")
    with textio.atomic_dir(output_dir, what="export") as tmp:
        _converter_class()(model, tokenizer, cfg).convert(tmp, quantization=quantization, force=True)
        tokenizer.save(tmp)
        meta = {"format": FORMAT, "version": VERSION, "checkpoint": os.path.basename(checkpoint),
                "step": step, "quantization": quantization or "float32", "joint": tokenizer.joint,
                "max_positions": cfg.model.max_positions,
                "config": to_dict(dataclasses.replace(cfg, decode=ct2_decode(cfg.decode)[0])),
                "languages": tokenizer.languages, "default_tgt_lang": tokenizer.default_tgt_lang}
        with open(os.path.join(tmp, METADATA_FILE), "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=2)
        if langid is not None:  # for nmt evaluate's off-target count
            with open(os.path.join(tmp, LANGID_FILE), "w", encoding="utf-8") as f:
                json.dump(langid, f, ensure_ascii=False)
        with open(os.path.join(tmp, "README.md"), "w", encoding="utf-8") as f:
            f.write(_readme(cfg.model, tokenizer, output_dir, quantization, checkpoint, step))
    return output_dir


def _readme(m, tokenizer, output_dir: str, quantization: str | None, checkpoint: str, step: int | None) -> str:
    """The export's README.md (model.* settings `m`)."""
    return README.format(
        checkpoint=checkpoint or "(in memory)", step=step, quantization=quantization or "float32",
        layers=f"{m.n_encoder_layers}+{m.n_decoder_layers}", d_model=m.d_model, heads=m.n_heads,
        norm=m.norm, activation=m.activation, positions=m.positions, name=os.path.basename(os.path.normpath(output_dir)),
        meta=METADATA_FILE, max_len=min(256, m.max_positions - 1), max_positions=m.max_positions,
        **_spm_names(tokenizer))


def _spm_names(tokenizer) -> dict[str, str]:
    """The SentencePiece files the export README names (an imported tokenizer keeps its own file names;
    an M2M100/NLLB model also needs its language tokens: source first, target as target_prefix)."""
    names = {"marian": ("source.spm", "target.spm"), "m2m100": ("sentencepiece.bpe.model",) * 2,
             "nllb": ("sentencepiece.bpe.model",) * 2}.get(tokenizer.kind)
    if names is None:
        names = ("spm.model",) * 2 if tokenizer.joint else ("spm.src.model", "spm.tgt.model")
    return {"src_spm": names[0], "tgt_spm": names[1]}
