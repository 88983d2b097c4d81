"""nmt's and the imported tokenizers grown with the new language tokens and pieces, and the rows of the new ids.

Ids: appended after every existing id, language tokens first (nmt: SentencePiece ids, a language token a
control symbol of the target (joint) model; M2M100: vocab.json; NLLB: after `<mask>`, the adapter maps
SentencePiece ids past the old model onto them). An imported marian tokenizer does not grow. The tokenizer
files carry the growth to a Hugging Face export (nmt/interop/hf_export.py: NLLB's tokenizer.json gets the new
pieces, merges and codes; M2M100's new codes become added tokens, numbered by `hf_numbering`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable

from nmt.config import Config
from nmt.text.tokenizer import Tokenizer, language_symbol
from nmt.training.grow.pieces import (KEEP, Grown, append_controls, append_pieces, candidates, new_texts,
                                      old_texts, piece_text, proto_of, splitter)
from nmt.training.grow.plan import Plan


@dataclass
class Rows:
    """New rows of one vocabulary (model ids `old_size`, `old_size` + 1, ...): each the mean of these
    old ids' rows (one id: a copy); empty tuple: the mean of all rows."""

    old_size: int
    init: list[tuple[int, ...]] = field(default_factory=list)


def language_rows(init: str | None, languages: dict[str, int]) -> tuple[int, ...]:
    """The old ids a new language token's rows start from: its initialising language's token (None: every one)."""
    return (languages[init],) if init is not None else tuple(languages.values())


def piece_rows(split, piece: str, to_id: Callable[[str], int | None], unk: int) -> tuple[int, ...]:
    """The old model ids of the pieces the old model splits `piece` into (UNK left out)."""
    ids = (to_id(p) for p in split.encode(piece_text(piece), out_type=str))
    return tuple(i for i in ids if i is not None and i != unk)


def _note(what: str, result: Grown) -> str:
    return (f"{what} model: {len(result.pieces)} pieces appended ({result.left_out} more left out: old-language text "
            "would have used them)")


def grow_spm(old: Tokenizer, cfg: Config, plan: Plan, codes: set[str], log, notes: list[str]
             ) -> tuple[Tokenizer, Rows, Rows]:
    """nmt's SentencePiece models: language control symbols then pieces appended to the target (joint) model."""
    n = cfg.data.tokenizer.add_pieces
    protos = old.to_bytes()
    sides = [("both", protos["src"])] if old.joint else [("src", protos["src"]), ("tgt", protos["tgt"])]
    grown: dict[str, bytes] = {}
    rows: dict[str, Rows] = {}
    languages = dict(old.languages)
    for side, model in sides:
        target = side != "src"
        size = len(proto_of(model).pieces)
        init: list[tuple[int, ...]] = []
        if target and plan.tokens:
            model = append_controls(model, [language_symbol(c) for c in plan.tokens])
            for i, code in enumerate(plan.tokens):
                init.append(language_rows(plan.init.get(code), old.languages))
                languages[code] = size + i
        if n and next(new_texts(cfg, codes, side)(), None) is not None:
            what = {"both": "new-language", "src": "new-language source", "tgt": "new-language target"}[side]
            found = candidates(new_texts(cfg, codes, side), model, cfg, n, what, log)
            result = append_pieces(model, found, n, old_texts(cfg, codes, side, 0, KEEP))
            notes.append(_note(what, result))
            split = splitter(protos["src" if side != "tgt" else "tgt"])
            to_id = lambda p, s=split: s.piece_to_id(p)  # noqa: E731
            init += [piece_rows(split, p, to_id, old.specials.unk) for p in result.pieces]
            model = result.model
        grown[side] = model
        rows[side] = Rows(size, init)
    if old.joint:
        tokenizer = Tokenizer(grown["both"], threads=old.threads, languages=languages,
                              default_tgt_lang=old.default_tgt_lang)
        return tokenizer, rows["both"], rows["both"]
    tokenizer = Tokenizer(grown["src"], grown["tgt"], threads=old.threads, languages=languages,
                          default_tgt_lang=old.default_tgt_lang)
    return tokenizer, rows["src"], rows["tgt"]


def grow_imported(old, cfg: Config, plan: Plan, codes: set[str], log, notes: list[str]
                  ) -> tuple[object, Rows, Rows]:
    """An imported M2M100/NLLB tokenizer (one vocabulary): language tokens at the old size, then pieces."""
    n = cfg.data.tokenizer.add_pieces
    files, settings = dict(old.files), dict(old.settings)
    size = settings["src_vocab_size"]
    languages = dict(old.languages)
    init = []
    for i, code in enumerate(plan.tokens):
        init.append(language_rows(plan.init.get(code), old.languages))
        languages[code] = size + i
    first = size + len(plan.tokens)
    model = files["sentencepiece.bpe.model"]
    split = splitter(model)
    if old.kind == "m2m100":
        vocab = json.loads(files["vocab.json"])
        to_id = vocab.get
        have = set(vocab)
    else:
        sp_size = len(proto_of(model).pieces)
        to_id = lambda p: split.piece_to_id(p) + 1 if split.piece_to_id(p) else None  # noqa: E731  fairseq offset
        have = {p.piece for p in proto_of(model).pieces}
    pieces: list[str] = []
    if n:
        found = [p for p in candidates(new_texts(cfg, codes, "both"), model, cfg, n, "new-language", log)
                 if p not in have]  # (one vocabulary: the new languages' text on either side)
        result = append_pieces(model, found, n, old_texts(cfg, codes, "both", 0, KEEP))
        notes.append(_note("new-language", result))
        pieces, files["sentencepiece.bpe.model"] = result.pieces, result.model
        init += [piece_rows(split, p, to_id, old.specials.unk) for p in pieces]
    if old.kind == "m2m100":
        vocab.update({p: first + j for j, p in enumerate(pieces)})
        files["vocab.json"] = json.dumps(vocab, ensure_ascii=False).encode("utf-8")
    else:
        if pieces:
            settings["added_pieces"] = {"sp_size": sp_size, "first_id": first}
        if "tokenizer.json" in files:
            files["tokenizer.json"] = _nllb_tokenizer_json(files["tokenizer.json"], pieces, first,
                                                           {c: languages[c] for c in plan.tokens})
    total = first + len(pieces)
    settings.update(src_vocab_size=total, tgt_vocab_size=total)
    tokenizer = type(old)(files, settings, threads=old.threads, languages=languages, default_tgt_lang=old.default_tgt_lang)
    rows = Rows(size, init)
    return tokenizer, rows, rows


def _nllb_tokenizer_json(data: bytes, pieces: list[str], first: int, codes: dict[str, int]) -> bytes:
    """transformers' tokenizer.json of an NLLB model with the new pieces (BPE vocabulary entries and
    merges after the old ones, as transformers' conversion writes them: every split into two pieces of
    the vocabulary, in the order of the pieces) and the new language codes as special added tokens. The
    added tokens (language codes, `<mask>`) enter the BPE vocabulary with their ids too: transformers 5
    gives an added token the vocabulary lacks the id after the vocabulary's (the old layout, pieces then
    added tokens, hid that), which would move every code once pieces come after them."""
    tj = json.loads(data)
    bpe = tj["model"]
    vocab, merges = bpe["vocab"], bpe["merges"]
    as_lists = not merges or isinstance(merges[0], list)
    vocab.update({p: first + j for j, p in enumerate(pieces)})
    for p in pieces:
        splits = [(p[:k], p[k:]) for k in range(1, len(p)) if p[:k] in vocab and p[k:] in vocab]
        for a, b in sorted(splits, key=lambda ab: (vocab[ab[0]], vocab[ab[1]])):
            merges.append([a, b] if as_lists else f"{a} {b}")
    special = dict(single_word=False, lstrip=False, rstrip=False, normalized=False, special=True)
    tj["added_tokens"] = sorted(tj.get("added_tokens", []) + [dict(id=i, content=c, **special) for c, i in codes.items()],
                                key=lambda t: t["id"])
    for t in tj["added_tokens"]:  # transformers numbers added tokens the vocabulary lacks after its largest id
        vocab.setdefault(t["content"], t["id"])
    return json.dumps(tj, ensure_ascii=False).encode("utf-8")
