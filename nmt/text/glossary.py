"""Glossaries: which terms a line holds, which target terms its translation must contain, and how
often a translation used them. Importable without torch.

A glossary is a list of `Entry(source, target)`: from a TSV file (`read_glossary`: source term, tab,
target term; blank lines and `#` lines skipped) or from `[[source, target], ...]` (`check_entries`:
the API's and the server's form). A source term has one target: a repeated entry is kept once, the
same source term with another target is an error.

Matching (`Glossary.match`) works on *units*: words (runs of letters, digits, combining marks and
`_`), single characters of scripts written without spaces (Chinese, Japanese kana, Thai, ...) and
single other characters (punctuation, symbols). A term matches where the line has its units in a
row, with whitespace exactly where the term has some (any amount), so matches are whole words:
`dog` does not match in `dogs`, while `e-mail`, `C++`, `.NET` match as they are. Units compare
after NFC normalisation, case-sensitively unless `ignore_case` (`str.casefold`). Overlapping
matches: the longest wins, then the leftmost.

A line's translation must contain the target term of each matched entry (`Glossary.targets`). A
target *appears* in a text (`appears`) by the same rule as a source term matches; `term_use` is the
share of matched (line, entry) pairs whose target appears in the line's translation.
"""

from __future__ import annotations

import functools
import re
import unicodedata
import weakref
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from nmt import textio
from nmt.errors import UserError
from nmt.text.protect import placeholder_in

MAX_ENTRIES = 1000  # entries in one request's glossary (nmt serve: 413 beyond)
# Scripts written without spaces between words: each character is a unit (a term matches inside a run).
UNSPACED = ("\u0e00-\u0eff\u0f00-\u0fff\u1000-\u109f\u1780-\u17ff\u2e80-\u2fdf\u3005-\u3007\u3040-\u30ff"
            "\u3100-\u312f\u31a0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f\U00020000-\U0003134f")
# Whitespace a TSV line is stripped of (every character str.isspace() accepts, except the tab).
_BLANKS = "".join(chr(c) for c in range(0x3001) if chr(c).isspace() and c != 9)


class GlossaryTooLarge(UserError):
    """A glossary over the size a caller accepts (`check_entries(max_entries=...)`; the server: 413)."""


@dataclass(frozen=True)
class Entry:
    source: str
    target: str


@dataclass(frozen=True)
class Match:
    """One occurrence of an entry's source term in a line: line[start:end] (characters)."""

    entry: Entry
    start: int
    end: int


# --------------------------------------------------------------------------- units

@functools.cache
def _marks() -> str:
    """A regex class body of every combining mark (Unicode categories Mn, Mc, Me), built once."""
    codes = [c for c in (*range(0x20000), *range(0xE0100, 0xE01F0)) if unicodedata.category(chr(c))[0] == "M"]
    ranges, start = [], codes[0]
    for a, b in zip(codes, codes[1:] + [-1]):
        if b != a + 1:
            ranges.append(re.escape(chr(start)) + ("-" + re.escape(chr(a)) if a > start else ""))
            start = b
    return "".join(ranges)


@functools.cache
def _unit_re() -> re.Pattern:
    m, u = _marks(), UNSPACED
    # a word (ASCII word characters first: the big classes are tried on other characters only), a
    # character of an unspaced script with its marks, any other non-space character
    return re.compile(rf"(?:[a-zA-Z0-9_]|(?![\x00-\x7f])(?:[^\W{u}]|[{m}]))+|(?![\x00-\x7f])[{u}][{m}]*|\S")


@functools.cache
def word_char_re() -> re.Pattern:
    """One character of a spaced-script word: two of them in a row belong to one word."""
    return re.compile(rf"[^\W{UNSPACED}]|[{_marks()}]")


def units(text: str, ignore_case: bool = False) -> tuple[list[str], list[bool], list[tuple[int, int]]]:
    """(keys, gaps, spans) of the units of `text` (module docstring): keys[i] the unit's text as it
    compares (NFC, casefolded with ignore_case), gaps[i] whether whitespace precedes unit i (False for
    the first), spans[i] its (start, end) in `text`."""
    nfc = unicodedata.is_normalized("NFC", text)
    keys, gaps, spans, end = [], [], [], 0
    for m in _unit_re().finditer(text):
        key = m.group() if nfc else unicodedata.normalize("NFC", m.group())
        keys.append(key.casefold() if ignore_case else key)
        gaps.append(bool(spans) and m.start() > end)
        spans.append((m.start(), m.end()))
        end = m.end()
    return keys, gaps, spans


def unit_keys(text: str) -> list[str]:
    """The units of `text` alone, case kept (faster than `units`)."""
    return _unit_re().findall(unicodedata.normalize("NFC", text))


def _occurs(keys: list[str], gaps: list[bool], i: int, term: tuple[tuple[str, ...], tuple[bool, ...]]) -> bool:
    """Whether the term (its keys and gaps) occurs at unit i of a text's keys/gaps."""
    tkeys, tgaps = term
    n = len(tkeys)
    return keys[i:i + n] == list(tkeys) and gaps[i + 1:i + n] == list(tgaps[1:])


def appearing(terms: Sequence[str], text: str, ignore_case: bool = False) -> list[bool]:
    """Per term: whether it occurs in `text` as whole words (the matching rule of the module docstring)."""
    keys, gaps, _ = units(text, ignore_case)
    out = []
    for term in terms:
        tkeys, tgaps, _ = units(term, ignore_case)
        out.append(bool(tkeys) and any(_occurs(keys, gaps, i, (tuple(tkeys), tuple(tgaps)))
                                       for i in range(len(keys) - len(tkeys) + 1) if keys[i] == tkeys[0]))
    return out


def appears(term: str, text: str, ignore_case: bool = False) -> bool:
    """Whether `term` occurs in `text` as whole words."""
    return appearing([term], text, ignore_case)[0]


def needs_word_end(term: str) -> bool:
    """Whether `term` ends inside a spaced-script word (a letter, digit, mark, `_`): then a text only
    holds it as a whole word where no such character follows it."""
    return bool(term) and word_char_re().fullmatch(term[-1]) is not None


def word_joining(pieces: Sequence[str]) -> list[bool]:
    """Per vocabulary piece: whether it continues the word before it (it has no SentencePiece word
    start `▁` and begins with a word character: `s`, `ing`; not `,`, `▁the`, `<unk>`). After a term
    that `needs_word_end`, such a piece would make the term part of a longer word."""
    word = word_char_re()
    return [bool(p) and not p.startswith("\u2581") and word.match(p) is not None for p in pieces]


_JOINS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def joining_tokens(tokenizer) -> list[bool]:
    """`word_joining` of the tokenizer's target vocabulary (`vocab_pieces()[1]`, by id), cached per
    tokenizer: the `joins` of nmt.search.constraints.Constraints.build."""
    if tokenizer not in _JOINS:
        _JOINS[tokenizer] = word_joining(tokenizer.vocab_pieces()[1])
    return _JOINS[tokenizer]


def _unwritable(term: str, ids: list[int], written: str, tokenizer) -> str | None:
    """Why the model cannot write `term` exactly as given (its tokens `ids`, decoded `written`), or None."""
    symbol = placeholder_in(term)
    if symbol:  # (with --protect the search writes only the placeholders of the line's own spans)
        return f"holds {symbol}, a placeholder symbol nmt keeps for protected spans (--protect)"
    if not ids or tokenizer.specials.unk in ids:
        return "cannot be written by this model (its vocabulary has no token for some of its characters)"
    if units(written)[:2] != units(term)[:2]:  # its units (NFC, case kept) and where whitespace separates them
        return (f"would be written {written!r} by this model (its tokenizer normalises it): give it as "
                "the model writes it")
    return None


def term_tokens(targets: Sequence[str], tokenizer) -> tuple[list[list[int]], list[bool]]:
    """The constraints of one line: per target term (`Glossary.targets`) its target token ids and
    whether it `needs_word_end`; terms with the same ids count once. UserError for a term the model
    cannot write exactly as given (no token, the unknown token, or tokens that decode to other text:
    `check_targets`)."""
    seqs: list[list[int]] = []
    ends: list[bool] = []
    encoded = tokenizer.encode_tgt(list(targets))
    for term, ids, written in zip(targets, encoded, tokenizer.decode_tgt(encoded)):
        problem = _unwritable(term, ids, written, tokenizer)
        if problem:
            raise UserError(f"the glossary target term {term!r} {problem}")
        if ids not in seqs:
            seqs.append(ids)
            ends.append(needs_word_end(term))
    return seqs, ends


# --------------------------------------------------------------------------- glossaries

class Glossary:
    """Entries compiled for matching (build once, match many lines). UserError when two entries have
    the same source term (by the matching rule, so also by case with `ignore_case`) and other targets."""

    def __init__(self, entries: Iterable[Entry], ignore_case: bool = False):
        self.ignore_case = ignore_case
        self.entries: list[Entry] = []
        self._index: dict[str, list[tuple[tuple[str, ...], tuple[bool, ...], Entry]]] = {}
        seen: dict[tuple, Entry] = {}
        for e in entries:
            _no_surrogate(e.source, "source", "glossary")
            _no_surrogate(e.target, "target", "glossary")
            keys, gaps, _ = units(e.source, ignore_case)
            term = (tuple(keys), tuple(gaps))
            if not keys:
                raise UserError(f"glossary: the source term {e.source!r} is empty")
            if term in seen:
                if seen[term].target != e.target:
                    raise UserError(f"glossary: the source terms {seen[term].source!r} and {e.source!r} are the same "
                                    f"term{' (ignoring case)' if ignore_case else ''} with different targets "
                                    f"{seen[term].target!r} and {e.target!r}")
                continue
            seen[term] = e
            self.entries.append(e)
            self._index.setdefault(keys[0], []).append((*term, e))

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def key(self) -> tuple:
        """What makes two glossaries match alike (hashable): the entries and ignore_case."""
        return tuple(self.entries), self.ignore_case

    def match(self, line: str) -> list[Match]:
        """The matches in `line`, by position (module docstring: whole words, longest first)."""
        if not self._index:
            return []
        keys, gaps, spans = units(line, self.ignore_case)
        found = []  # (start char, end char, first unit, last unit + 1, entry)
        for i, key in enumerate(keys):
            for tkeys, tgaps, entry in self._index.get(key, ()):
                if _occurs(keys, gaps, i, (tkeys, tgaps)):
                    j = i + len(tkeys)
                    found.append((spans[i][0], spans[j - 1][1], i, j, entry))
        taken: list[tuple[int, int, Entry]] = []
        used = [False] * len(keys)
        for start, end, i, j, entry in sorted(found, key=lambda f: (f[0] - f[1], f[0])):
            if not any(used[i:j]):
                used[i:j] = [True] * (j - i)
                taken.append((start, end, entry))
        return [Match(entry, start, end) for start, end, entry in sorted(taken, key=lambda t: t[0])]

    def targets(self, line: str) -> list[str]:
        """The target terms the translation of `line` must contain: distinct, in order of first match."""
        return list(dict.fromkeys(m.entry.target for m in self.match(line)))


_CHECKED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # Glossary -> WeakSet of tokenizers


def check_targets(glossary: Glossary, tokenizer, max_positions: int) -> None:
    """UserError naming the first entry whose target term the model (its tokenizer, its output positions)
    cannot write exactly as given: no token or the unknown token for some character, a tokenizer that
    normalises it into other text (NFKC: `™` -> `TM`, `ﬁ` -> `fi`, full-width letters; a zero-width space
    dropped), a placeholder symbol (`<ph_K>`), or more tokens than the positions hold with an EOS; and the first
    source term the tokenizer drops whole (no token). Every entry, matched or not, when a glossary is loaded;
    checked once per glossary and tokenizer."""
    done = _CHECKED.setdefault(glossary, weakref.WeakSet())
    if tokenizer in done:
        return
    sources = list(dict.fromkeys(e.source for e in glossary.entries))
    for source, ids in zip(sources, tokenizer.encode_src(sources)):
        if not ids:  # (a line of it alone has no tokens: it is translated as an empty line, without its term)
            raise UserError(f"glossary: the source term {source!r} has no token for this model (its tokenizer drops "
                            "every character of it)")
    targets = list(dict.fromkeys(e.target for e in glossary.entries))
    encoded = tokenizer.encode_tgt(targets)
    written = dict(zip(targets, zip(encoded, tokenizer.decode_tgt(encoded))))
    for e in glossary.entries:
        ids, text = written[e.target]
        problem = _unwritable(e.target, ids, text, tokenizer)
        if problem is None and len(ids) + 1 > max_positions - 1:
            problem = f"needs {len(ids) + 1} output tokens with an EOS, more than the model's {max_positions - 1}"
        if problem:
            raise UserError(f"glossary: the target term {e.target!r} (of {e.source!r}) {problem}")
    done.add(tokenizer)


def match(line: str, entries: Glossary | Sequence[Entry], ignore_case: bool = False) -> list[Match]:
    """`Glossary(entries, ignore_case).match(line)` (compile a Glossary once to match many lines)."""
    glossary = entries if isinstance(entries, Glossary) else Glossary(entries, ignore_case)
    return glossary.match(line)


def _no_surrogate(term: str, side: str, where: str) -> None:
    """UserError for a lone surrogate (JSON's `\\ud800` escape; no UTF-8 text has one): not Unicode text."""
    bad = textio.lone_surrogate(term)
    if bad:
        raise UserError(f"{where}: the {side} term {term!r} is not Unicode text: {bad}")


def _check_term(text: str, side: str, where: str) -> str:
    term = text.strip()
    if not term:
        raise UserError(f"{where}: the {side} term is empty")
    _no_surrogate(term, side, where)
    if any(c in term for c in "\n\r\t"):
        raise UserError(f"{where}: the {side} term {term!r} contains a tab or a line break")
    if "<term>" in term or "</term>" in term:
        raise UserError(f"{where}: the {side} term {term!r} contains <term> or </term> (the annotation markers)")
    return term


def _add(entries: dict[str, tuple[Entry, str]], entry: Entry, where: str) -> None:
    """Add to {source: (entry, where)}: the same entry again is dropped, another target is an error."""
    if entry.source in entries:
        first, first_where = entries[entry.source]
        if first.target != entry.target:
            raise UserError(f"{where}: the source term {entry.source!r} already has the target {first.target!r} "
                            f"({first_where}); give one target per source term")
        return
    entries[entry.source] = (entry, where)


def read_glossary(path: str) -> list[Entry]:
    """The entries of a TSV glossary file (plain, gzip or "-"; UTF-8): `source term<TAB>target term`
    per line, blank lines and `#` comment lines skipped, whitespace around each term removed. A
    malformed line (no tab, more than one, an empty side) is a UserError naming the file and line."""
    name = textio.display_name(path)
    entries: dict[str, tuple[Entry, str]] = {}
    for number, line in enumerate(textio.iter_lines(path, strip=_BLANKS), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{name} line {number}"
        fields = line.split("\t")
        if len(fields) != 2:
            what = "no tab" if len(fields) == 1 else f"{len(fields) - 1} tabs"
            raise UserError(f"{where}: expected 'source term<TAB>target term', found {what}")
        _add(entries, Entry(_check_term(fields[0], "source", where), _check_term(fields[1], "target", where)), where)
    return [e for e, _ in entries.values()]


def load_glossary(path: str | None, ignore_case: bool = False) -> Glossary | None:
    """The compiled Glossary of a --glossary file (`read_glossary`), or None without one (UserError for
    --glossary-ignore-case alone, or standard input: that is the text to translate)."""
    if path is None:
        if ignore_case:
            raise UserError("--glossary-ignore-case needs --glossary FILE")
        return None
    if textio.is_stdin(path):
        raise UserError("--glossary must be a file (standard input is the text to translate)")
    return Glossary(read_glossary(path), ignore_case)


def check_entries(pairs: Any, max_entries: int | None = None) -> list[Entry]:
    """The entries of the API's glossary form, a list of [source, target] pairs of strings (tuples
    too); each problem is a one-line UserError naming the item (`glossary[3]`). More than
    `max_entries` entries: GlossaryTooLarge. Duplicates as `read_glossary`."""
    if isinstance(pairs, (str, bytes, dict)) or not isinstance(pairs, (list, tuple)):
        raise UserError('glossary must be a list of [source, target] pairs, e.g. [["perro", "dog"]]')
    if max_entries is not None and len(pairs) > max_entries:
        raise GlossaryTooLarge(f"{len(pairs)} glossary entries (at most {max_entries})")
    entries: dict[str, tuple[Entry, str]] = {}
    for i, pair in enumerate(pairs):
        where = f"glossary[{i}]"
        if not isinstance(pair, (list, tuple)) or len(pair) != 2 or not all(isinstance(x, str) for x in pair):
            raise UserError(f"{where} must be a [source, target] pair of strings, got {pair!r:.80}")
        _add(entries, Entry(_check_term(pair[0], "source", where), _check_term(pair[1], "target", where)), where)
    return [e for e, _ in entries.values()]


# --------------------------------------------------------------------------- term use

def term_use(hyps: Sequence[str], srcs: Sequence[str], entries: Glossary | Sequence[Entry],
             ignore_case: bool = False) -> dict:
    """How often translations used the glossary: for every (line, entry) whose source term matches
    in the source line (once per line, however often), whether the target term `appears` in the
    translation. -> {"term_use": percent of them (None when nothing matched), "term_matches": their
    number, "terms_used": how many appear, "term_lines": lines with at least one match}."""
    if len(hyps) != len(srcs):
        raise ValueError(f"{len(hyps)} translations for {len(srcs)} source lines")
    glossary = entries if isinstance(entries, Glossary) else Glossary(entries, ignore_case)
    matched = used = lines = 0
    for hyp, src in zip(hyps, srcs):
        found = list(dict.fromkeys(m.entry for m in glossary.match(src)))
        lines += bool(found)
        matched += len(found)
        used += sum(appearing([e.target for e in found], hyp, glossary.ignore_case))
    return {"term_use": 100.0 * used / matched if matched else None, "term_matches": matched,
            "terms_used": used, "term_lines": lines}


def lines_with_terms(srcs: Sequence[str], glossary: Glossary) -> list[int]:
    """Indices of the lines in which at least one entry matches (for scores on those lines alone)."""
    return [i for i, src in enumerate(srcs) if glossary.match(src)]
