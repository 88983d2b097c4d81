"""Protected spans: placeholders and markup that a translation must copy, never translate.

`mask` replaces each span (`Deleted %d files`, `Hello {name}`, `<b>Save</b> &amp; exit`) by a
placeholder `<ph_K>` (K = 0, 1, ... in order) before SentencePiece; `restore` puts the spans back
after decoding. A model trained with `data.protect: true` saw the placeholders, one SentencePiece
symbol each, on both sides of its pairs (`mask_pair`), so it learned to copy them.

Spans (PATTERNS, tried left to right; an extra user regex first): printf (`%s`, `%5.2f`, `%1$s`,
`%(name)s`, ...), braces (`{0}`, `{name}`, `{0:.2f}`), markup tags (`<b>`, `</b>`, `<a href="x">`),
character references (`&amp;`, `&#39;`). At most MAX_SPANS per line; later ones stay text.

`restore` never invents text: a placeholder without a source span is dropped, and a line is exact
only if every span came back exactly once.
"""

from __future__ import annotations

import random
import re
import weakref
import zlib
from dataclasses import dataclass
from typing import Sequence

from nmt.schema import MAX_SPANS, PLACEHOLDERS


PATTERNS = (
    r"%\([A-Za-z_][A-Za-z0-9_]*\)[-+#0]*\d*(?:\.\d+)?[diouxXeEfFgGcrsa%]",  # %(name)s
    r"%(?:\d+\$)?[-+#0]*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|L|q|j|z|t)?[diouxXeEfFgGaAcspn%@]",  # printf
    r"\{[A-Za-z0-9_.\[\]]*(?:![rsa])?(?::[^{}]*)?\}",  # {0} {name} {0:.2f}
    r"</?[A-Za-z][\w:.-]*(?:\s+[^<>]*?)?\s*/?>",  # <b> </b> <br/> <a href="..."> (also a literal <ph_0>)
    r"&(?:[A-Za-z][A-Za-z0-9]*|#\d+|#[xX][0-9A-Fa-f]+);",  # &amp; &#39; &#x27;
)
_PLACEHOLDER = re.compile(r"<ph_(\d+)>")
_cache: dict[str | None, re.Pattern] = {}


def pattern(extra: str | None = None) -> re.Pattern:
    """The compiled alternation of `extra` (first) and PATTERNS."""
    if extra not in _cache:
        _cache[extra] = re.compile("|".join(([f"(?:{extra})"] if extra else []) + [f"(?:{p})" for p in PATTERNS]))
    return _cache[extra]


def mask(text: str, extra: str | None = None, numbers: Sequence[int] | None = None) -> tuple[str, list[str]]:
    """(text with each protected span replaced by <ph_K>, the spans by K). K = 0, 1, ... in order
    of appearance, or `numbers[i]` for the i-th span (training: `mask_pair` draws them)."""
    found: list[tuple[int, str]] = []

    def sub(m: re.Match) -> str:
        if not m.group(0) or len(found) >= MAX_SPANS:  # (an empty match protects nothing)
            return m.group(0)
        k = numbers[len(found)] if numbers is not None else len(found)
        found.append((k, m.group(0)))
        return PLACEHOLDERS[k]
    masked = pattern(extra).sub(sub, text)
    spans = [""] * (max((k for k, _ in found), default=-1) + 1)
    for k, span in found:
        spans[k] = span
    return masked, spans


def mask_like(text: str, spans: list[str], extra: str | None = None) -> str:
    """Mask `text` (a target or a prefix) with the placeholders of `spans` (its source's): a span
    with the same text as an unused source span gets that span's placeholder (the first such, in
    the order the source had them); others stay text."""
    used: set[int] = set()
    order = sorted((k for k, span in enumerate(spans) if span), key=lambda k: spans.index(spans[k]))

    def sub(m: re.Match) -> str:
        for k in order:
            if spans[k] == m.group(0) and k not in used:
                used.add(k)
                return PLACEHOLDERS[k]
        return m.group(0)
    return pattern(extra).sub(sub, text)


def mask_pair(src: str, tgt: str, extra: str | None = None, inject: float = 0.0) -> tuple[str, str]:
    """A training pair with the same placeholder for the same span on both sides. The placeholder
    numbers are drawn at random (seeded by the source text, so a pair always masks the same way):
    the model must copy the number it sees, not count spans, and every placeholder gets trained.
    inject: the share of pairs without spans that get placeholders at aligned positions instead
    (`inject_placeholders`), so that a corpus without spans still teaches copying them."""
    n = min(sum(1 for m in pattern(extra).finditer(src) if m.group(0)), MAX_SPANS)
    rng = random.Random(zlib.crc32(src.encode("utf-8")))
    numbers = rng.sample(range(MAX_SPANS), n)
    if n == 0 and inject > 0 and rng.random() < inject:
        return inject_placeholders(src, tgt, rng)
    masked, spans = mask(src, extra, numbers)
    return masked, mask_like(tgt, spans, extra)


_ALIGNED = re.compile(r"\b(?=\w*[A-Z0-9])\w{2,}\b")  # a word with a capital or a digit: names, numbers


def inject_placeholders(src: str, tgt: str, rng: random.Random) -> tuple[str, str]:
    """Placeholders at aligned positions of a pair without spans: 1-3 words that occur exactly once,
    identically, on each side (names, numbers: `Israel`, `12`) become the same placeholder on both
    sides; a pair without such a word gets one at the start or the end of both sides, as a span
    often sits (`%s: file not found`). Random numbers, as in `mask_pair`."""
    src_words, tgt_words = _ALIGNED.findall(src), _ALIGNED.findall(tgt)
    shared = [w for w in dict.fromkeys(src_words) if src_words.count(w) == 1 and tgt_words.count(w) == 1]
    chosen = rng.sample(shared, min(len(shared), rng.choice((1, 1, 2, 3))))
    numbers = rng.sample(range(MAX_SPANS), max(len(chosen), 1))
    if not chosen:
        ph = PLACEHOLDERS[numbers[0]]
        return (f"{ph} {src}", f"{ph} {tgt}") if rng.random() < 0.5 else (f"{src} {ph}", f"{tgt} {ph}")
    for word, k in zip(chosen, numbers):
        word_re = re.compile(rf"\b{re.escape(word)}\b")
        src, tgt = word_re.sub(PLACEHOLDERS[k], src, 1), word_re.sub(PLACEHOLDERS[k], tgt, 1)
    return src, tgt


@dataclass
class Restored:
    text: str
    exact: bool  # every span restored exactly once, no unknown placeholder


def restore(text: str, spans: list[str]) -> Restored:
    """Put the spans back into a translation of a masked line (module docstring)."""
    counts = [0] * len(spans)
    unknown = False

    def sub(m: re.Match) -> str:
        nonlocal unknown
        k = int(m.group(1))
        if k < len(spans) and spans[k]:
            counts[k] += 1
            return spans[k]
        unknown = True
        return ""
    out = _PLACEHOLDER.sub(sub, text)
    if unknown:
        out = " ".join(out.split())  # a dropped placeholder leaves no double space
    return Restored(out, not unknown and all(c == 1 for c, span in zip(counts, spans) if span))


def placeholder_in(text: str) -> str | None:
    """The first placeholder symbol (`<ph_K>`) written in `text`, if any."""
    m = _PLACEHOLDER.search(text)
    return m.group(0) if m else None


def known_by(tokenizer) -> bool:
    """Whether the tokenizer has every placeholder as one symbol (a model trained with data.protect)."""
    return all(tokenizer.is_target_symbol(p) for p in PLACEHOLDERS)


_IDS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def placeholder_ids(tokenizer) -> tuple[dict[int, int], dict[int, int]]:
    """({source id: K}, {target id: K}): every piece that writes placeholder <ph_K> (the symbol itself,
    and a word model's or a merged "▁<ph_K>"). Cached per tokenizer."""
    if tokenizer not in _IDS:
        number = {ph: k for k, ph in enumerate(PLACEHOLDERS)}
        _IDS[tokenizer] = tuple({i: number[p.lstrip("▁")] for i, p in enumerate(pieces) if p.lstrip("▁") in number}
                                for pieces in tokenizer.vocab_pieces())
    return _IDS[tokenizer]


def target_placeholders(tokenizer) -> tuple[tuple[int, ...], ...]:
    """Per placeholder <ph_k> the target ids that write it (a vocabulary may have several: `<ph_0>`,
    `▁<ph_0>`), in id order: what the search may write for it (`SearchOptions.placeholder_tokens`)."""
    tokens: list[list[int]] = [[] for _ in PLACEHOLDERS]
    for i, k in placeholder_ids(tokenizer)[1].items():
        tokens[k].append(i)
    return tuple(tuple(ids) for ids in tokens)


def source_placeholders(src_ids: Sequence[list[int]], tokenizer) -> list[list[int]]:
    """Per encoded source the placeholders (k of <ph_k>, sorted) it holds: each must be copied once
    (`SearchInputs.placeholders`)."""
    src_ph = placeholder_ids(tokenizer)[0]
    return [sorted({src_ph[t] for t in ids if t in src_ph}) for ids in src_ids]


def mask_for_scoring(src: str, tgt: str, extra: str | None = None) -> tuple[str, str]:
    """A pair masked as translation masks it: the source's spans numbered in order (`mask`), the
    target's spans with the placeholder of the same source span (`mask_like`), so that `nmt score`
    of a protected translation equals its search log-probability."""
    masked, spans = mask(src, extra)
    return masked, mask_like(tgt, spans, extra)
