"""New pieces for a SentencePiece model (`data.tokenizer.add_pieces: N`), and the training text they come from.

The models that encode new-language text grow (joint: the one model; else source text -> source model,
target text -> target model). `candidates`: a SentencePiece model of the old one's type with 4N + 256 pieces
(fewer on little text) is trained on the new languages' training text (a seeded sample of at most
data.tokenizer.max_sentences lines); its pieces the old model lacks are ranked most frequent first (unigram:
by their count in that text; bpe: its characters by count, then its pieces in merge order).
`append_pieces` appends at most N of them:
- unigram (word, char): score = the score of the old model's best segmentation of the piece + 1, so that
  the new piece beats the split it replaces;
- bpe: a score below every existing piece (its merge comes after all old merges, in order); a piece is added
  only when one merge forms it, or it is one character the old model lacked (no more `<unk>`).
One model serves every language, so a new piece applies wherever its text occurs: a candidate the grown
model uses in old-language training text (KEEP lines per model, the first of each corpus and side in an old
language, in equal shares) is left out and the next one taken, until none is. Those lines segment exactly as
before, other old-language text almost always (the log gives the share of held-out lines that changed).
"""

from __future__ import annotations

import collections
import itertools
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence

from sentencepiece import sentencepiece_model_pb2 as pb

from nmt.config import Config, replace
from nmt.text.tokenizer import train_sentencepiece

TYPES = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}  # sentencepiece TrainerSpec.ModelType
NORMAL, CONTROL = pb.ModelProto.SentencePiece.NORMAL, pb.ModelProto.SentencePiece.CONTROL
KEEP = 40_000  # old-language lines per SentencePiece model whose segmentation the new pieces must not change
SAMPLE = 2000  # lines logged: new-language lines' length, and held-out old-language lines (after the KEEP)
MAX_ROUNDS = 50  # of leaving out the pieces old-language text uses and taking the next ones


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


# --------------------------------------------------------------------------- training text

def new_texts(cfg: Config, codes: set[str], side: str) -> Callable[[], Iterator[str]]:
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


def old_texts(cfg: Config, codes: set[str], side: str, start: int, stop: int) -> list[str]:
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
