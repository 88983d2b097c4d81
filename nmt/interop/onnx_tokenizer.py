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
- An imported NLLB model: the tokenizer.json it was imported with, its source language the model's.
- An imported MarianMT or M2M100 model: its source SentencePiece model renumbered as vocab.json (and the
  language tokens) number the pieces, through the same converter; a piece of vocab.json the source model
  lacks is never produced (spelt after a private-use character, which the decoder removes). MarianMT and
  M2M100 give `<unk>` for a piece
  vocab.json lacks: tokenizer.json gives such pieces ids past the model's vocabulary, which the encoder
  graph reads as `<unk>` (nmt/interop/onnx_graphs.py), so the model sees what their tokenizers give. One
  difference remains: text the source model cannot cut at all (a character it never saw) is `<unk>` in
  tokenizer.json, where their tokenizers look the text itself up in vocab.json (which may have it).

`tokenizer_json(tokenizer)` returns the file's bytes and the notes; `tokenizer_config(...)` the
tokenizer_config.json that goes with it.
"""

from __future__ import annotations

import json
import re

from nmt.errors import UserError

UNK_SURFACE = " \u2047 "  # what SentencePiece decodes `<unk>` to
FAR_BELOW = 1000.0  # score gap below the lowest piece for vocab.json pieces the source model lacks
UNSEEN = "\ue000"  # (a private-use character) before those pieces in tokenizer.json: no text matches them


def tokenizer_json(tokenizer) -> tuple[bytes, list[str], int]:
    """(tokenizer.json, notes, the number of ids it gives) for `tokenizer` (nmt.text.tokens.TokenizerLike; an
    imported M2M100 one numbered as its Hugging Face export: nmt/interop/hf_export.py `hf_numbering`)."""
    from tokenizers import Tokenizer, processors

    if not tokenizer.joint:
        raise UserError("cannot export to ONNX: the model has separate source and target vocabularies, and "
                        "tokenizer.json holds one (train with data.tokenizer.joint: true)")
    if tokenizer.kind == "nllb":
        if "tokenizer.json" not in tokenizer.files:
            raise UserError("cannot export to ONNX: this NLLB model was imported without tokenizer.json "
                            "(import it again from a directory that has it)")
        hf, notes = Tokenizer.from_str(tokenizer.files["tokenizer.json"].decode("utf-8")), []
    elif tokenizer.kind == "spm":
        hf, notes = _from_spm(tokenizer.to_bytes()["src"], tokenizer.languages)
    else:
        hf, notes = _from_imported(tokenizer)
    src, _ = tokenizer.vocab_pieces()
    eos = src[tokenizer.specials.eos]
    first = [src[tokenizer.languages[tokenizer.settings["src_lang"]]]] if tokenizer.source_languages else []
    single = " ".join([*first, "$A", eos])  # M2M100: `__src__ pieces </s>`; the others `pieces </s>`
    hf.post_processor = processors.TemplateProcessing(  # (M2M100, NLLB: the model's default source language)
        single=single, pair=f"{single} $B {eos}", special_tokens=[(p, hf.token_to_id(p)) for p in [*first, eos]])
    return hf.to_str(pretty=True).encode("utf-8"), notes, hf.get_vocab_size(with_added_tokens=True)


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
    """(tokenizers.Tokenizer, notes) of an imported MarianMT or M2M100 tokenizer (module docstring)."""
    from tokenizers import AddedToken, decoders
    from transformers.convert_slow_tokenizer import SpmConverter

    files = tokenizer.files
    source = _proto(files["source.spm" if tokenizer.kind == "marian" else "sentencepiece.bpe.model"])
    kind = source.trainer_spec.model_type
    if kind not in (1, 2):
        raise UserError(f"cannot export to ONNX: an imported {tokenizer.kind} tokenizer with a SentencePiece "
                        f"model of type {kind} (supported: unigram, bpe)")
    src, _ = tokenizer.vocab_pieces()  # id order: vocab.json, then (M2M100) language tokens and unused ids
    ids = tokenizer.specials
    # a SentencePiece model in the model's id order, then the source model's pieces vocab.json lacks
    proto = _proto(source.SerializeToString())
    del proto.pieces[:]
    theirs = {p.piece: p for p in source.pieces if p.type in (1, 4)}  # normal and user-defined pieces
    floor = min((p.score for p in theirs.values()), default=0.0) - FAR_BELOW
    specials = {ids.pad, ids.eos, ids.start, *tokenizer.languages.values()}
    for i, piece in enumerate(src):
        if piece in theirs and i not in specials:
            proto.pieces.append(theirs[piece])
        else:  # a control token, or a piece the source model lacks: never matched (UNSEEN), spelt as it is
            proto.pieces.add(piece=piece if i in specials else UNSEEN + piece, score=floor, type=3 if i in specials else 5)
    new = proto.pieces[ids.unk]
    new.type, new.score = 2, 0.0
    lacking = [p for p in source.pieces if p.type in (1, 4) and p.piece not in set(src)]
    proto.pieces.extend(lacking)
    proto.trainer_spec.unk_id, proto.trainer_spec.unk_piece = ids.unk, src[ids.unk]
    vocab = [(p.piece, p.score) for p in proto.pieces] if kind == 1 else {p.piece: i for i, p in enumerate(proto.pieces)}
    hf = SpmConverter.build_tokenizer_from_spm_proto(proto, vocab)
    hf.add_special_tokens([AddedToken(src[i], special=True, normalized=False) for i in sorted(specials)])
    hf.decoder = decoders.Sequence([decoders.Replace(UNSEEN, ""), hf.decoder,
                                    decoders.Replace(src[ids.unk], "")])  # (transformers skips <unk>)
    notes = []
    if lacking:
        notes.append(f"{len(lacking)} pieces of the source SentencePiece model are not in vocab.json: tokenizer.json "
                     f"gives them ids from {len(src)} on, which the encoder graph reads as <unk> (as {tokenizer.kind}'s "
                     "tokenizer does)")
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
