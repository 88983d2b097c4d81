"""The tokenizer interface: what nmt's code uses of a tokenizer, and what both families share.

Two families implement `TokenizerLike`: nmt's own SentencePiece models (`nmt.text.tokenizer.Tokenizer`,
kind "spm") and the adapters of imported Hugging Face models (`nmt.text.hf_tokenizer`: kinds "marian",
"m2m100", "nllb"). Code that takes either family reads these members directly, never by probing
(`tokenizer.kind`, not `getattr(tokenizer, "kind", "spm")`): a stored tokenizer's kind is read by
`nmt.text.tokenizer.Tokenizer.from_bytes` alone; tests/test_hf_import.py checks that
both families declare every member. `load_sentencepiece` is the one loader of a serialized
SentencePiece model for both.
"""

from __future__ import annotations

from typing import Iterable, Protocol, runtime_checkable

import sentencepiece as spm

from nmt.errors import UserError
from nmt.layout import Specials

WORD_START = "\u2581"  # SentencePiece's whitespace mark


@runtime_checkable
class TokenizerLike(Protocol):
    """A model's tokenizer. Encoding returns subword ids without BOS/EOS (nmt/layout.py adds them);
    decoding drops the special ids and the language tokens."""

    kind: str  # "spm" (nmt's own), "marian", "m2m100" or "nllb" (imported: nmt/text/hf_tokenizer.py)
    specials: Specials  # pad, unk, decoder start and eos ids
    languages: dict[str, int]  # a multilingual model's target languages: {code: id of its language token}; {} if none
    default_tgt_lang: str | None  # the target language used when none is asked for
    free_language_token: bool  # the forced language token counts log-prob 0 in searches (nmt/text/languages.py)
    source_languages: bool  # every source starts with a language token, one of `languages` (imported M2M100/NLLB)
    joint: bool  # one vocabulary for both sides
    threads: int  # threads for batch encoding

    @property
    def src_vocab_size(self) -> int:
        """The model's source vocabulary size (its embedding rows)."""

    @property
    def tgt_vocab_size(self) -> int:
        """The model's target vocabulary size (its output size)."""

    def encode_src(self, lines: list[str], src_lang: str | None = None) -> list[list[int]]:
        """Source sentences -> ids (no EOS). With `source_languages` the token of `src_lang` comes first
        (None: the model's default, its data.src_lang); the others ignore src_lang."""

    def encode_tgt(self, lines: list[str]) -> list[list[int]]:
        """Target sentences -> ids (no BOS/EOS)."""

    def decode_tgt(self, ids: Iterable[Iterable[int]]) -> list[str]:
        """Target ids -> text, without the special ids and the language tokens."""

    def is_target_symbol(self, text: str) -> bool:
        """Whether `text` alone is one known token of both vocabularies (placeholders, term markers)."""

    def src_pieces(self, line: str) -> list[str]:
        """The source pieces of one line (for messages)."""

    def vocab_pieces(self) -> tuple[list[str], list[str]]:
        """(source, target) piece of every id, in id order."""

    def to_bytes(self) -> dict:
        """The checkpoint's `tokenizer` entry (`nmt.text.tokenizer.Tokenizer.from_bytes` reads either family)."""

    def save(self, directory: str, settings: dict | None = None, /) -> None:
        """Write the tokenizer's files into `directory` (`nmt.text.tokenizer.Tokenizer.load` reads either family;
        `settings`: nmt's spm.json, which the imported families do not write)."""


def load_sentencepiece(proto: bytes, name: str) -> spm.SentencePieceProcessor:
    """A processor from a serialized model; UserError naming `name` if invalid."""
    sp = spm.SentencePieceProcessor()
    try:
        sp.LoadFromSerializedProto(proto)
    except Exception:  # sentencepiece raises RuntimeError/OSError for garbage
        raise UserError(f"{name}: not a valid SentencePiece model") from None
    return sp
