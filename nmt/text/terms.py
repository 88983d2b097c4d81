"""Terms for training: inline annotation (Dinu et al., 2019) and a dictionary extracted from a corpus.

Annotation (`annotate`): after each matched source term the line gets its target term between two
markers, `source term <term> target term </term>`:

    el perro come  ->  el perro <term> dog </term> come

`<term>` and `</term>` (TERM_SYMBOLS) are SentencePiece user-defined symbols of a model trained with
`data.terms > 0`. `TermAnnotator` annotates a share of the pairs an entry applies to (its source term
matches in the source, nmt/text/glossary.py's whole-word rule, and its target term is in the target).
With data.protect the pair is masked first, then annotated.

Extraction (`extract_dictionary`, `data.term_dictionary: null`, scripts/extract_glossary.py): single
words w (source) and v (target), each in at least `min_count` lines and not among the `stopwords` most
frequent of its side, that occur together in c lines with c / df(w) >= min_share and
c / df(v) >= min_share; Dice 2c / (df(w) + df(v)) ranks them and each word enters one entry at most
(competitive linking), rarest source word first. Scripts without spaces between words give no
entries. Words translated by themselves (names, identifiers) are left out unless
`data.term_identical`.
"""

from __future__ import annotations

import bisect
import collections
import random
import re
import zlib
from typing import Callable, Iterable, Sequence

from nmt.schema import TERM_END, TERM_START, TERM_SYMBOLS
from nmt.text.glossary import Entry, Glossary, Match, appearing, unit_keys

EXTRACT_VERSION = 2  # part of the training cache key: bump when the training dictionary changes (2: data.term_identical)


def annotate(line: str, matches: Sequence[Match]) -> str:
    """`line` with ` <term> TARGET </term>` inserted after each match (by position, not overlapping)."""
    out, last = [], 0
    for m in sorted(matches, key=lambda m: m.start):
        out += [line[last:m.end], f" {TERM_START} {m.entry.target} {TERM_END}"]
        last = m.end
    out.append(line[last:])
    return "".join(out)


def known_by(tokenizer) -> bool:
    """Whether the tokenizer has both markers as one symbol each (a model trained with data.terms)."""
    return all(tokenizer.is_target_symbol(s) for s in TERM_SYMBOLS)


def annotate_pair(src: str, tgt: str, glossary: Glossary, share: float) -> str:
    """The training source of a pair: annotated with the matches whose target term appears in `tgt`,
    with probability `share` (drawn from the source text, so a pair always comes out the same)."""
    if share <= 0 or random.Random(zlib.crc32(("terms\t" + src).encode("utf-8"))).random() >= share:
        return src
    matches = glossary.match(src)
    if not matches:
        return src
    present = appearing([m.entry.target for m in matches], tgt, glossary.ignore_case)
    return annotate(src, [m for m, ok in zip(matches, present) if ok])


class TermAnnotator:
    """The annotation of training pairs for one corpus (`nmt.data.corpus.Source.terms`): called with aligned
    source and target lines, returns the sources, a `share` of the pairs an entry applies to annotated.
    `entries` is called once, on first use (a dictionary read or extracted only when pairs are encoded)."""

    def __init__(self, share: float, entries: Callable[[], Sequence[Entry]]):
        self.share, self._entries = share, entries
        self._glossary: Glossary | None = None

    def __call__(self, src: list[str], tgt: list[str]) -> list[str]:
        if self._glossary is None:
            self._glossary = Glossary(self._entries())
        return [annotate_pair(a, b, self._glossary, self.share) for a, b in zip(src, tgt)]


# --------------------------------------------------------------------------- extraction

_LETTER = re.compile(r"[^\W\d_]")


def _words(line: str) -> set[str]:
    return set(unit_keys(line))


def extract_dictionary(pairs: Iterable[tuple[str, str]], *, min_count: int = 3, min_share: float = 0.7,
                       stopwords: int = 100, max_lines: int = 200_000, identical: bool = True) -> list[Entry]:
    """Single-word entries that align strongly in `pairs` (module docstring), rarest source word
    first; reads at most the first `max_lines` pairs. identical=False leaves out words translated by
    themselves (names, identifiers: a model copies most of them anyway)."""
    lines: list[tuple[set[str], set[str]]] = []
    df_src: collections.Counter = collections.Counter()
    df_tgt: collections.Counter = collections.Counter()
    for src, tgt in pairs:
        if len(lines) >= max_lines:
            break
        s, t = _words(src), _words(tgt)
        lines.append((s, t))
        df_src.update(s)
        df_tgt.update(t)
    keep_src = _candidates(df_src, min_count, stopwords)
    keep_tgt = _candidates(df_tgt, min_count, stopwords)
    together: collections.Counter = collections.Counter()
    for s, t in lines:  # only pairs of similar frequency can pass: c <= min(df) and c >= min_share * max(df)
        ct = sorted((df_tgt[v], v) for v in t & keep_tgt)
        counts = [n for n, _ in ct]
        for w in s & keep_src:
            n = df_src[w]
            lo, hi = bisect.bisect_left(counts, min_share * n), bisect.bisect_right(counts, n / min_share)
            together.update((w, v) for _, v in ct[lo:hi])
    scored = []
    for (w, v), c in together.items():
        if c >= min_count and c >= min_share * df_src[w] and c >= min_share * df_tgt[v] and (identical or w != v):
            scored.append((-2 * c / (df_src[w] + df_tgt[v]), -c, w, v))
    used_src: set[str] = set()
    used_tgt: set[str] = set()
    entries = []
    for _, _, w, v in sorted(scored):
        if w not in used_src and v not in used_tgt:
            used_src.add(w)
            used_tgt.add(v)
            entries.append(Entry(w, v))
    return sorted(entries, key=lambda e: (df_src[e.source], e.source))


def _candidates(df: collections.Counter, min_count: int, stopwords: int) -> set[str]:
    """Words (units with a letter) in at least min_count lines, except the `stopwords` most frequent
    (at most a tenth of the words; ties by the word)."""
    words = {w: n for w, n in df.items() if _LETTER.search(w)}
    n_stop = min(stopwords, len(words) // 10)  # a small vocabulary keeps most of its words
    frequent = {w for w, _ in sorted(words.items(), key=lambda x: (-x[1], x[0]))[:n_stop]}
    return {w for w, n in words.items() if n >= min_count and w not in frequent}
