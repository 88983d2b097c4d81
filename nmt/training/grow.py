"""Adding languages to a pretrained model: `data.add_languages`, `data.tokenizer.add_pieces` (with `train.init_from`).

A fine-tuning run (nmt/training/finetune.py) whose corpora name languages its source model does not know lists
them in `data.add_languages` (new code -> the existing language whose token initialises the new one's,
or null: the mean of the model's language tokens). `grow_source` turns the source checkpoint into a
larger one before the run starts: new language tokens, new pieces, the embedding rows to match. Ids the
model had never change, so every old direction translates as before until training moves its weights.

Languages (`check_languages`, one-line UserErrors naming the key):
- what the source knows: an imported M2M100/NLLB model its language codes; an nmt model the languages of
  its training config (data.src_lang, data.tgt_lang, every corpus's) and its language tokens;
- a corpus language the source does not know must be listed (`data.train[2].tgt_lang: 'it' is not a
  language of ...`); a listed code the source knows, or that no training corpus uses, is an error; an
  initialising code must be a language with a token;
- a new language that is a target language of data.train gets a token in the model's own convention:
  NLLB the code itself (`ita_Latn`-style codes only), M2M100 `__it__`, nmt's multilingual models
  `__it__` (a control symbol of the target SentencePiece model, nmt/text/tokenizer.py); codes are kept as
  written (`pt_BR` stays `__pt_BR__`). nmt's own models have no source-language tokens, so a new source
  language needs none; an imported M2M100/NLLB model puts a language token before every source too (the
  corpus's src_lang; at translate time `--src-lang`, default the model's data.src_lang), the same
  token a target in that language starts with: a new language gets one whether it is a source or a
  target language, or both. A bilingual model has no language tokens: it can learn a new source
  language, or a new single target language, but not a second target language. nmt's multilingual
  models have tokens for their target languages only: a language they know as a source only cannot
  become a target language (a one-line error naming the corpus's tgt_lang).

Pieces (`data.tokenizer.add_pieces: N`, per SentencePiece model that encodes new-language text: the one
model of a joint vocabulary, else source text -> source model, target text -> target model):
- a SentencePiece model of the source model's type (unigram, bpe, ...) with 4N + 256 pieces (fewer when
  the text is small) is trained on the new languages' training text (a seeded sample of at most
  data.tokenizer.max_sentences lines); its pieces the model lacks are ranked most frequent first
  (unigram: by their count in the new text encoded with that model; bpe: its characters by their count,
  then its pieces in the order its merges were learnt, the most frequent pair first) and appended, at
  most N:
  - unigram (word, char): score = the score of the old model's best segmentation of the piece + 1, so
    that the new piece beats the split it replaces;
  - bpe: a score below every existing piece (its merge comes after all old merges, in order); a piece is
    added only when the grown model splits its text into exactly two pieces (so that one merge forms
    it) or it is one character (a character the old model lacked: no more `<unk>`).
- old text: one SentencePiece model serves every language (transformers' tokenizers load one, and
  pieces for the new languages only would need a tokenizer per language), so a new piece would apply
  wherever its text occurs, in the old languages too. A candidate that the grown model uses in the old
  languages' training text (KEEP = 40,000 old-language lines each SentencePiece model encodes, the
  first lines of each corpus and side in an old language, in equal shares) is left out and the next one taken, until none is: those lines segment exactly as before
  (a line whose segmentation uses no new piece is the old model's), other old-language text almost
  always (the log gives the share of held-out old-language lines, the ones after those, that changed),
  and old directions translate as before until training moves the weights. The log also gives how
  many candidates were left out and the new languages' tokens per line before and after;
- ids: appended after every existing id (nmt: SentencePiece ids; M2M100: vocab.json; NLLB: after
  `<mask>`, the adapter maps SentencePiece ids past the old model onto them), language tokens first.

Weights (`grow_weights`): rows appended to src_embed / tgt_embed / output_proj (and its bias): a language
token copies the initialising language's rows (null: the mean of the language tokens' rows); a piece
starts as the mean of the rows of the old pieces its text splits into (`<unk>` left out; nothing left:
the mean of all rows).

Hugging Face export (nmt/interop/hf_export.py `hf_numbering`, `m2m100_added_tokens`): the grown SentencePiece model and vocabularies travel in
the tokenizer files (NLLB: tokenizer.json gets the new pieces, their merges and the new codes as added
tokens, so `tgt_lang="ita_Latn"` works); M2M100Tokenizer knows a fixed list of codes, so a new `__xx__`
is written as an added token (forced_bos_token_id = convert_tokens_to_ids("__xx__"); its `tgt_lang`
cannot name it), and it numbers its language tokens after vocab.json, so with added pieces the
directory's ids from the first language token on move up by their number (`hf_numbering`).
"""

from __future__ import annotations

import collections
import itertools
import json
import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Sequence

import torch
from sentencepiece import sentencepiece_model_pb2 as pb

from nmt.config import Config, replace
from nmt.errors import UserError
from nmt.model.checkpoint import ModelRecord
from nmt.text.tokenizer import Tokenizer, language_symbol, train_sentencepiece
from nmt.text.tokens import TokenizerLike

NLLB_CODE = re.compile(r"[a-z]{3}_[A-Z][a-z]{3}")  # = nmt.text.hf_tokenizer.NLLB_CODE
TYPES = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}  # sentencepiece TrainerSpec.ModelType
NORMAL, CONTROL = pb.ModelProto.SentencePiece.NORMAL, pb.ModelProto.SentencePiece.CONTROL
KEEP = 40_000  # old-language lines per SentencePiece model whose segmentation the new pieces must not change
SAMPLE = 2000  # lines logged: new-language lines' length, and held-out old-language lines (after the KEEP)
MAX_ROUNDS = 50  # of leaving out the pieces old-language text uses and taking the next ones


# --------------------------------------------------------------------------- languages

def known_languages(tokenizer: TokenizerLike, config: Config) -> set[str]:
    """The languages a source model knows (module docstring): its tokenizer and its Config say."""
    known = set(tokenizer.languages)
    if tokenizer.source_languages:  # an imported M2M100/NLLB model: its language codes
        return known
    d = config.data
    known |= {d.src_lang, d.tgt_lang}
    for c in d.train_corpora + d.valid_corpora:
        known |= set(d.langs(c))
    return known - {None}


@dataclass(frozen=True)
class Plan:
    """What `check_languages` found: the new languages that get a token (in order), and per new
    language its initialising language (None: the mean of the language tokens)."""

    tokens: tuple[str, ...]
    init: dict[str, str | None] = field(default_factory=dict)


def check_languages(cfg: Config, tokenizer: TokenizerLike, source: Config) -> Plan:
    """The rules of the module docstring against the source model (its tokenizer and Config); the new tokens."""
    d, path = cfg.data, cfg.train.init_from
    kind = tokenizer.kind
    known = known_languages(tokenizer, source)
    languages = tokenizer.languages  # the model's language tokens
    added = dict(d.add_languages)
    corpora = [(d.train_key(i), c) for i, c in enumerate(d.train_corpora)] + \
        [(d.valid_key(i), c) for i, c in enumerate(d.valid_corpora)]
    for key, c in corpora:
        for side, code in zip(("src_lang", "tgt_lang"), d.langs(c)):
            if code not in known and code not in added:
                where = f"{key}.{side}" if getattr(c, side) else f"data.{side}"
                raise UserError(f"{where}: {code!r} is not a language of the model in train.init_from {path} (it knows "
                                f"{_list(known)}): list it in data.add_languages ({code}: an existing language whose "
                                "token starts it, or null)")
    if kind == "spm" and languages:  # nmt's multilingual models: a language known as a source only has no token
        for i, c in enumerate(d.train_corpora):
            code = d.langs(c)[1]
            if code in known and code not in languages:
                where = f"{d.train_key(i)}.tgt_lang" if c.tgt_lang else "data.tgt_lang"
                raise UserError(f"{where}: the model in train.init_from {path} knows {code!r} as a source language only "
                                f"(its target-language tokens: {_list(languages)}); a language it knows cannot be "
                                "given a target-language token (data.add_languages is for languages it does not know)")
    used = {code for c in d.train_corpora for code in d.langs(c)}
    for code, init in added.items():
        if code in known:
            raise UserError(f"data.add_languages.{code}: the model in train.init_from {path} already knows {code!r}")
        if code not in used:
            raise UserError(f"data.add_languages.{code}: no corpus of data.train has {code!r} as src_lang or tgt_lang "
                            "(a new language is learnt from its training text)")
        if kind == "nllb" and not NLLB_CODE.fullmatch(code):
            raise UserError(f"data.add_languages.{code}: an NLLB model's language codes look like ita_Latn (ISO 639-3 "
                            "code, '_', ISO 15924 script)")
        if init is not None and init not in languages:
            raise UserError(f"data.add_languages.{code}: {init!r} has no language token in the model in "
                            f"train.init_from {path} (its language tokens: {_list(languages) or 'none'}; or null)")
    targets = d.target_languages
    # M2M100/NLLB: one token per language, before the source and as the first target token; nmt's own
    # models: target-language tokens only
    tokens = tuple(added) if tokenizer.source_languages else tuple(code for code in added if code in targets)
    if not tokenizer.source_languages and tokens and not languages and len(targets) > 1:
        raise UserError(f"data.add_languages.{tokens[0]}: the model in train.init_from {path} translates into one "
                        "language and has no language tokens, so it cannot learn a second target language (train a "
                        "multilingual model, or fine-tune into the new language alone)")
    if kind == "nllb" and d.tokenizer.add_pieces and tokenizer.settings.get("added_pieces"):
        raise UserError(f"data.tokenizer.add_pieces: the vocabulary of the NLLB model in train.init_from {path} was grown "
                        "before (it holds appended pieces); growing it again is not supported: set add_pieces: 0 (new "
                        "language tokens are still added)")
    if kind == "marian" and d.tokenizer.add_pieces:
        raise UserError("data.tokenizer.add_pieces: growing the vocabulary of an imported marian model is not "
                        "supported (its source.spm / target.spm / vocab.json; M2M100, NLLB and nmt's own are)")
    if tokens and not languages:
        tokens = ()  # one target language: no token needed
    return Plan(tokens, added)


def _list(items: Iterable[str], most: int = 12) -> str:
    items = sorted(items)
    return ", ".join(items[:most]) + (f", ... ({len(items)})" if len(items) > most else "")


# --------------------------------------------------------------------------- SentencePiece models

def proto_of(model: bytes) -> pb.ModelProto:
    m = pb.ModelProto()
    m.ParseFromString(model)
    return m


def splitter(model: bytes):
    """A processor of `model` that segments a piece's text as a piece: no dummy prefix, whitespace kept
    (the piece `▁della` is the text " della")."""
    import sentencepiece as spm

    m = proto_of(model)
    m.normalizer_spec.add_dummy_prefix = False
    m.normalizer_spec.remove_extra_whitespaces = False
    return spm.SentencePieceProcessor(model_proto=m.SerializeToString())


def piece_text(piece: str) -> str:
    return piece.replace("\u2581", " ")


@dataclass
class Grown:
    """One SentencePiece model after growth: the model, each appended piece (in id order), and how many
    candidates were left out because old-language text would have used them."""

    model: bytes
    pieces: list[str]
    left_out: int = 0


def append_pieces(model: bytes, candidates: Iterable[str], n: int, keep: Sequence[str] = ()) -> Grown:
    """Append at most `n` of `candidates` (ranked, not in the model) to `model` with usable scores
    (module docstring: unigram, bpe). keep: old-language lines whose segmentation must not change: a
    candidate the grown model uses in them is left out and the next ones are taken, until none is."""
    import sentencepiece as spm

    pool, banned = list(candidates), set()
    size = len(proto_of(model).pieces)
    for round_ in itertools.count():
        grown = _append(model, [c for c in pool if c not in banned], n, banned)
        if not keep or not grown.pieces:
            break
        sp = spm.SentencePieceProcessor(model_proto=grown.model)
        used = {sp.id_to_piece(i) for ids in sp.encode(list(keep)) for i in ids if i >= size}
        if not used:
            break
        banned |= used
        if round_ + 1 == MAX_ROUNDS:
            pool = grown.pieces  # from now on: only leave out, no more refills
    grown.left_out = len(banned)
    return grown


def _append(model: bytes, candidates: Iterable[str], n: int, banned: set[str]) -> Grown:
    """`append_pieces` without the check on old-language text (`banned`: characters never added)."""
    m = proto_of(model)
    kind = TYPES.get(m.trainer_spec.model_type, "unigram")
    have = {p.piece for p in m.pieces}
    known = set(have)
    scores = [p.score for p in m.pieces if p.type == NORMAL]
    floor = min(scores, default=0.0)
    old = splitter(model)
    added: list[str] = []
    rank: dict[str, int] = {}  # bpe: the pieces added so far, in merge order
    for piece in candidates:
        if len(added) >= n:
            break
        if piece in have:
            continue
        if kind == "bpe":
            split = [q for p in old.encode(piece_text(piece), out_type=str) for q in ([p] if p in known else p)]
            if len(piece) > 1 and len(_bpe_merge(split, rank)) != 2:  # (unknown characters: one symbol each)
                continue  # no single merge forms it
            new = list(dict.fromkeys([c for c in piece if c not in have] + [piece]))  # its new characters first
            if len(added) + len(new) > n or banned.intersection(new):
                continue
            scores = [floor - 1.0 - len(added) - k for k in range(len(new))]
            rank.update({p: len(rank) for p in new})
        else:
            ids = old.encode(piece_text(piece), out_type=int)
            new, scores = [piece], [sum(old.get_score(i) if not old.is_unknown(i) else floor - 10.0 for i in ids) + 1.0]
        for p, score in zip(new, scores):
            m.pieces.append(pb.ModelProto.SentencePiece(piece=p, score=score, type=NORMAL))
        have.update(new)
        added += new
    m.trainer_spec.vocab_size = len(m.pieces)
    return Grown(m.SerializeToString(), added)


def _bpe_merge(pieces: list[str], rank: dict[str, int]) -> list[str]:
    """The old model's segmentation after the merges of the added pieces (scores below every old one, so
    they come after all old merges), best rank first, as SentencePiece's BPE applies them."""
    pieces = list(pieces)
    while len(pieces) > 1:
        pairs = [(rank[a + b], i) for i, (a, b) in enumerate(zip(pieces, pieces[1:])) if a + b in rank]
        if not pairs:
            break
        _, i = min(pairs)
        pieces[i:i + 2] = [pieces[i] + pieces[i + 1]]
    return pieces


def append_controls(model: bytes, symbols: Iterable[str]) -> bytes:
    """`model` with control symbols (never matched in text, like `</s>`) appended."""
    m = proto_of(model)
    for symbol in symbols:
        m.pieces.append(pb.ModelProto.SentencePiece(piece=symbol, score=0.0, type=CONTROL))
    m.trainer_spec.vocab_size = len(m.pieces)
    return m.SerializeToString()


def candidates(lines: Callable[[], Iterator[str]], model: bytes, cfg: Config, n: int, what: str,
               log: Callable[[str], None]) -> list[str]:
    """Pieces of a SentencePiece model trained on `lines` (the source model's type), ranked most
    frequent first (module docstring); those `model` has are left out."""
    import sentencepiece as spm

    kind = TYPES.get(proto_of(model).trainer_spec.model_type, "unigram")
    tok = replace(cfg.data.tokenizer, vocab_size=4 * n + 256, model_type=kind)
    advice = (f"it has 4 x data.tokenizer.add_pieces + 256 = {tok.vocab_size} pieces, which must cover every "
              "character of the new languages' text: raise add_pieces")
    new = spm.SentencePieceProcessor(model_proto=train_sentencepiece(lines, tok, seed=cfg.seed, what=what, log=log,
                                                                     advice=advice))
    have = {p.piece for p in proto_of(model).pieces}
    ordinary = [i for i in range(new.get_piece_size())
                if not (new.is_control(i) or new.is_unknown(i) or new.is_unused(i) or new.is_byte(i))]
    sample = list(itertools.islice(lines(), 200_000))
    if kind == "bpe":  # its characters first (the most frequent first), then its merges in the order learnt
        chars = collections.Counter(c for line in sample for c in line)
        pieces = [new.id_to_piece(i) for i in sorted(ordinary, key=lambda i: -new.get_score(i))]
        ranked = sorted((p for p in pieces if len(p) == 1), key=lambda p: -chars[p]) + [p for p in pieces if len(p) > 1]
    else:
        counts = collections.Counter(p for ids in new.encode(sample, out_type=str) for p in ids)
        ranked = [p for p, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    return [p for p in ranked if p not in have]


# --------------------------------------------------------------------------- the source checkpoint

@dataclass
class Rows:
    """New rows of one vocabulary (model ids `old_size`, `old_size` + 1, ...): each the mean of these
    old ids' rows (one id: a copy); empty tuple: the mean of all rows."""

    old_size: int
    init: list[tuple[int, ...]] = field(default_factory=list)


def grow_weights(state: dict, src: Rows, tgt: Rows) -> dict:
    """The state dict with rows appended to the embeddings and the output projection (and its bias)."""
    out = dict(state)
    for name, rows in (("src_embed.weight", src), ("tgt_embed.weight", tgt), ("output_proj.weight", tgt),
                       ("output_proj.bias", tgt)):
        if name not in state or not rows.init:
            continue
        old = state[name]
        if old.shape[0] != rows.old_size:
            raise UserError(f"train.init_from: {name} has {old.shape[0]} rows, the tokenizer {rows.old_size} ids")
        new = [old[list(ids)].float().mean(0) if ids else old.float().mean(0) for ids in rows.init]
        out[name] = torch.cat([old, torch.stack(new).to(old.dtype)])
    return out


def _init_language(code: str, plan: Plan, languages: dict[str, int]) -> tuple[int, ...]:
    init = plan.init.get(code)
    return (languages[init],) if init is not None else tuple(languages.values())


def _split_ids(split, piece: str, to_id: Callable[[str], int | None], unk: int) -> tuple[int, ...]:
    """The old model ids of the pieces the old model splits `piece` into (UNK left out)."""
    ids = (to_id(p) for p in split.encode(piece_text(piece), out_type=str))
    return tuple(i for i in ids if i is not None and i != unk)


def _texts(cfg: Config, codes: set[str], side: str) -> Callable[[], Iterator[str]]:
    """The non-empty training lines in `codes` on `side` ("src", "tgt" or "both"), streamed."""
    from nmt.text.sources import iter_side

    d = cfg.data

    def lines() -> Iterator[str]:
        for c in d.train_corpora:
            if c.weight <= 0:
                continue
            for s, code in zip(("src", "tgt"), d.langs(c)):
                if code in codes and side in (s, "both"):
                    yield from (x for x in iter_side(c, s, *d.langs(c)) if x)
    return lines


def _any(lines: Callable[[], Iterator[str]]) -> bool:
    return next(lines(), None) is not None


def _old_texts(cfg: Config, codes: set[str], side: str, start: int, stop: int) -> list[str]:
    """Old-language training lines, the same share of each (corpus, side) in an old language on `side`:
    of `stop` lines in all, those after the first `start` (non-empty lines)."""
    from nmt.text.sources import iter_side

    d = cfg.data
    streams = [(c, s) for c in d.train_corpora if c.weight > 0
               for s, code in zip(("src", "tgt"), d.langs(c)) if code not in codes and side in (s, "both")]
    out: list[str] = []
    for c, s in streams:
        lines = (x for x in iter_side(c, s, *d.langs(c)) if x)
        out += itertools.islice(lines, start // len(streams), stop // len(streams))
    return out


def grow_source(cfg: Config, source: ModelRecord, log: Callable[[str], None] = print) -> ModelRecord:
    """The source checkpoint with the new languages' tokens and pieces (module docstring); `source`
    itself when nothing is added."""
    old = source.load_tokenizer(cfg.data.tokenizer.threads)
    plan = check_languages(cfg, old, source.load_config())
    if not plan.tokens and not cfg.data.tokenizer.add_pieces:
        return source
    new_codes = set(plan.init)
    notes: list[str] = []
    grow = _grow_spm if old.kind == "spm" else _grow_imported
    tokenizer, src, tgt = grow(old, cfg, plan, new_codes, log, notes)
    state = grow_weights(source.model, src, tgt)
    _log_growth(cfg, old, tokenizer, plan, new_codes, log, notes)
    return source.with_tokenizer(tokenizer, state)


def _note(what: str, result: Grown) -> str:
    return (f"{what} model: {len(result.pieces)} pieces appended ({result.left_out} more left out: old-language text "
            "would have used them)")


def _grow_spm(old: Tokenizer, cfg: Config, plan: Plan, codes: set[str], log, notes: list[str]
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
                init.append(_init_language(code, plan, old.languages))
                languages[code] = size + i
        if n and _any(_texts(cfg, codes, side)):
            what = {"both": "new-language", "src": "new-language source", "tgt": "new-language target"}[side]
            found = candidates(_texts(cfg, codes, side), model, cfg, n, what, log)
            result = append_pieces(model, found, n, _old_texts(cfg, codes, side, 0, KEEP))
            notes.append(_note(what, result))
            split = splitter(protos["src" if side != "tgt" else "tgt"])
            to_id = lambda p, s=split: s.piece_to_id(p)  # noqa: E731
            init += [_split_ids(split, p, to_id, old.specials.unk) for p in result.pieces]
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


def _grow_imported(old, cfg: Config, plan: Plan, codes: set[str], log, notes: list[str]
                   ) -> tuple[object, Rows, Rows]:
    """An imported M2M100/NLLB tokenizer (one vocabulary): language tokens at the old size, then pieces."""
    n = cfg.data.tokenizer.add_pieces
    files, settings = dict(old.files), dict(old.settings)
    size = settings["src_vocab_size"]
    languages = dict(old.languages)
    init = []
    for i, code in enumerate(plan.tokens):
        init.append(_init_language(code, plan, old.languages))
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
        found = [p for p in candidates(_texts(cfg, codes, "both"), model, cfg, n, "new-language", log)
                 if p not in have]  # (one vocabulary: the new languages' text on either side)
        result = append_pieces(model, found, n, _old_texts(cfg, codes, "both", 0, KEEP))
        notes.append(_note("new-language", result))
        pieces, files["sentencepiece.bpe.model"] = result.pieces, result.model
        init += [_split_ids(split, p, to_id, old.specials.unk) for p in pieces]
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


def _log_growth(cfg: Config, old, new, plan: Plan, codes: set[str], log: Callable[[str], None],
                notes: list[str]) -> None:
    """One line: what was added; one line: the pieces, and how new-language and held-out old-language
    text (training lines after the KEEP checked ones, when there are any) segment now."""
    tokens = ", ".join(f"{c} (id {new.languages[c]}, from {plan.init[c] or 'the mean of the language tokens'})"
                       for c in plan.tokens)
    grew = (new.src_vocab_size - old.src_vocab_size, new.tgt_vocab_size - old.tgt_vocab_size)
    log(f"add languages {', '.join(plan.init)}: language tokens {tokens or 'none'}; vocabulary {old.src_vocab_size}"
        f"/{old.tgt_vocab_size} -> {new.src_vocab_size}/{new.tgt_vocab_size} (+{grew[0]}/+{grew[1]} ids)")
    if not cfg.data.tokenizer.add_pieces:
        return
    parts = list(notes)
    for side, name, encode_old, encode_new in (("src", "source", old.encode_src, new.encode_src),
                                               ("tgt", "target", old.encode_tgt, new.encode_tgt)):
        held_out = _old_texts(cfg, codes, side, KEEP, KEEP + SAMPLE)
        if held_out:
            changed = sum(a != b for a, b in zip(encode_old(held_out), encode_new(held_out)))
            parts.append(f"{changed / len(held_out):.1%} of {len(held_out)} held-out old-language {name} lines "
                         "segmented differently")
        fresh = list(itertools.islice(_texts(cfg, codes, side)(), SAMPLE))
        if fresh:
            a, b = (sum(map(len, enc(fresh))) / len(fresh) for enc in (encode_old, encode_new))
            parts.append(f"new-language {name} lines {a:.1f} -> {b:.1f} tokens")
    log("add_pieces: " + "; ".join(parts))
