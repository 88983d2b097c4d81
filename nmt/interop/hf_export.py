"""The Hugging Face writer of `nmt export --format hf` (nmt/commands/export.py): an nmt model -> a Hugging Face
model directory (`write_hf`) that transformers' `AutoModelForSeq2SeqLM` and `AutoTokenizer` load and
whose `generate()` searches as `nmt translate` does.

- Family (nmt/interop/hf.py `architecture_from_nmt`): post-norm -> MarianMT (`positions:
  sinusoidal_halves`), pre-norm -> M2M100 (`sinusoidal_fairseq`, `position_offset` = pad id + 1, no
  output bias, one vocabulary); anything else is one line naming the options. nmt's defaults are
  these tables; models with the paper's interleaved sinusoids cannot be written.
- Tokenizer: an imported model gets its own files back (pieces and languages added by
  nmt/training/grow/ included). A model with nmt's SentencePiece models gets MarianTokenizer files
  for either family (source.spm, target.spm, vocab.json with every piece at its id), so the ids
  equal nmt's: source `pieces </s>`, no language token, decoder start `<s>`.
- generation_config.json from the decode section: num_beams; length_penalty (average: alpha; none:
  0; gnmt: alpha, noted); early_stopping "never" for the exact stop, false for `stopping: hf`, true
  for patience 1 (other values noted); bad_words_ids = the ids nmt never generates; max_length from
  max_len_b when max_len_a is 0, else max_positions (noted); no_repeat_ngram_size, min_length, and with
  either renormalize_logits (nmt renormalises over what they allow); forced_bos_token_id = a multilingual
  model's default target language.
"""

from __future__ import annotations

import json
import os

from nmt import textio
from nmt.errors import UserError
from nmt.interop.export_dir import METADATA_FILE, check_output_dir
from nmt.text.languages import target_languages

TOKENIZER_CLASS = {"marian": "MarianTokenizer", "m2m100": "M2M100Tokenizer", "nllb": "NllbTokenizer"}


def tokenizer_files(tokenizer, cfg) -> dict[str, bytes]:
    """The tokenizer files of the directory (with tokenizer_config.json)."""
    kind = tokenizer.kind
    d = cfg.data
    if kind == "spm":
        protos = tokenizer.to_bytes()
        src, tgt = tokenizer.vocab_pieces()
        files = {"source.spm": protos["src"], "target.spm": protos["src"] if tokenizer.joint else protos["tgt"],
                 "vocab.json": _json({p: i for i, p in enumerate(src)})}
        if not tokenizer.joint:
            files["target_vocab.json"] = _json({p: i for i, p in enumerate(tgt)})
        config = {"source_lang": d.src_lang, "target_lang": d.tgt_lang, "separate_vocabs": not tokenizer.joint}
        kind = "marian"
    else:
        files = dict(tokenizer.files)
        config = _imported_tokenizer_config(tokenizer, d, files)
    config.update(tokenizer_class=TOKENIZER_CLASS[kind], model_max_length=cfg.model.max_positions)
    files["tokenizer_config.json"] = _json(config)
    return files


def _imported_tokenizer_config(tokenizer, d, files: dict[str, bytes]) -> dict:
    if tokenizer.kind == "marian":
        return {"source_lang": d.src_lang, "target_lang": d.tgt_lang, "separate_vocabs": not tokenizer.joint}
    src, tgt = tokenizer.settings["src_lang"], target_languages(tokenizer).default
    if tokenizer.kind == "nllb":
        if "tokenizer.json" not in files:
            raise UserError("cannot export to Hugging Face: this NLLB tokenizer was imported without tokenizer.json, "
                            "which transformers 5 needs for NLLB's language codes (import the model again from a "
                            "directory that has it)")
        return {"src_lang": src, "tgt_lang": tgt, "legacy_behaviour": False}
    specials = [f"__{code}__" for code in tokenizer.languages]
    files["special_tokens_map.json"] = _json({"additional_special_tokens": specials})
    return {"src_lang": src, "tgt_lang": tgt, "language_codes": tokenizer.settings["language_codes"],
            "num_madeup_words": tokenizer.settings["num_madeup_words"], "additional_special_tokens": specials,
            **m2m100_added_tokens(tokenizer)}


def _json(value) -> bytes:
    return json.dumps(value, ensure_ascii=False, indent=1).encode("utf-8")


def token_ids(tokenizer) -> dict:
    """config.json's special ids: the tokenizer's; MarianMT imported with its forced EOS keeps it."""
    ids = tokenizer.specials
    out = dict(pad_token_id=ids.pad, eos_token_id=ids.eos, decoder_start_token_id=ids.start,
               bos_token_id=ids.start if ids.start != ids.eos else 0, forced_eos_token_id=None)
    if tokenizer.kind == "marian":
        out.update(bos_token_id=ids.eos, forced_eos_token_id=ids.eos)  # as OPUS-MT's conversions
    return out


def generation_config(decode, tokenizer, ids: dict, max_positions: int) -> tuple[dict, list[str]]:
    """generation_config.json for the checkpoint's decode section (module docstring), and notes."""
    notes = []
    forced_eos = ids["forced_eos_token_id"] is not None
    gen = {k: ids[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")}
    gen.update(num_beams=decode.beam_size, bad_words_ids=[[i] for i in tokenizer.specials.never_generated])
    if forced_eos:
        gen["forced_eos_token_id"] = ids["forced_eos_token_id"]
    if decode.max_len_a == 0:
        gen["max_length"] = min(decode.max_len_b, max_positions - 1) + 1 + (1 if forced_eos else 0)
    else:
        gen["max_length"] = max_positions
        notes.append(f"max length {decode.max_len_a:g} * source + {decode.max_len_b} has no counterpart: "
                     f"max_length {max_positions} written")
    if decode.beam_size > 1:
        kind, alpha = decode.length_penalty_type, decode.length_penalty
        from nmt.schema import max_finished

        # transformers' early_stopping True stops once num_beams hypotheses have finished: patience 1;
        # False is its heuristic (stopping hf), "never" its exact stop
        same_count = max_finished(decode.beam_size, decode.patience) == decode.beam_size
        stop = True if same_count else False if decode.stopping == "hf" else "never"
        gen.update(length_penalty=0.0 if kind == "none" else alpha, early_stopping=stop)
        if decode.patience and not same_count:
            notes.append(f"patience {decode.patience:g} has no counterpart: early_stopping {json.dumps(stop)} "
                         f"(stopping {decode.stopping}) written")
        if kind == "gnmt" and alpha:
            notes.append(f"the gnmt length penalty has no counterpart: length_penalty {alpha:g} (length ** alpha) written")
    if decode.no_repeat_ngram:
        gen["no_repeat_ngram_size"] = decode.no_repeat_ngram
    if decode.min_len:
        gen["min_length"] = decode.min_len + 1  # counts the decoder start
    if decode.no_repeat_ngram or decode.min_len:  # nmt removes what they forbid before the softmax (renormalised)
        gen["renormalize_logits"] = True
    languages = target_languages(tokenizer)
    if languages.multilingual and languages.default:
        gen["forced_bos_token_id"] = languages.tokens[languages.default]
    return gen, notes


def build_directory(model, tokenizer, cfg) -> tuple[dict[str, bytes], dict, list[str]]:
    """({file name: bytes} but the weights, the weights to save, notes) of the Hugging Face directory."""
    from nmt.interop.hf import architecture_from_nmt, config_to_hf, weights_to_hf

    from nmt.model.checkpoint import check_finite  # (torch: imported with the model)

    check_finite(model.state_dict(), "cannot export to Hugging Face")
    state, tokenizer = hf_numbering(model.state_dict(), tokenizer)  # (M2M100 pieces added by nmt/training/grow/)
    arch = architecture_from_nmt(cfg.model, model.src_embed.num_embeddings, model.tgt_embed.num_embeddings,
                                 tokenizer.specials.pad)
    kind = tokenizer.kind
    expected = {"marian": "marian", "m2m100": "m2m_100", "nllb": "m2m_100"}.get(kind, arch.family)
    if expected != arch.family:
        raise UserError(f"cannot export to Hugging Face: a {kind} tokenizer with a {arch.family} architecture")
    ids = token_ids(tokenizer)
    config = config_to_hf(arch, ids)
    if kind == "nllb":
        config["tokenizer_class"] = "NllbTokenizer"
    gen, notes = generation_config(cfg.decode, tokenizer, ids, cfg.model.max_positions)
    files = {"config.json": _json(config), "generation_config.json": _json(gen), **tokenizer_files(tokenizer, cfg)}
    return files, weights_to_hf(state, arch), notes


def require_safetensors() -> None:
    """UserError unless safetensors (transformers' weights format) is installed."""
    try:
        import safetensors.torch  # noqa: F401
    except ImportError:
        raise UserError("exporting to Hugging Face needs the safetensors package (transformers' weights format): "
                        "pip install safetensors") from None


def write_hf(model, tokenizer, cfg, output_dir: str, *, force: bool = False, checkpoint: str = "",
             step: int | None = None) -> tuple[dict[str, bytes], list[str]]:
    """Write the Hugging Face directory of (model in eval mode, tokenizer, cfg) to `output_dir`, atomically
    (`textio.atomic_dir`; with `force` an earlier export or an empty directory is replaced, nothing else).
    Returns (the files written but the weights, notes on decode settings without a counterpart)."""
    require_safetensors()
    from safetensors.torch import save_file

    check_output_dir(output_dir, force)
    files, weights, notes = build_directory(model, tokenizer, cfg)
    with textio.atomic_dir(output_dir, what="export") as tmp:
        save_file(weights, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        os.chmod(os.path.join(tmp, "model.safetensors"), 0o666 & ~textio.umask())  # (safetensors writes 0600)
        meta = {"format": "nmt-hf", "checkpoint": os.path.basename(checkpoint), "step": step}
        for name, data in {**files, METADATA_FILE: _json(meta)}.items():
            with open(os.path.join(tmp, name), "wb") as f:
                f.write(data)
    return files, notes


# --------------------------------------------------------------------------- languages and pieces added by nmt/training/grow/

def hf_numbering(state: dict, tokenizer) -> tuple[dict, object]:
    """(state dict, tokenizer) numbered as the Hugging Face directory needs them. An M2M100 tokenizer with
    pieces appended here: M2M100Tokenizer numbers its language tokens (and unused "madeup" ids) after
    vocab.json, so there the new pieces come right after the old ones and every id from the first
    language token on moves up by their number (the rows of the embeddings and the output projection
    move with them; ids below, the old pieces and the special tokens, stay). Anything else: as it is."""
    import torch

    if tokenizer.kind != "m2m100":
        return state, tokenizer
    vocab = json.loads(tokenizer.files["vocab.json"])
    n = min(tokenizer.languages.values())  # the first language token: the old pieces are ids 0 .. n-1
    new = sorted(i for i in vocab.values() if i >= n)
    if not new:
        return state, tokenizer
    V = tokenizer.src_vocab_size
    order = list(range(n)) + new + [i for i in range(n, V) if i not in set(new)]  # Hugging Face id -> nmt id
    hf_id = {nmt: h for h, nmt in enumerate(order)}
    index = torch.tensor(order)
    state = {k: v[index] if k in ("src_embed.weight", "tgt_embed.weight", "output_proj.weight", "output_proj.bias")
             else v for k, v in state.items()}
    files = {**tokenizer.files, "vocab.json": json.dumps({p: hf_id[i] for p, i in vocab.items()},
                                                         ensure_ascii=False).encode("utf-8")}
    renumbered = type(tokenizer)(files, tokenizer.settings, threads=tokenizer.threads,
                                 languages={c: hf_id[i] for c, i in tokenizer.languages.items()},
                                 default_tgt_lang=tokenizer.default_tgt_lang)
    return state, renumbered


def m2m100_added_tokens(tokenizer) -> dict:
    """tokenizer_config.json entries for the language tokens an M2M100 model was given here: M2M100Tokenizer
    knows a fixed list of codes (`language_codes`), so a new `__xx__` is an added token with its id
    (`added_tokens_decoder`; forced_bos_token_id = convert_tokens_to_ids("__xx__"); `tgt_lang` cannot
    name it). The tokenizer is numbered as `hf_numbering` numbers it."""
    vocab = json.loads(tokenizer.files["vocab.json"])
    if max(vocab.values()) >= len(vocab):
        raise ValueError("vocab.json has ids past its size: renumber with hf_numbering first")
    if set(tokenizer.languages) <= tokenizer.fixed_codes:
        return {}
    special = dict(special=True, lstrip=False, rstrip=False, normalized=False, single_word=False)
    # every language token with its id: transformers numbers the special tokens it does not find there
    # after the ones it does (the fixed codes would move up by one per new code)
    return {"added_tokens_decoder": {str(i): dict(content=f"__{code}__", **special)
                                     for code, i in sorted(tokenizer.languages.items(), key=lambda kv: kv[1])}}
