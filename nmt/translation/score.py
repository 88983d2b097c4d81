"""Forced decoding (`nmt score`, `Translator.score`): the model's log-probability of given translations.

For each (source, target) pair the target is encoded, EOS appended, and every token's log-probability
is read off one teacher-forced pass (the fp32 log-softmax that search sums into `Hypothesis.log_prob`,
so a finished hypothesis scores exactly its `log_prob`). For back-translation filtering and n-best
reranking (as fairseq's --score-reference, Marian's scorer).

Output, one line per input pair, in order, tab-separated:

    LOG_PROB <tab> LOG_PROB_PER_TOKEN <tab> TOKENS

LOG_PROB: the natural-log sum over the target tokens and EOS; TOKENS: their number (an empty target
has 1); a multilingual model's language token comes first and counts too. Every pair is scored,
empty lines too. A model trained with data.protect scores pairs as translation sees them (`--protect`
by default for it). Sources and targets longer than max_positions - 1 tokens are truncated (one
warning counts them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from nmt.text import protect
from nmt.config import DecodeConfig
from nmt.errors import UserError
from nmt.text.languages import target_prefix


@dataclass(frozen=True)
class PairScore:
    log_prob: float  # summed over the target tokens and EOS (and a multilingual model's language token first)
    n_tokens: int  # those tokens: target tokens + EOS (+ the language token)
    truncated: bool = False  # the source or the target was cut to the model's maximum length

    @property
    def per_token(self) -> float:
        return self.log_prob / self.n_tokens

    def format(self) -> str:
        return f"{self.log_prob:.6f}\t{self.per_token:.6f}\t{self.n_tokens}"


def score_pairs(engine, src_lines: Sequence[str], tgt_lines: Sequence[str], decode: DecodeConfig | None = None,
                on_batch=None) -> list[PairScore]:
    """A PairScore per pair, in order. Batching, workers, the target language and protect follow `decode`
    (default: the engine's decode settings)."""
    from nmt.translation.batching import run_engine

    if len(src_lines) != len(tgt_lines):
        raise UserError(f"{len(src_lines)} sources but {len(tgt_lines)} targets: the line counts must match")
    decode = decode or engine.decode
    limit = engine.max_positions - 1
    lang = target_prefix(engine.tokenizer, decode.tgt_lang)  # a multilingual model's language token comes first
    if decode.protect:  # as translation masks them (nmt/text/protect.py)
        src_lines, tgt_lines = _masked(engine.tokenizer, src_lines, tgt_lines, decode.protect_pattern)
    src_full = engine.tokenizer.encode_src(list(src_lines), decode.src_lang)
    tgt_full = [lang + ids for ids in engine.tokenizer.encode_tgt(list(tgt_lines))]
    src_ids, tgt_ids = [ids[:limit] for ids in src_full], [ids[:limit] for ids in tgt_full]
    lengths = [max(len(s), len(t)) + 1 for s, t in zip(src_ids, tgt_ids)]
    out: list[PairScore | None] = [None] * len(src_lines)
    fn = lambda batch: engine.score_batch([src_ids[i] for i in batch], [tgt_ids[i] for i in batch])  # noqa: E731
    for batch, rows in run_engine(engine, fn, lengths, decode, on_batch):
        for i, row in zip(batch, rows):
            out[i] = PairScore(float(sum(row)), len(row), len(src_full[i]) > limit or len(tgt_full[i]) > limit)
    return out  # type: ignore[return-value]


def _masked(tokenizer, src_lines, tgt_lines, pattern: str | None) -> tuple[list[str], list[str]]:
    if not protect.known_by(tokenizer):
        raise UserError("--protect needs a model trained with data.protect: true (its SentencePiece model has no "
                        "placeholder tokens <ph_0> ... <ph_15>)")
    pairs = [protect.mask_for_scoring(a, b, pattern) for a, b in zip(src_lines, tgt_lines)]
    return [a for a, _ in pairs], [b for _, b in pairs]
