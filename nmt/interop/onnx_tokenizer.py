"""tokenizer.json (the `tokenizers` library's file, which transformers and transformers.js load) for the
tokenizer of an nmt model: what `nmt export --format onnx` ships (nmt/interop/onnx_export.py).

- nmt's own SentencePiece model: transformers' converter of a SentencePiece model
  (`SpmConverter.build_tokenizer_from_spm_proto`: SentencePiece's normalizer and whitespace rules, the
  model's pieces and scores as a Unigram or BPE model, user-defined pieces kept whole), which encodes as
  `SentencePieceProcessor.encode` does; a `char` model as a Unigram model over its characters. A `word`
  model becomes a WordLevel model over whitespace-separated words: the same ids, except that a run of
  unknown words gives one `<unk>` per word where SentencePiece gives one for the run (a note says so).
  `<pad>`, `<s>`, `</s>` and a multilingual model's language tokens are special added tokens (skipped by
  `decode(skip_special_tokens=True)`); the post-processor appends `</s>` to a source, as nmt/layout.py does;
  `<unk>` decodes as SentencePiece's ` ⁇ `. Separate source and target models cannot be one tokenizer.json:
  refused in one line.
- An imported NLLB model: the tokenizer.json it was imported with.
- An imported MarianMT or M2M100 model: its source SentencePiece model over the ids of its vocab.json
  (SentencePiece's scores; a piece of vocab.json that the source model lacks gets a score far below
  every other, so that it is never preferred to the source model's own pieces). MarianMT and M2M100
  look pieces up in vocab.json and give `<unk>` for the ones it lacks; tokenizer.json cannot, and cuts
  such a word into other pieces instead (a note gives their number).

`tokenizer_json(tokenizer)` returns the file's bytes and the notes; `tokenizer_config(...)` the
tokenizer_config.json that goes with it.
"""

from __future__ import annotations

import json
import re

from nmt.errors import UserError

UNK_SURFACE = " \u2047 "  # what SentencePiece decodes `<unk>` to
FAR_BELOW = 1000.0  # score gap below the lowest piece for vocab.json pieces the source model lacks


def tokenizer_json(tokenizer) -> tuple[bytes, list[str]]:
    """(tokenizer.json, notes) for `tokenizer` (nmt.text.tokens.TokenizerLike; an imported M2M100 one numbered as
    its Hugging Face export: nmt/interop/hf_export.py `hf_numbering`)."""
    if tokenizer.kind == "nllb":
        if "tokenizer.json" not in tokenizer.files:
            raise UserError("cannot export to ONNX: this NLLB model was imported without tokenizer.json "
                            "(import it again from a directory that has it)")
        return tokenizer.files["tokenizer.json"], []
    if not tokenizer.joint:
        raise UserError("cannot export to ONNX: the model has separate source and target vocabularies, and "
                        "tokenizer.json holds one (train with data.tokenizer.joint: true)")
    from tokenizers import processors

    if tokenizer.kind == "spm":
        hf, notes = _from_spm(tokenizer.to_bytes()["src"], tokenizer.languages)
    else:
        hf, notes = _from_imported(tokenizer)
    src, _ = tokenizer.vocab_pieces()
    eos = src[tokenizer.specials.eos]
    first = [src[tokenizer.languages[tokenizer.settings["src_lang"]]]] if tokenizer.source_languages else []
    single = " ".join([*first, "$A", eos])  # M2M100: `__src__ pieces </s>`; the others `pieces </s>`
    hf.post_processor = processors.TemplateProcessing(
        single=single, pair=f"{single} $B {eos}", special_tokens=[(p, hf.token_to_id(p)) for p in [*first, eos]])
    return hf.to_str(pretty=True).encode("utf-8"), notes


def _proto(serialized: bytes):
    from transformers.convert_slow_tokenizer import import_protobuf

    m = import_protobuf().ModelProto()
    m.ParseFromString(serialized)
    return m


def _from_spm(serialized: bytes, languages: dict[str, int]):
    """(tokenizers.Tokenizer, notes) of one of nmt's SentencePiece models."""
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
    from transformers.convert_slow_tokenizer import SpmConverter

    proto = _proto(serialized)
    kind = proto.trainer_spec.model_type  # 1 unigram, 2 bpe, 3 word, 4 char
    pieces = [p.piece for p in proto.pieces]
    vocab = {p: i for i, p in enumerate(pieces)} if kind == 2 else [(p.piece, p.score) for p in proto.pieces]
    hf = SpmConverter.build_tokenizer_from_spm_proto(proto, vocab)
    notes = []
    if kind == 3:
        hf.model = models.WordLevel({p: i for i, p in enumerate(pieces)}, unk_token=proto.trainer_spec.unk_piece)
        split = [pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=False),
                 pre_tokenizers.Split(Regex("\u2581[^\u2581]*"), behavior="isolated")]  # (transformers.js: no split=True)
        user = sorted((p.piece for p in proto.pieces if p.type == 4), key=len, reverse=True)
        if user:
            split.append(pre_tokenizers.Split(Regex("|".join(re.escape(p) for p in user)), behavior="isolated"))
        hf.pre_tokenizer = pre_tokenizers.Sequence(split)
        notes.append("a word-level SentencePiece model: in tokenizer.json a run of unknown words gives one <unk> "
                     "per word (SentencePiece: one for the run)")
    control = [p.piece for p in proto.pieces if p.type == 3]  # <pad>, <s>, </s>, language tokens
    hf.add_special_tokens([AddedToken(p, special=True, normalized=False) for p in control])
    unk = proto.trainer_spec.unk_piece
    hf.decoder = decoders.Sequence([hf.decoder, decoders.Replace(unk, UNK_SURFACE)])
    missing = [code for code, i in languages.items() if pieces[i] not in control]
    if missing:
        raise UserError(f"cannot export to ONNX: language token(s) {', '.join(missing)} are not control symbols")
    return hf, notes


def _from_imported(tokenizer):
    """(tokenizers.Tokenizer, notes) of an imported MarianMT or M2M100 tokenizer."""
    from tokenizers import AddedToken, decoders
    from transformers.convert_slow_tokenizer import SpmConverter

    files = tokenizer.files
    proto = _proto(files["source.spm" if tokenizer.kind == "marian" else "sentencepiece.bpe.model"])
    src, _ = tokenizer.vocab_pieces()  # id order: vocab.json, then (M2M100) language tokens and unused ids
    scores = {p.piece: p.score for p in proto.pieces if p.type in (1, 4)}  # normal and user-defined pieces
    floor = min(scores.values(), default=0.0) - FAR_BELOW
    ids = tokenizer.specials
    specials = {ids.pad, ids.eos, ids.start, *tokenizer.languages.values()}
    vocab = [(piece, scores.get(piece, floor)) for piece in src]
    kind = proto.trainer_spec.model_type
    if kind not in (1, 2):
        raise UserError(f"cannot export to ONNX: an imported {tokenizer.kind} tokenizer with a SentencePiece "
                        f"model of type {kind} (supported: unigram, bpe)")
    proto.trainer_spec.unk_id = ids.unk  # the converter reads the unknown piece's id from here
    hf = SpmConverter.build_tokenizer_from_spm_proto(
        proto, vocab if kind == 1 else {piece: i for i, piece in enumerate(src)})
    special = [src[i] for i in sorted(specials) if 0 <= i < len(src)]
    hf.add_special_tokens([AddedToken(p, special=True, normalized=False) for p in dict.fromkeys(special)])
    hf.decoder = decoders.Sequence([hf.decoder, decoders.Replace(src[ids.unk], "")])  # (transformers skips it)
    lacking = sum(1 for p in proto.pieces if p.type == 1 and p.piece not in set(src))
    notes = []
    if lacking:
        notes.append(f"{lacking} pieces of the source SentencePiece model are not in vocab.json: "
                     f"{tokenizer.kind}'s tokenizer gives <unk> for them, tokenizer.json other pieces")
    return hf, notes


def tokenizer_config(tokenizer, max_positions: int) -> dict:
    """tokenizer_config.json for tokenizer.json (`tokenizer_class` as transformers and transformers.js name it)."""
    cls = {"spm": "PreTrainedTokenizerFast", "marian": "MarianTokenizer", "m2m100": "M2M100Tokenizer",
           "nllb": "NllbTokenizer"}[tokenizer.kind]
    src, _ = tokenizer.vocab_pieces()
    ids = tokenizer.specials
    config = dict(tokenizer_class=cls, model_max_length=max_positions, clean_up_tokenization_spaces=False,
                  pad_token=src[ids.pad], unk_token=src[ids.unk], eos_token=src[ids.eos])
    if tokenizer.source_languages:  # M2M100, NLLB
        from nmt.text.languages import target_languages

        config.update(src_lang=tokenizer.settings["src_lang"], tgt_lang=target_languages(tokenizer).default)
    return config


def dumps(value) -> bytes:
    return json.dumps(value, ensure_ascii=False, indent=1).encode("utf-8")
