"""What a search is asked and what it returns: `SearchOptions` (the settings, fixed for a run of
batches), `SearchInputs` (the data of one batch), `Hypothesis` (a result), `SearchOps` (the tensor
operations it runs on) and the two formulas both engines share (`max_output_lengths`,
`length_penalty_factor`).

Settings at construction, data per call (fairseq's `SequenceGenerator.__init__` then `generate`;
CTranslate2's one `TranslationOptions` struct carried down to the search): the options are built
once from the decode settings (`SearchOptions.from_decode`) and passed down as they are, to
`nmt.search.search` or either engine (`search_batch`); what differs per sentence travels in
`SearchInputs`. The step rules of one batch are built from both by `nmt.search.rules.StepRules`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Callable, Sequence

import torch
from torch import Tensor

from nmt.search.cache import DecoderCache
from nmt.text.languages import contrast_tokens, free_prefix
from nmt.layout import NMT_SPECIALS, Specials
from nmt.text.protect import target_placeholders
from nmt.schema import GLOSSARY_MARGIN, max_finished

if TYPE_CHECKING:
    from nmt.config import DecodeConfig
    from nmt.search.joining import StepPool

PENALTY_TYPES = ("gnmt", "average", "none")
STOPPING = ("exact", "hf")
SAMPLING = ("topk", "topp")
Cancel = Callable[[], bool]  # checked before every decoding step: True stops the search (nmt.errors.Cancelled)
# on_final(b, hypotheses): sentence b's hypotheses, as the search returns them, as soon as they are final (a
# finished sentence leaves the batch); called once per sentence, the last ones as the search ends
Final = Callable[[int, list], None]
NEG_INF = float("-inf")
# What a search can be asked beyond plain greedy and beam search, and how a user asks for it: an engine
# declares the ones it searches (`Engine.supports`, nmt/translation/engine.py); the others are refused by name.
FEATURES = {
    "sampling": "--sampling",
    "contrast": "--contrast-lang",
    "hf_stopping": "--stopping hf with a length penalty",
    "patience_gnmt": "--patience with the gnmt length penalty",
    "terms": "a glossary",
    "alignment": "--alignment",
}


@dataclass(frozen=True)
class Hypothesis:
    """One output. tokens: generated ids without BOS/EOS; log_prob: summed token
    log-probabilities (EOS included when it was generated); score: log_prob after the length
    penalty; finished: it ended with EOS (False: it stopped at the maximum length)."""

    tokens: list[int]
    score: float
    log_prob: float
    finished: bool = True


@dataclass(frozen=True)
class SearchOps:
    """The tensor operations the search relies on: torch's (`PLAIN_OPS`), or nmt/search/fast.py's faster
    CPU versions with the same results. topk(x [N,C], K) -> (values, indices) [N,K], best first;
    argmax(x [N,C]) -> (values, indices) [N]; cache_cls: the DecoderCache class; decoder_cls: the cached
    decoder (None: nmt/search/decoding.py's; nmt/search/cuda_graphs.py's `GraphedDecoder` on CUDA); steps: a
    `StepPool` (nmt/search/joining.py) that joins the decoding steps of searches running at once in other
    threads (decoding.py's cached decoder only), or None."""

    topk: Callable[[Tensor, int], tuple[Tensor, Tensor]] = lambda x, k: x.topk(k, dim=1)
    argmax: Callable[[Tensor], tuple[Tensor, Tensor]] = lambda x: x.max(dim=1)
    cache_cls: type = DecoderCache
    decoder_cls: type | None = None
    steps: StepPool | None = None

    def top(self, x: Tensor, K: int) -> tuple[Tensor, Tensor]:
        """`topk` of x [N,C] for any K: padded with -inf (index 0) where C < K (tiny vocabularies)."""
        if x.shape[1] >= K:
            return self.topk(x, K)
        top, idx = x.topk(x.shape[1], dim=1)
        pad = K - top.shape[1]
        return torch.nn.functional.pad(top, (0, pad), value=NEG_INF), torch.nn.functional.pad(idx, (0, pad))


PLAIN_OPS = SearchOps()


@dataclass(frozen=True, kw_only=True)
class SearchOptions:
    """The settings of a search (conventions: nmt/search/__init__.py), checked when built (ValueError).
    Greedy when beam_size == 1, sampling when `sampling` is not "none".

    Beam search: beam_size, nbest, length_penalty(_type), `patience` (> 0: also stop after
    `max_finished(K, patience)` endings), `stopping`, `keep_all` (every finished hypothesis:
    nmt/translation/tune.py; needs "exact"). Sampling: topk, topp, temperature, seed. Every search: the
    length limit max_len_a * source length + max_len_b, min_len, no_repeat_ngram, glossary_margin, the
    tokenizer's `specials`, `free_prefix` (leading forced tokens that count 0), `placeholder_tokens` (per
    <ph_k> its target ids), `use_cache` (False: re-decode the whole prefix each step, the reference path),
    `contrast_tokens`, `contrast_weight` (nmt/search/decoding.py `contrast`)."""

    beam_size: int = 1
    nbest: int = 1
    length_penalty: float = 1.0
    length_penalty_type: str = "gnmt"
    patience: float = 0.0
    stopping: str = "exact"
    keep_all: bool = False
    sampling: str = "none"
    topk: int = 10
    topp: float = 0.9
    temperature: float = 1.0
    seed: int = 1
    max_len_a: float
    max_len_b: int
    min_len: int = 0
    no_repeat_ngram: int = 0
    glossary_margin: float = GLOSSARY_MARGIN
    specials: Specials = NMT_SPECIALS
    free_prefix: int = 0
    placeholder_tokens: tuple[tuple[int, ...], ...] | None = None
    use_cache: bool = True
    contrast_tokens: tuple[int, ...] = ()
    contrast_weight: float = 0.0

    def __post_init__(self) -> None:
        _check_common(self)
        if self.sampling != "none":
            _check_sampling(self)
        else:
            _check_beam(self)

    @classmethod
    def from_decode(cls, decode: DecodeConfig, tokenizer) -> SearchOptions:
        """The search settings of `decode` (a checked DecodeConfig) for a model with this tokenizer
        (its special ids, its free language token, its placeholder tokens with decode.protect)."""
        sampling, contrast = decode.sampling, decode.contrast
        return cls(beam_size=decode.beam_size, nbest=decode.nbest, length_penalty=decode.length_penalty,
                   length_penalty_type=decode.length_penalty_type, patience=decode.patience,
                   stopping=decode.stopping, sampling=sampling.method, topk=sampling.topk, topp=sampling.topp,
                   temperature=sampling.temperature, seed=sampling.seed, max_len_a=decode.max_len_a,
                   max_len_b=decode.max_len_b, min_len=decode.min_len, no_repeat_ngram=decode.no_repeat_ngram,
                   glossary_margin=decode.glossary.margin, specials=tokenizer.specials,
                   free_prefix=free_prefix(tokenizer, []),  # ([]: any prefix) it applies where a sentence has one
                   placeholder_tokens=target_placeholders(tokenizer) if decode.protect else None,
                   contrast_tokens=contrast_tokens(tokenizer, contrast.lang, decode.tgt_lang, contrast.weight),
                   contrast_weight=contrast.weight)

    def features(self) -> set[str]:
        """The `FEATURES` these settings use (glossary terms and alignment come with the inputs)."""
        return features(beam_size=self.beam_size, length_penalty=self.length_penalty,
                        length_penalty_type=self.length_penalty_type, stopping=self.stopping, patience=self.patience,
                        sampling=self.sampling, contrast=bool(self.contrast_tokens))

    @property
    def rows_per_sentence(self) -> int:
        """Decoder rows a sentence takes at most: its samples or its beams."""
        return self.nbest if self.sampling != "none" else self.beam_size


@dataclass(frozen=True)
class Terms:
    """The lexical constraints of a batch (glossary terms, nmt/search/constraints.py): seqs[b], the target id
    sequences sentence b's output must contain (may be empty); open_end[b][c], whether term c ends
    inside a word (then it only counts where the word ends: `joins`); joins: per target id, whether it
    continues the word before it (`nmt.text.glossary.joining_tokens`)."""

    seqs: Sequence[Sequence[Sequence[int]]]
    open_end: Sequence[Sequence[bool]] | None = None
    joins: Sequence[bool] | None = None

    def __len__(self) -> int:
        return len(self.seqs)

    def __getitem__(self, part: slice) -> Terms:
        return Terms(self.seqs[part], None if self.open_end is None else self.open_end[part], self.joins)


@dataclass(frozen=True)
class SearchInputs:
    """The per-sentence data of one batch (each field None, or one entry per sentence). prefixes: target ids
    forced first. placeholders: the k of each <ph_k> in the sentence's source, each written exactly once
    (TorchEngine fills them). keys: integers that, with the seed, fix the samples (default 0..B-1).
    constraints: the terms each output must contain (a `Terms`, or per sentence its id sequences; not
    with sampling). A batch without constraints is searched exactly as before."""

    prefixes: Sequence[list[int]] | None = None
    placeholders: Sequence[Sequence[int]] | None = None
    keys: Sequence[int] | None = None
    constraints: Terms | Sequence[Sequence[Sequence[int]]] | None = None

    def take(self, part: slice) -> SearchInputs:
        """The inputs of sentences `part` of the batch."""
        given = {f.name: getattr(self, f.name) for f in fields(self)}  # (every field: one entry per sentence)
        return SearchInputs(**{name: None if x is None else x[part] for name, x in given.items()})

    def check(self, B: int, options: SearchOptions) -> None:
        """ValueError unless these inputs fit a batch of B sentences searched with `options`."""
        for f in fields(self):
            name, given = f.name, getattr(self, f.name)
            if given is not None and len(given) != B:
                raise ValueError(f"{len(given)} {name} for {B} sentences")
        specials = options.specials
        if self.prefixes is not None and any(t in (specials.pad, specials.start, specials.eos)
                                             for p in self.prefixes for t in p):
            raise ValueError("a prefix cannot contain PAD, the start token or EOS")
        if self.constraints is not None and any(self.constraints_of()) and options.sampling != "none":
            raise ValueError("lexical constraints (a glossary) are not searched with sampling: use greedy or beam search")

    def constraints_of(self) -> Sequence[Sequence[Sequence[int]]]:
        """Per sentence its constraints' target id sequences ([] for none)."""
        c = self.constraints
        return [] if c is None else c.seqs if isinstance(c, Terms) else c


NO_INPUTS = SearchInputs()


class Rule:
    """One restriction of what the search generates. Every method has a no-op default: a rule
    overrides what it uses. Row state (anything per row) is the rule's own: `start` creates it,
    `advance` and `reorder` keep it in step with the search's rows."""

    def start(self, sent: Tensor, V: int) -> None:
        """Rows of sentences sent [R], nothing generated yet; V: the model's output size."""

    def removes(self, t: int) -> int:
        """At most how many tokens of a row `mask` removes at step t (a row may be left with none
        when the rules together remove V)."""
        return 0

    def mask(self, logits: Tensor, t: int) -> None:
        """Set what the rule forbids at step t to -inf in logits [R,V] (before the softmax)."""

    def mask_log_probs(self, logp: Tensor, t: int) -> None:
        """Change the step's log-probabilities logp [R,V] in place (after the softmax)."""

    def advance(self, tokens: Tensor) -> None:
        """Each row generated tokens [R]."""

    def reorder(self, rows: Tensor) -> None:
        """Row i becomes old row rows[i] [R']."""

    def exempt(self, V: int) -> Tensor | None:
        """[R,V] bool: tokens other rules must not forbid (n-gram blocking asks), or None."""
        return None

    # ---- a rule that needs tokens written before the length limit (placeholders, glossary terms)
    needs = False  # True: the rule implements the four methods below and `tokens_needed`

    def pending(self) -> Tensor:
        """[R] bool: the row still needs something written."""
        raise NotImplementedError

    def missing(self) -> Tensor:
        """[R] long: tokens the row needs at least."""
        raise NotImplementedError

    def budget(self) -> Tensor:
        """[R] long: tokens the row may need after a free token (what the length budget reserves)."""
        raise NotImplementedError

    def forced(self, V: int, others: Tensor) -> tuple[Tensor, Tensor]:
        """(allowed [R,V] bool: the tokens a row that must write now may write; exclusive [R]: only
        these, no other rule's). others [R]: what the other rules still miss."""
        raise NotImplementedError

    def tokens_needed(self) -> list[int]:
        """Per sentence the tokens its outputs must hold (the room a limit must leave)."""
        return []

    # ---- beam search
    constrained: Sequence[bool] | None = None  # sentences whose beams the rule allocates (`candidates`)

    def candidates(self, cand: Tensor, K: int, ops: SearchOps) -> tuple[Tensor, Tensor] | None:
        """The top 2K of cand [N, k*V] in the order the search takes them (`ops`: its top-k), or None (plain top-k)."""
        return None

    def empty_slots(self, word: Tensor, t: int, K: int) -> Tensor | None:
        """[N, 2K] bool: candidates that leave their beam slot empty at step t, or None."""
        return None


def features(*, beam_size: int, length_penalty: float, length_penalty_type: str, stopping: str, patience: float,
             sampling: str, contrast: bool) -> set[str]:
    """The `FEATURES` a search with these settings uses (`contrast`: it contrasts languages)."""
    penalty = beam_size > 1 and length_penalty_type != "none" and length_penalty > 0
    used = {"sampling"} if sampling != "none" else set()
    used |= {"contrast"} if contrast else set()
    used |= {"hf_stopping"} if stopping == "hf" and penalty else set()
    return used | ({"patience_gnmt"} if patience and penalty and length_penalty_type == "gnmt" else set())


def _check_common(o: SearchOptions) -> None:
    if o.min_len < 0:
        raise ValueError(f"min_len must be >= 0, got {o.min_len}")
    if o.no_repeat_ngram < 0:
        raise ValueError(f"no_repeat_ngram must be >= 0, got {o.no_repeat_ngram}")
    if not o.glossary_margin >= 0:  # (NaN too)
        raise ValueError(f"glossary_margin must be >= 0, got {o.glossary_margin}")
    if o.beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {o.beam_size}")
    if not 0.0 <= o.contrast_weight * max(1, len(o.contrast_tokens)) < 1.0:  # (NaN too)
        raise ValueError(f"contrast_weight times the number of contrast languages must be in [0, 1), got "
                         f"{o.contrast_weight} x {len(o.contrast_tokens)}")
    if o.length_penalty_type not in PENALTY_TYPES:
        raise ValueError(f"unknown length_penalty_type {o.length_penalty_type!r} "
                         f"(expected one of {', '.join(PENALTY_TYPES)})")
    if o.length_penalty < 0:
        raise ValueError(f"length_penalty must be >= 0, got {o.length_penalty}")
    if o.stopping not in STOPPING:
        raise ValueError(f"unknown stopping {o.stopping!r} (expected one of {', '.join(STOPPING)})")
    if o.keep_all and o.stopping != "exact":
        raise ValueError("keep_all needs stopping='exact' (the hf rule depends on the length penalty)")


def _check_sampling(o: SearchOptions) -> None:
    if o.sampling not in SAMPLING:
        raise ValueError(f"unknown sampling {o.sampling!r} (expected none or one of {', '.join(SAMPLING)})")
    if o.nbest < 1 or o.topk < 1 or not 0.0 < o.topp <= 1.0 or not o.temperature > 0.0:
        raise ValueError(f"need samples (nbest) >= 1, topk >= 1, 0 < topp <= 1, temperature > 0; got {o.nbest}, "
                         f"{o.topk}, {o.topp}, {o.temperature}")


def _check_beam(o: SearchOptions) -> None:
    if not 1 <= o.nbest <= o.beam_size:
        raise ValueError(f"nbest must be between 1 and beam_size={o.beam_size}, got {o.nbest}")
    if not o.patience >= 0 or (o.beam_size > 1 and o.patience > 0 and max_finished(o.beam_size, o.patience) < 1):
        raise ValueError(f"patience must be 0 or leave round(beam_size * patience) >= 1, got {o.patience}")


def max_output_lengths(src_lengths: Sequence[int] | Tensor, max_len_a: float, max_len_b: int,
                       max_positions: int, prefixes: Sequence[list[int]] | None = None) -> list[int]:
    """Maximum output length per sentence, EOS counted: min(floor(a * src_len + b), max_positions - 1),
    at least 1, and with a prefix at least len(prefix) + 1 (room for the prefix and an EOS); src_len
    counts the source's EOS (the engines share this formula)."""
    lengths = src_lengths.tolist() if isinstance(src_lengths, Tensor) else list(src_lengths)
    cap = max(max_positions - 1, 1)
    limits = [max(1, min(math.floor(max_len_a * n + max_len_b), cap)) for n in lengths]
    if prefixes is not None:
        limits = [min(max(n, len(p) + 1), cap) for n, p in zip(limits, prefixes)]
    return limits


def room_needed(prefix_len: int, terms: Sequence[Sequence[int]], placeholders: int) -> int:
    """Output tokens a sentence with these terms needs at least: its prefix, every term's tokens, its
    placeholders and an EOS (0 without terms: nothing to raise)."""
    return prefix_len + sum(len(t) for t in terms) + placeholders + 1 if terms else 0


def room_for_terms(limits: Sequence[int], needed: Sequence[int], max_positions: int) -> list[int]:
    """The limits raised to the room each sentence's terms need (`needed`: its prefix, its terms'
    tokens, its placeholders and an EOS), as a prefix raises them; ValueError where the model's
    positions cannot hold it."""
    cap = max(max_positions - 1, 1)
    for b, n in enumerate(needed):
        if n > cap:
            raise ValueError(f"sentence {b}: its glossary terms (with its prefix and placeholders) need {n} "
                             f"output tokens, more than the model's {cap}")
    return [max(limit, n) for limit, n in zip(limits, needed)]


def length_penalty_factor(length: int | Tensor, alpha: float, kind: str) -> float | Tensor:
    """Divisor of a hypothesis' log_prob; length = generated tokens including EOS.

    gnmt: ((5 + length) / 6) ** alpha (Wu et al., 2016); average: length ** alpha; none: 1.
    Non-decreasing in length for alpha >= 0 (beam search's early stop relies on it).
    """
    if kind == "none" or alpha == 0:
        return torch.ones_like(length, dtype=torch.float) if isinstance(length, Tensor) else 1.0
    if kind == "gnmt":
        return ((5 + length) / 6) ** alpha
    if kind == "average":
        return length ** alpha
    raise ValueError(f"unknown length_penalty_type {kind!r} (expected one of {', '.join(PENALTY_TYPES)})")
