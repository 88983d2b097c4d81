"""SentencePiece tokenization: train or load, encode, decode, serialize.

Every model used by nmt has the same fixed special ids (checked on load):
PAD_ID = 0, UNK_ID = 1, BOS_ID = 2, EOS_ID = 3. SentencePiece adds none of
them while encoding; `nmt.data.collate` adds EOS to sources and BOS/EOS to
targets.

A run directory holds `spm.model` (joint) or `spm.src.model` + `spm.tgt.model`.
`build_tokenizer` reuses those files when they exist (resume), else loads the
configured `.model` files or trains new models on the training corpus.
Training is deterministic: a seeded sample of at most `max_sentences`
sentences per model, and SentencePiece's own generator seeded as well.
"""

from __future__ import annotations

import io
import os
from typing import Callable, Iterable

import numpy as np
import sentencepiece as spm

from nmt.config import Config, TokenizerConfig
from nmt.errors import UserError

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
SPECIAL_IDS = frozenset((PAD_ID, BOS_ID, EOS_ID))  # dropped by decode (UNK is kept)
JOINT_FILE, SRC_FILE, TGT_FILE = "spm.model", "spm.src.model", "spm.tgt.model"


def _processor(proto: bytes, name: str) -> spm.SentencePieceProcessor:
    """A processor from a serialized model; UserError naming `name` if invalid."""
    sp = spm.SentencePieceProcessor()
    try:
        sp.LoadFromSerializedProto(proto)
    except Exception:  # sentencepiece raises RuntimeError/OSError for garbage
        raise UserError(f"{name}: not a valid SentencePiece model") from None
    found = (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id())
    if found != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
        raise UserError(
            f"{name}: SentencePiece special ids are pad={found[0]} unk={found[1]} bos={found[2]} "
            f"eos={found[3]}, but nmt needs pad=0 unk=1 bos=2 eos=3 "
            "(retrain with --pad_id=0 --unk_id=1 --bos_id=2 --eos_id=3)")
    return sp


def read_model_file(path: str) -> bytes:
    """The bytes of a `.model` file, checked to be a model with nmt's special ids."""
    if not os.path.isfile(path):
        raise UserError(f"SentencePiece model not found: {path}")
    with open(path, "rb") as f:
        proto = f.read()
    _processor(proto, path)
    return proto


class Tokenizer:
    """One joint or two (source, target) SentencePiece models.

    Encoding returns subword ids without specials; decoding drops PAD/BOS/EOS.
    `threads` is the number of threads SentencePiece uses for batch encoding.
    """

    def __init__(self, src_proto: bytes, tgt_proto: bytes | None = None, *, threads: int = 1):
        self.joint = tgt_proto is None
        self._src_proto, self._tgt_proto = src_proto, tgt_proto
        self._src = _processor(src_proto, "source SentencePiece model" if tgt_proto else "SentencePiece model")
        self._tgt = self._src if tgt_proto is None else _processor(tgt_proto, "target SentencePiece model")
        self.threads = threads

    @property
    def src_vocab_size(self) -> int:
        return self._src.vocab_size()

    @property
    def tgt_vocab_size(self) -> int:
        return self._tgt.vocab_size()

    def encode_src(self, lines: list[str]) -> list[list[int]]:
        """Source sentences -> subword ids (no BOS/EOS)."""
        return self._src.encode(list(lines), out_type=int, num_threads=self.threads)

    def encode_tgt(self, lines: list[str]) -> list[list[int]]:
        """Target sentences -> subword ids (no BOS/EOS)."""
        return self._tgt.encode(list(lines), out_type=int, num_threads=self.threads)

    def decode_tgt(self, ids: Iterable[Iterable[int]]) -> list[str]:
        """Target ids (lists, arrays or 1-D tensors) -> text; PAD, BOS and EOS are ignored."""
        clean = [[int(i) for i in seq if int(i) not in SPECIAL_IDS] for seq in ids]
        return self._tgt.decode(clean) if clean else []

    def is_target_symbol(self, text: str) -> bool:
        """True when `text` is one piece, never split, of the source and the target models
        (a SentencePiece user-defined symbol, such as a placeholder or a tag)."""
        return all(sp.piece_to_id(text) != UNK_ID and text in sp.encode(text, out_type=str)
                   for sp in (self._src, self._tgt))

    def src_pieces(self, line: str) -> list[str]:
        """Source subword pieces of one line (for inspection and logs)."""
        return self._src.encode(line, out_type=str)

    def to_bytes(self) -> dict:
        """Serialized models for a checkpoint: {'joint', 'src', 'tgt'} (tgt None when joint)."""
        return {"joint": self.joint, "src": self._src_proto, "tgt": self._tgt_proto}

    @classmethod
    def from_bytes(cls, d: dict, *, threads: int = 1) -> "Tokenizer":
        return cls(d["src"], None if d["joint"] else d["tgt"], threads=threads)

    def save(self, run_dir: str) -> None:
        """Write spm.model (joint) or spm.src.model + spm.tgt.model into run_dir, atomically."""
        os.makedirs(run_dir, exist_ok=True)
        files = [(JOINT_FILE, self._src_proto)] if self.joint else \
            [(SRC_FILE, self._src_proto), (TGT_FILE, self._tgt_proto)]
        for name, proto in files:
            path = os.path.join(run_dir, name)
            with open(path + ".tmp", "wb") as f:
                f.write(proto)
            os.replace(path + ".tmp", path)

    @classmethod
    def load(cls, run_dir: str, *, threads: int = 1) -> "Tokenizer | None":
        """The tokenizer saved in run_dir, or None if it holds none."""
        joint, src, tgt = (os.path.join(run_dir, n) for n in (JOINT_FILE, SRC_FILE, TGT_FILE))
        if os.path.isfile(joint):
            return cls(read_model_file(joint), threads=threads)
        if os.path.isfile(src) and os.path.isfile(tgt):
            return cls(read_model_file(src), read_model_file(tgt), threads=threads)
        return None


def sample_sentences(lines: list[str], max_sentences: int, seed: int) -> list[str]:
    """At most max_sentences non-empty lines, a seeded uniform sample in corpus order."""
    lines = [x for x in lines if x]
    if len(lines) <= max_sentences:
        return lines
    keep = np.sort(np.random.default_rng(seed).choice(len(lines), max_sentences, replace=False))
    return [lines[i] for i in keep]


def train_sentencepiece(lines: list[str], tok: TokenizerConfig, *, seed: int, what: str,
                        log: Callable[[str], None] = print) -> bytes:
    """Train one model on a seeded sample of `lines`; returns the serialized model.

    `what` names the model in messages ("joint", "source", "target"). If the
    corpus is too small for `tok.vocab_size`, retrains with a soft vocabulary
    limit (a smaller vocabulary) and logs it.
    """
    sample = sample_sentences(lines, tok.max_sentences, seed)
    if not sample:
        raise UserError(f"cannot train the {what} SentencePiece model: the training corpus has no text")
    options = dict(
        vocab_size=tok.vocab_size, model_type=tok.model_type,
        character_coverage=tok.character_coverage, num_threads=tok.threads,
        input_sentence_size=tok.max_sentences, shuffle_input_sentence=True,
        pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
        minloglevel=2,  # errors only: no training chatter on stderr
    )

    def run(**extra) -> bytes:
        spm.set_random_generator_seed(seed)
        out = io.BytesIO()
        spm.SentencePieceTrainer.train(sentence_iterator=iter(sample), model_writer=out, **options, **extra)
        return out.getvalue()

    try:
        try:
            proto = run()
        except RuntimeError as e:
            if "Vocabulary size too high" not in str(e):
                raise
            proto = run(hard_vocab_limit=False)
            size = spm.SentencePieceProcessor(model_proto=proto).vocab_size()
            log(f"tokenizer: vocab_size {tok.vocab_size} is too large for this corpus; "
                f"the {what} model has {size} pieces")
    except RuntimeError as e:
        reason = str(e).split("] ")[-1].strip().replace("\n", " ")
        raise UserError(f"SentencePiece could not train the {what} model on {len(sample)} sentences: "
                        f"{reason} (change data.tokenizer.vocab_size / character_coverage)") from None
    return proto


def build_tokenizer(cfg: Config, run_dir: str, log: Callable[[str], None] = print,
                    read_train: Callable[[], tuple[list[str], list[str]]] | None = None) -> Tokenizer:
    """The run's tokenizer: reuse run_dir's models, else load or train them, and save into run_dir.

    `read_train()` returns the training text (source lines, target lines); it
    is called only when a model must be trained. Default: read `cfg.data.train`.
    """
    tok = cfg.data.tokenizer
    found = Tokenizer.load(run_dir, threads=tok.threads)
    if found is not None:
        if found.joint != tok.joint:
            have = "a joint model" if found.joint else "separate source/target models"
            raise UserError(f"{run_dir} holds {have} but data.tokenizer.joint is {tok.joint}; "
                            "use a new run name or delete the run directory's spm*.model files")
        log(f"tokenizer: loaded from {run_dir} (vocab src {found.src_vocab_size}, tgt {found.tgt_vocab_size})")
        return found
    if tok.model or tok.src_model:
        if tok.joint:
            result = Tokenizer(read_model_file(tok.model), threads=tok.threads)
        else:
            result = Tokenizer(read_model_file(tok.src_model), read_model_file(tok.tgt_model), threads=tok.threads)
        log(f"tokenizer: loaded {tok.model or (tok.src_model + ', ' + tok.tgt_model)}")
    else:
        if read_train is None:
            from nmt.sources import read_corpus  # local: the tokenizer alone needs no data code
            src, tgt = read_corpus(cfg.data.train, cfg.data.src_lang, cfg.data.tgt_lang)
        else:
            src, tgt = read_train()
        if tok.joint:
            result = Tokenizer(train_sentencepiece(src + tgt, tok, seed=cfg.seed, what="joint", log=log),
                               threads=tok.threads)
        else:
            result = Tokenizer(train_sentencepiece(src, tok, seed=cfg.seed, what="source", log=log),
                               train_sentencepiece(tgt, tok, seed=cfg.seed, what="target", log=log),
                               threads=tok.threads)
        log(f"tokenizer: trained {tok.model_type} ({'joint' if tok.joint else 'separate'}), "
            f"vocab src {result.src_vocab_size}, tgt {result.tgt_vocab_size}")
    result.save(run_dir)
    return result
