"""A small language identifier trained from the training corpora themselves, to count off-target
outputs (translations in the wrong language).

Multinomial naive Bayes over character 1-4-grams with add-one smoothing, uniform priors:

    text -> " " + lower-cased words joined by one space + " " -> every n-gram, n in `orders`
    score(lang) = sum over the text's n-grams g known to the model of log P(g | lang)
    P(g | lang) = (count(g, lang) + alpha) / (total(lang) + alpha * V)

Only the `max_ngrams` most frequent n-grams of each language are kept; V counts the distinct kept
n-grams; n-grams no language kept are ignored. Why this model: data/gettext/README.md.

    ident = LanguageIdentifier.train({"en": en_lines, "de": de_lines, "ja": ja_lines})
    ident.predict("Datei öffnen")          -> "de"
    off_target(hyps, "de", ident)           -> (count, 1-based line numbers of non-German lines)

`nmt train` trains one per run when `wanted` says so (`for_run`) and stores it in every checkpoint
(`langid`, `to_dict()`); validation and `nmt evaluate` count off-target outputs with it.
"""

from __future__ import annotations

import collections
import itertools
from typing import Iterable, Mapping, Sequence

import numpy as np

from nmt.errors import UserError
from nmt.text.languages import target_languages

FORMAT = "nmt-langid-nb/1"
MARGIN = 10.0  # off_target's default margin (nats); how it was chosen: data/gettext/README.md


def ngrams(text: str, orders: Sequence[int]) -> list[str]:
    """The character n-grams of `text` (lower-cased, whitespace runs -> one space, padded with spaces)."""
    padded = " " + " ".join(text.lower().split()) + " "
    return [padded[i:i + n] for n in orders for i in range(len(padded) - n + 1)]


class LanguageIdentifier:
    """Naive Bayes over character n-grams (module docstring). Build with `train` or `from_dict`."""

    def __init__(self, profiles: Mapping[str, tuple[Sequence[str], Sequence[int], int]],
                 orders: Sequence[int] = (1, 2, 3, 4), alpha: float = 1.0):
        """profiles: {lang: (kept n-grams, their counts, total n-gram count of the training lines)}."""
        if not profiles:
            raise UserError("language identifier: no languages")
        self.langs = sorted(profiles)
        self.orders = tuple(int(n) for n in orders)
        self.alpha = float(alpha)
        self.profiles = {lang: (list(g), [int(c) for c in n], int(t)) for lang, (g, n, t) in profiles.items()}
        vocab = sorted(set(itertools.chain.from_iterable(g for g, _, _ in self.profiles.values())))
        self.index = {g: i for i, g in enumerate(vocab)}
        counts = np.zeros((len(self.langs), len(vocab)), dtype=np.float64)
        denominators = np.zeros((len(self.langs), 1), dtype=np.float64)
        for row, lang in enumerate(self.langs):
            grams, freqs, total = self.profiles[lang]
            counts[row, [self.index[g] for g in grams]] = freqs
            denominators[row] = total + self.alpha * len(vocab)
        self.log_prob = np.log((counts + self.alpha) / denominators).astype(np.float32)  # [L, V]

    @classmethod
    def train(cls, corpora: Mapping[str, Iterable[str]], orders: Sequence[int] = (1, 2, 3, 4),
              max_ngrams: int = 20000, alpha: float = 1.0, max_lines: int | None = 50000) -> LanguageIdentifier:
        """Count the n-grams of the first `max_lines` lines of each language (None: all) and keep the
        `max_ngrams` most frequent per language (ties: the smaller n-gram)."""
        profiles = {}
        for lang, lines in corpora.items():
            counter: collections.Counter = collections.Counter()
            for line in itertools.islice(lines, max_lines):
                counter.update(ngrams(line, orders))
            if not counter:
                raise UserError(f"language identifier: no training text for {lang!r}")
            kept = sorted(counter.items(), key=lambda item: (-item[1], item[0]))[:max_ngrams]
            profiles[lang] = ([g for g, _ in kept], [c for _, c in kept], sum(counter.values()))
        return cls(profiles, orders, alpha)

    def scores(self, text: str) -> np.ndarray | None:
        """Log-likelihood of `text` under each language of `self.langs` (float32 [L]), or None when
        the text shares no n-gram with the model."""
        ids = [i for i in (self.index.get(g) for g in ngrams(text, self.orders)) if i is not None]
        return self.log_prob[:, ids].sum(axis=1) if ids else None

    def predict(self, text: str) -> str | None:
        """The most likely language, or None when the text shares no n-gram with the model (e.g. empty)."""
        scores = self.scores(text)
        return None if scores is None else self.langs[int(np.argmax(scores))]

    def to_dict(self) -> dict:
        """Plain Python types only (str, int, float, list, dict), so it can be stored in a checkpoint
        that torch.load(..., weights_only=True) reads."""
        return {"format": FORMAT, "orders": list(self.orders), "alpha": self.alpha,
                "profiles": {lang: {"ngrams": list(g), "counts": list(c), "total": t}
                             for lang, (g, c, t) in self.profiles.items()}}

    @classmethod
    def from_dict(cls, d: Mapping) -> LanguageIdentifier:
        if not isinstance(d, Mapping) or d.get("format") != FORMAT:
            raise UserError(f"not a language identifier of format {FORMAT}")
        try:
            profiles = {lang: (p["ngrams"], p["counts"], p["total"]) for lang, p in d["profiles"].items()}
            return cls(profiles, d["orders"], d["alpha"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise UserError(f"damaged language identifier ({type(exc).__name__}: {exc})") from None


def off_target(hyps: Sequence[str], lang: str, identifier: LanguageIdentifier,
               margin: float = MARGIN) -> tuple[int, list[int]]:
    """Count the outputs in another language than `lang`: (count, 1-based line numbers, as in
    nmt.evaluation.degeneration). A line is off-target when some language's log-likelihood beats `lang`'s by
    more than `margin` nats (a prior in favour of the expected language: short, ambiguous lines are
    given the benefit of the doubt, whole sentences in another language are not; see MARGIN).
    Lines without a letter (empty, numbers, punctuation) are never off-target."""
    if lang not in identifier.langs:
        raise UserError(f"the language identifier knows {', '.join(identifier.langs)}, not {lang!r}")
    row = identifier.langs.index(lang)
    lines = []
    for i, hyp in enumerate(hyps):
        scores = identifier.scores(hyp) if any(ch.isalpha() for ch in hyp) else None
        if scores is not None and float(scores.max() - scores[row]) > margin:
            lines.append(i + 1)
    return len(lines), lines


# --------------------------------------------------------------------------- a run's identifier

def wanted(cfg, tokenizer) -> bool:
    """Whether a run trains an identifier: `data.langid`, or when that is null, a multilingual model
    (a tokenizer with target-language tokens)."""
    return cfg.data.langid if cfg.data.langid is not None else target_languages(tokenizer).multilingual


def run_texts(cfg) -> dict[str, list]:
    """{language: [(corpus, side), ...]}: where each language of the training corpora occurs (the
    source side of corpora with that src_lang, the target side of those with that tgt_lang), in
    corpus order; corpora with weight 0 are left out."""
    d = cfg.data
    texts: dict[str, list] = {}
    for c in d.train_corpora:
        if c.weight > 0:
            src, tgt = d.langs(c)
            texts.setdefault(src, []).append((c, "src"))
            texts.setdefault(tgt, []).append((c, "tgt"))
    return texts


def for_run(cfg, max_lines: int = 50000) -> LanguageIdentifier:
    """An identifier of the languages of the run's training corpora, trained on the first `max_lines`
    non-empty lines of each (streamed; `run_texts`)."""
    from nmt.text.sources import iter_side

    d = cfg.data

    def lines(places: list) -> Iterable[str]:
        for corpus, side in places:
            yield from (x for x in iter_side(corpus, side, *d.langs(corpus)) if x)
    return LanguageIdentifier.train({lang: lines(places) for lang, places in run_texts(cfg).items()},
                                    max_lines=max_lines)
