#!/usr/bin/env python3
"""Build the shipped Spanish-English Bible corpus (``data/bible-es-en``).

Sources (public domain, packaged by Debian):

* ``sword-text-sparv`` -> SWORD module ``spaRV1909eb`` (Reina-Valera 1909, Spanish)
* ``sword-text-web``   -> SWORD module ``engWEB2015eb`` (World English Bible)

Both modules are exported verse by verse with ``diatheke -f internal`` (the
module's OSIS markup after SWORD's default option filters, which already drop
footnotes and cross references), cleaned, aligned by verse reference, filtered
and split by whole books into train/dev/test.

Usage::

    python scripts/prepare_bible.py [--out data/bible-es-en]

Everything above ``main()`` is pure Python (no diatheke needed) so that the
tests can import the cleaning, alignment, filtering and split functions.
"""

from __future__ import annotations

import argparse
import gzip
import html
import math
import re
import shutil
import statistics
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

ES_MODULE = "spaRV1909eb"  # Debian package sword-text-sparv
EN_MODULE = "engWEB2015eb"  # Debian package sword-text-web
DEBIAN_PACKAGES = ("diatheke", "sword-text-sparv", "sword-text-web")
INSTALL_HINT = "apt-get install diatheke sword-text-sparv sword-text-web"

# The 66 books of the Protestant canon, in order, as (OSIS id, diatheke's
# English book name). The WEB module also contains the deuterocanon; those
# books have no Spanish counterpart and are ignored.
BOOKS: list[tuple[str, str]] = [
    ("Gen", "Genesis"), ("Exod", "Exodus"), ("Lev", "Leviticus"),
    ("Num", "Numbers"), ("Deut", "Deuteronomy"), ("Josh", "Joshua"),
    ("Judg", "Judges"), ("Ruth", "Ruth"), ("1Sam", "I Samuel"),
    ("2Sam", "II Samuel"), ("1Kgs", "I Kings"), ("2Kgs", "II Kings"),
    ("1Chr", "I Chronicles"), ("2Chr", "II Chronicles"), ("Ezra", "Ezra"),
    ("Neh", "Nehemiah"), ("Esth", "Esther"), ("Job", "Job"),
    ("Ps", "Psalms"), ("Prov", "Proverbs"), ("Eccl", "Ecclesiastes"),
    ("Song", "Song of Solomon"), ("Isa", "Isaiah"), ("Jer", "Jeremiah"),
    ("Lam", "Lamentations"), ("Ezek", "Ezekiel"), ("Dan", "Daniel"),
    ("Hos", "Hosea"), ("Joel", "Joel"), ("Amos", "Amos"),
    ("Obad", "Obadiah"), ("Jonah", "Jonah"), ("Mic", "Micah"),
    ("Nah", "Nahum"), ("Hab", "Habakkuk"), ("Zeph", "Zephaniah"),
    ("Hag", "Haggai"), ("Zech", "Zechariah"), ("Mal", "Malachi"),
    ("Matt", "Matthew"), ("Mark", "Mark"), ("Luke", "Luke"),
    ("John", "John"), ("Acts", "Acts"), ("Rom", "Romans"),
    ("1Cor", "I Corinthians"), ("2Cor", "II Corinthians"),
    ("Gal", "Galatians"), ("Eph", "Ephesians"), ("Phil", "Philippians"),
    ("Col", "Colossians"), ("1Thess", "I Thessalonians"),
    ("2Thess", "II Thessalonians"), ("1Tim", "I Timothy"),
    ("2Tim", "II Timothy"), ("Titus", "Titus"), ("Phlm", "Philemon"),
    ("Heb", "Hebrews"), ("Jas", "James"), ("1Pet", "I Peter"),
    ("2Pet", "II Peter"), ("1John", "I John"), ("2John", "II John"),
    ("3John", "III John"), ("Jude", "Jude"), ("Rev", "Revelation of John"),
]
BOOK_BY_NAME = {name: osis for osis, name in BOOKS}
BOOK_ORDER = {osis: i for i, (osis, _) in enumerate(BOOKS)}

# Whole books held out for evaluation (one Old- and one New-Testament book each).
DEV_BOOKS = ("Josh", "Rom")
TEST_BOOKS = ("Judg", "John")

# Length-ratio filter: a pair is dropped when the character-length ratio
# es/en is outside [MIN_RATIO, MAX_RATIO] (computed with RATIO_SMOOTHING extra
# characters on both sides so that very short verses are not penalised for
# a few characters of difference).
MIN_RATIO = 0.55
MAX_RATIO = 1.7
RATIO_SMOOTHING = 10

# Misaligned-chapter detection (see find_shifted_chapters).
SHIFT_MAX_DEVIATION = 0.25
SHIFT_MAX_OUTLIERS = 2

Ref = tuple[str, int, int]  # (OSIS book, chapter, verse)


# ---------------------------------------------------------------------------
# Parsing diatheke output
# ---------------------------------------------------------------------------

# One verse line of ``diatheke -f internal -k Gen-Rev``: optional pre-verse
# markup (e.g. a psalm <title>), then "Book C:V: text". Inside a range diatheke
# keeps re-printing the last pre-verse heading before every following verse,
# so a prefix only belongs to a verse when it differs from the previous one.
_VERSE_LINE = re.compile(
    r"^(?P<prefix>(?:<title\b[^>]*>.*?</title>|<[^>]*>|\s)*)"
    r"(?P<book>[^<>\n]+?) (?P<chapter>\d+):(?P<verse>\d+): (?P<text>.*)$"
)
_MODULE_TRAILER = re.compile(r"^\([A-Za-z0-9_]+\)\s*$")
_TITLE = re.compile(r"<title\b[^>]*>(.*?)</title>", re.S)


@dataclass
class RawVerse:
    book: str  # diatheke book name, e.g. "I Samuel"
    chapter: int
    verse: int
    text: str  # raw markup of the verse
    heading: str = ""  # raw markup of a pre-verse heading (psalm title)


def parse_diatheke(output: str) -> list[RawVerse]:
    """Parse ``diatheke -f internal`` range output into verses.

    Lines that do not start a new verse are continuation lines of the
    previous verse. The trailing "(MODULE)" line is ignored.
    """
    verses: list[RawVerse] = []
    last_prefix = ""
    for line in output.splitlines():
        m = _VERSE_LINE.match(line)
        if m:
            prefix = m.group("prefix")
            heading = ""
            if prefix.strip() and prefix != last_prefix:
                heading = " ".join(t for t in _TITLE.findall(prefix))
            last_prefix = prefix
            verses.append(
                RawVerse(m.group("book"), int(m.group("chapter")),
                         int(m.group("verse")), m.group("text"), heading)
            )
        elif _MODULE_TRAILER.match(line) or not verses:
            continue
        elif line.strip():
            verses[-1].text += " " + line
    return verses


# ---------------------------------------------------------------------------
# Cleaning
# ---------------------------------------------------------------------------

# Elements whose *content* is not verse text.
_DROP_ELEMENTS = re.compile(
    r"<(note|title|speaker|rdg)\b[^>]*?(?<!/)>.*?</\1>", re.S
)
_SELF_CLOSING_DROP = re.compile(r"<(note|title|speaker|rdg)\b[^>]*/>")

# Spanish object pronouns that RV1909 marks as translator additions
# (<transChange>) glued to the verb they are enclitic to: "sáca" + "lo" is
# "sácalo". They are only proclitic (separate words) after these hosts.
_CLITIC = r"(?:[mts]e|nos|os|l[oae]s?|se(?:l[oae]s?)|[mt]el[oae]s?)"
_PROCLITIC_HOSTS = {
    "no", "que", "y", "e", "o", "ni", "como", "cómo", "cuando", "cuánto",
    "cuán", "si", "ya", "me", "te", "se", "nos", "os", "le", "les", "lo",
    "la", "los", "las", "él", "ella", "ellos", "ellas", "yo", "tú", "dios",
    "jehová", "josué", "gentes", "pues", "mas", "porque",
}
_ENCLITIC = re.compile(
    r"(?P<host>[^\W\d_]+)</w><transChange\b[^>]*>(?P<clitic>" + _CLITIC
    + r")</transChange>",
)

# End-of-book milestone: anything after it (the WEB's glossary follows
# Revelation 22:21 on the same line) is not verse text.
_BOOK_END = re.compile(r'<div\b(?=[^>]*\beID=)(?=[^>]*\btype="book")[^>]*/>')
_TAG = re.compile(r"<[^>]*>")
_SOFT = "\x00"  # marks where a tag was removed
_STRONGS_LITERAL = re.compile(r"\s*<\s*[GH]\d+[a-z]?\s*>")
_NO_SPACE_BEFORE = set(",.;:!?)]}»”’…")
_NO_SPACE_AFTER = set("([{«“‘¿¡")
_DASHES = set("-‐‑–—")


def _join_enclitic(m: re.Match) -> str:
    host = m.group("host")
    if host.lower() in _PROCLITIC_HOSTS:
        return m.group(0)  # a separate word: spacing is decided later
    return host + m.group("clitic") + "</w>"


def _resolve_soft_breaks(text: str) -> str:
    """Turn each run of removed-tag markers into a space or nothing.

    Adjacent elements such as ``<w>God</w><w>created</w>`` carry no space in
    the modules, so a boundary between two words becomes a space, while a
    boundary next to whitespace, closing punctuation, opening
    punctuation/quotes or a dash disappears.
    """
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch != _SOFT:
            out.append(ch)
            i += 1
            continue
        j = i
        while j < n and text[j] == _SOFT:
            j += 1
        left = out[-1] if out else ""
        right = text[j] if j < n else ""
        if (
            left and right
            and not left.isspace() and not right.isspace()
            and right not in _NO_SPACE_BEFORE
            and left not in _NO_SPACE_AFTER
            and left not in _DASHES and right not in _DASHES
        ):
            out.append(" ")
        i = j
    return "".join(out)


def clean_verse(raw: str) -> str:
    """Return the plain text of one verse of raw SWORD/OSIS markup.

    Removes notes, titles, speaker labels and all tags (with their Strong's
    numbers and morphology attributes), inserts the spaces that the markup
    only implies (``<w>God</w><w>created</w>`` -> "God created"), joins
    Spanish enclitic pronouns marked as additions (``<w>sáca</w>
    <transChange>lo</transChange>`` -> "sácalo"), unescapes entities and
    normalises whitespace. Punctuation is kept. Returns "" for empty verses.
    """
    text = _BOOK_END.split(raw.replace("\n", " "), 1)[0]
    text = _DROP_ELEMENTS.sub(_SOFT, text)
    text = _SELF_CLOSING_DROP.sub(_SOFT, text)
    text = _ENCLITIC.sub(_join_enclitic, text)
    text = _TAG.sub(_SOFT, text)
    text = _resolve_soft_breaks(text)
    text = html.unescape(text)
    text = _STRONGS_LITERAL.sub("", text)
    text = re.sub(r"\s+", " ", text)
    text = re.sub(r"\s+(?=[,.;:?!])", "", text)  # "coins ?" -> "coins?"
    text = re.sub(r"(?<=[¿¡])\s+", "", text)  # "¿ Por" -> "¿Por"
    text = re.sub(r",{2,}", ",", text)
    return text.strip()


# RV1909 prints the first word(s) of every chapter in capitals ("EN el
# principio", "A TI, oh Jehová"); a psalm's title precedes them in verse 1.
_UPPER = "A-ZÀ-ÖØ-Þ"  # ASCII and Latin-1 capitals (RV1909 writes "EZECHÎAS")
_CAPS_WORD = (
    rf"[{_UPPER}]{{2,}}"  # "JEHOVÁ"
    rf"|[AEOUYÁÓ](?=(?: [AEOUYÁÓ])* [{_UPPER}]{{2,}}\b)"  # "Y", "Á" in "Y Á SUS"
)
_CAPS_RUN = re.compile(
    r"(?<![\w])(?P<run>(?:" + _CAPS_WORD + r")(?: (?:" + _CAPS_WORD + r"))*)\b"
)
# A section opening in mid-chapter ("HUBO en los días de Herodes", Luke 1:5).
_CAPS_OPENING = re.compile(rf"^[¿¡«“(]?[{_UPPER}]{{2,}} [a-zß-ÿ]")
_WORD = re.compile(r"[^\W\d_]+")
_SENTENCE_START = re.compile(r"(?:^|[.?!:;¿¡«“‘(]\s*)$")


def build_casing(texts: Iterable[str]) -> dict[str, str]:
    """Most frequent spelling of each word away from sentence starts.

    Used to give chapter-opening capitals their ordinary case: "JEHOVÁ" ->
    "Jehová", "MOISÉS" -> "Moisés", but "DIJO" -> "dijo".
    """
    counts: dict[str, Counter] = defaultdict(Counter)
    for text in texts:
        for m in _WORD.finditer(text):
            word = m.group()
            if len(word) > 1 and word.isupper():
                continue
            if _SENTENCE_START.search(text[: m.start()]):
                continue
            counts[word.lower()][word] += 1
    return {low: c.most_common(1)[0][0] for low, c in counts.items()}


def split_chapter_opening(
    text: str, casing: dict[str, str] | None = None
) -> tuple[str, str]:
    """Split RV1909's chapter-opening verse into (title, text).

    The verse text starts at the first all-capitals word (with any opening
    "¿", "¡" or quote before it); anything before it (a psalm title such as
    "Salmo de David.") is returned as the title. The capitals get their
    ordinary case from ``casing`` (see :func:`build_casing`; unknown words
    become lower case) and the first word is capitalised: "JEHOVÁ es" ->
    "Jehová es", "¿POR qué" -> "¿Por qué". Without a capitals word the text
    is returned unchanged with no title.
    """
    casing = casing or {}
    m = _CAPS_RUN.search(text)
    if not m:
        return "", text
    start = m.start()
    while start > 0 and text[start - 1] in _NO_SPACE_AFTER:
        start -= 1
    words = [casing.get(w.lower(), w.lower()) for w in m.group("run").split(" ")]
    words[0] = words[0][0].upper() + words[0][1:]
    title = text[:start].strip()
    body = text[start: m.start()] + " ".join(words) + text[m.end():]
    return title, body


# Psalm 119 is an acrostic: RV1909 starts verses 1, 9, 17, ... with the
# Hebrew letter ("ALEPH.", "BETH", ...). The WEB has them as headings, which
# are not kept; the Spanish letters are removed to match.
_ACROSTIC = re.compile(rf"^[{_UPPER}]{{2,}}\.?\s+(?=\S)")


def strip_acrostic(text: str) -> str:
    """Remove a leading Hebrew letter name ("ALEPH. ...") from a verse."""
    return _ACROSTIC.sub("", text)


# RV1909 ends most Pauline epistles (and Hebrews) with the Textus Receptus
# subscription ("Amén. Escrita de Roma á los Efesios por Tichîco."), which the
# WEB does not translate.
_SUBSCRIPTION = re.compile(
    r"(?<=Amén\.)\s+[^.]*\b(?:[Ee]scrita|[Ee]nviada)\b[^.]*\.$"
)
EPISTLES = ("Rom", "1Cor", "2Cor", "Gal", "Eph", "Phil", "Col", "1Thess",
            "2Thess", "1Tim", "2Tim", "Titus", "Phlm", "Heb")


def strip_subscription(text: str) -> str:
    """Remove a trailing epistle subscription after the final "Amén."."""
    return _SUBSCRIPTION.sub("", text)


# ---------------------------------------------------------------------------
# Alignment, filtering, split
# ---------------------------------------------------------------------------


def chapter_verse_sets(verses: dict[Ref, str]) -> dict[tuple[str, int], set[int]]:
    """Map (book, chapter) to the set of verse numbers with non-empty text."""
    chapters: dict[tuple[str, int], set[int]] = defaultdict(set)
    for (book, chapter, verse), text in verses.items():
        if text.strip():
            chapters[(book, chapter)].add(verse)
    return chapters


def find_mismatched_chapters(
    es: dict[Ref, str], en: dict[Ref, str]
) -> set[tuple[str, int]]:
    """Chapters whose verse numbering differs between the two Bibles.

    A chapter is mismatched when it exists (with non-empty verses) in only
    one Bible, or when its first or last non-empty verse number differs:
    RV1909 sometimes follows the Hebrew chapter division inside the KJV verse
    scheme (Num 12:16 is printed as 13:1 and 12:16 left empty; Job 40:20-24
    are empty), and the WEB splits or merges verses at chapter ends
    (2 Cor 13:12-14, Acts 19:40-41). Verses that are missing only *inside* a
    chapter (textual variants such as Acts 8:37, absent from the WEB) do not
    shift the numbering and are handled by :func:`interior_gaps`.
    """
    es_ch, en_ch = chapter_verse_sets(es), chapter_verse_sets(en)
    bad = set()
    for key in set(es_ch) | set(en_ch):
        a, b = es_ch.get(key, set()), en_ch.get(key, set())
        if not a or not b or min(a) != min(b) or max(a) != max(b):
            bad.add(key)
    return bad


def interior_gaps(es: dict[Ref, str], en: dict[Ref, str]) -> tuple[set[Ref], set[Ref]]:
    """Verses missing in one Bible inside an otherwise matching chapter.

    Returns ``(missing, neighbours)``: the references present in only one
    Bible, and the verses right before and after each of them (dropped too,
    in case the other Bible merged the missing text into them).
    """
    es_ch, en_ch = chapter_verse_sets(es), chapter_verse_sets(en)
    missing, neighbours = set(), set()
    for (book, chapter) in set(es_ch) & set(en_ch):
        for verse in es_ch[(book, chapter)] ^ en_ch[(book, chapter)]:
            missing.add((book, chapter, verse))
            neighbours.update({(book, chapter, verse - 1), (book, chapter, verse + 1)})
    return missing, neighbours - missing


def length_ratio(src: str, tgt: str, smoothing: int = RATIO_SMOOTHING) -> float:
    """Character-length ratio ``len(src)/len(tgt)``, smoothed for short texts."""
    return (len(src) + smoothing) / (len(tgt) + smoothing)


def ratio_ok(es: str, en: str, lo: float = MIN_RATIO, hi: float = MAX_RATIO) -> bool:
    """True when the es/en length ratio is plausible for a translation pair."""
    return lo <= length_ratio(es, en) <= hi


def find_shifted_chapters(
    es: dict[Ref, str], en: dict[Ref, str],
    max_deviation: float = SHIFT_MAX_DEVIATION,
    max_outliers: int = SHIFT_MAX_OUTLIERS,
) -> set[tuple[str, int]]:
    """Chapters whose verses are paired with the wrong verse despite equal
    numbering (e.g. RV1909 numbers Num 12:16 as 13:1 and leaves 12:16 empty,
    so all of Num 13 is off by one).

    A chapter is flagged when the mean absolute deviation of its verses'
    log length ratios from the corpus median exceeds ``max_deviation``, or
    when at least ``max_outliers`` of its verses fail :func:`ratio_ok`
    (a shift that starts in the middle of the chapter).
    """
    common = [k for k in es if es[k].strip() and en.get(k, "").strip()]
    if not common:
        return set()
    logs = {k: math.log(length_ratio(es[k], en[k])) for k in common}
    median = statistics.median(logs.values())
    by_chapter: dict[tuple[str, int], list[Ref]] = defaultdict(list)
    for k in common:
        by_chapter[(k[0], k[1])].append(k)
    flagged = set()
    for chapter, refs in by_chapter.items():
        deviation = sum(abs(logs[k] - median) for k in refs) / len(refs)
        outliers = sum(not ratio_ok(es[k], en[k]) for k in refs)
        if deviation > max_deviation or outliers >= max_outliers:
            flagged.add(chapter)
    return flagged


def split_of(book: str, dev_books: Iterable[str] = DEV_BOOKS,
             test_books: Iterable[str] = TEST_BOOKS) -> str:
    """Deterministic split of a whole book: 'dev', 'test' or 'train'."""
    if book in tuple(dev_books):
        return "dev"
    if book in tuple(test_books):
        return "test"
    return "train"


@dataclass
class Pair:
    ref: Ref
    es: str
    en: str


@dataclass
class BuildReport:
    es_verses: int = 0
    en_verses: int = 0
    common: int = 0
    only_es: int = 0
    only_en: int = 0
    mismatched_chapters: list[tuple[str, int]] = field(default_factory=list)
    mismatch_dropped_verses: int = 0
    shifted_chapters: list[tuple[str, int]] = field(default_factory=list)
    shift_dropped_verses: int = 0
    gaps: list[Ref] = field(default_factory=list)
    gap_neighbours_dropped: int = 0
    ratio_dropped: list[Pair] = field(default_factory=list)
    train_overlap_dropped: int = 0


def align(
    es: dict[Ref, str], en: dict[Ref, str], report: BuildReport | None = None
) -> list[Pair]:
    """Verse pairs present and non-empty in both, minus chapters with
    differing numbering, chapters detected as shifted, the neighbours of
    verses missing in one Bible, and pairs with an implausible length ratio,
    in canonical order."""
    report = report if report is not None else BuildReport()
    es = {k: v for k, v in es.items() if v.strip()}
    en = {k: v for k, v in en.items() if v.strip()}
    report.es_verses, report.en_verses = len(es), len(en)
    order = lambda k: (BOOK_ORDER.get(k[0], 999), k[1])  # noqa: E731
    bad = find_mismatched_chapters(es, en)
    shifted = find_shifted_chapters(es, en) - bad
    report.mismatched_chapters = sorted(bad, key=order)
    report.shifted_chapters = sorted(shifted, key=order)
    missing, neighbours = interior_gaps(es, en)
    report.gaps = sorted(r for r in missing if (r[0], r[1]) not in bad)
    common = set(es) & set(en)
    report.common = len(common)
    report.only_es = len(set(es) - common)
    report.only_en = len(set(en) - common)
    pairs: list[Pair] = []
    for ref in sorted(common, key=lambda r: (BOOK_ORDER.get(r[0], 999), r[1], r[2])):
        if (ref[0], ref[1]) in bad:
            report.mismatch_dropped_verses += 1
            continue
        if (ref[0], ref[1]) in shifted:
            report.shift_dropped_verses += 1
            continue
        if ref in neighbours:
            report.gap_neighbours_dropped += 1
            continue
        pair = Pair(ref, es[ref], en[ref])
        if not ratio_ok(pair.es, pair.en):
            report.ratio_dropped.append(pair)
            continue
        pairs.append(pair)
    return pairs


def split_pairs(
    pairs: list[Pair], report: BuildReport | None = None
) -> dict[str, list[Pair]]:
    """Split by whole book (see :func:`split_of`).

    Verses repeat across books (Ps 14 / Ps 53, refrains, genealogies), so
    train loses every pair whose Spanish or English side also occurs in dev
    or test: no held-out sentence is seen in training.
    """
    report = report if report is not None else BuildReport()
    splits: dict[str, list[Pair]] = {"train": [], "dev": [], "test": []}
    for p in pairs:
        splits[split_of(p.ref[0])].append(p)
    held_es = {p.es for name in ("dev", "test") for p in splits[name]}
    held_en = {p.en for name in ("dev", "test") for p in splits[name]}
    train = [p for p in splits["train"] if p.es not in held_es and p.en not in held_en]
    report.train_overlap_dropped = len(splits["train"]) - len(train)
    splits["train"] = train
    return splits


def write_gzip_lines(path: Path, lines: Iterable[str]) -> None:
    """Write lines as UTF-8 gzip (level 9, mtime 0, no file name): byte-deterministic."""
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    with open(path, "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw,
                           compresslevel=9, mtime=0) as gz:
            gz.write(data)


# ---------------------------------------------------------------------------
# diatheke
# ---------------------------------------------------------------------------


def check_requirements() -> str | None:
    """Return an error message if diatheke or a module is missing, else None."""
    if shutil.which("diatheke") is None:
        return "diatheke not found"
    try:
        out = subprocess.run(
            ["diatheke", "-b", "system", "-k", "modulelist"],
            capture_output=True, text=True, timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:  # pragma: no cover
        return f"cannot run diatheke ({exc})"
    installed = {line.split(" : ")[0].strip() for line in out.splitlines()}
    missing = [m for m in (ES_MODULE, EN_MODULE) if m not in installed]
    if missing:
        return "SWORD module(s) not installed: " + ", ".join(missing)
    return None


def export_module(module: str) -> str:
    """Every verse of ``module`` (Genesis..Revelation) in internal markup."""
    return subprocess.run(
        ["diatheke", "-b", module, "-f", "internal", "-k", "Gen-Rev"],
        capture_output=True, text=True, check=True,
    ).stdout


def package_versions() -> dict[str, str]:
    versions = {}
    for pkg in DEBIAN_PACKAGES:
        try:
            versions[pkg] = subprocess.run(
                ["dpkg-query", "-W", "-f=${Version}", pkg],
                capture_output=True, text=True,
            ).stdout.strip() or "?"
        except OSError:
            versions[pkg] = "?"
    return versions


def load_bible(raw: str, lang: str) -> dict[Ref, str]:
    """Parse and clean one module's export into {(book, ch, vs): text}.

    Spanish: Psalm 119's acrostic letters and the epistle subscriptions are
    removed and the chapter-opening capitals get ordinary case (the psalm
    titles that RV1909 keeps inside verse 1 stay there). English: a psalm
    title (a pre-verse heading in the WEB) is prepended to verse 1, so both
    sides contain the title.
    """
    verses: dict[Ref, str] = {}
    headings: dict[Ref, str] = {}
    for rv in parse_diatheke(raw):
        book = BOOK_BY_NAME.get(rv.book)
        if book is None:  # deuterocanon (WEB only)
            continue
        ref = (book, rv.chapter, rv.verse)
        verses[ref] = clean_verse(rv.text)
        if rv.heading:
            headings[ref] = clean_verse(rv.heading)
    if lang == "es":
        casing = build_casing(verses.values())
        for (book, chapter, verse), text in verses.items():
            if not text:
                continue
            if book == "Ps" and chapter == 119 and verse % 8 == 1:
                text = strip_acrostic(text)
            if verse == 1 or _CAPS_OPENING.match(text):
                title, body = split_chapter_opening(text, casing)
                text = f"{title} {body}".strip()
            if book in EPISTLES:
                text = strip_subscription(text)
            verses[(book, chapter, verse)] = text
    else:
        for (book, chapter, verse), title in headings.items():
            text = verses[(book, chapter, verse)]
            # Real titles only, not Psalm 119's letter headings ("ALEPH").
            if book == "Ps" and verse == 1 and text and title != title.upper():
                verses[(book, chapter, verse)] = f"{title} {text}"
    return verses


def word_count(lines: Iterable[str]) -> int:
    return sum(len(line.split()) for line in lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("data/bible-es-en"),
                        help="output directory (default: data/bible-es-en)")
    args = parser.parse_args(argv)

    problem = check_requirements()
    if problem:
        print(f"error: {problem}; install with: {INSTALL_HINT}", file=sys.stderr)
        return 2

    versions = package_versions()
    print("packages: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    es = load_bible(export_module(ES_MODULE), "es")
    en = load_bible(export_module(EN_MODULE), "en")

    report = BuildReport()
    pairs = align(es, en, report)
    splits = split_pairs(pairs, report)

    print(f"exported verses: es {report.es_verses}, en {report.en_verses} (non-empty)")
    print(f"in both: {report.common}  (only es: {report.only_es}, only en: {report.only_en})")
    chapters = ", ".join(f"{b} {c}" for b, c in report.mismatched_chapters)
    print(f"dropped {len(report.mismatched_chapters)} chapters with differing verse "
          f"numbering ({report.mismatch_dropped_verses} verse pairs): {chapters}")
    gaps = ", ".join(f"{b} {c}:{v}" for b, c, v in report.gaps)
    print(f"verses missing in one Bible inside a chapter: {gaps}; dropped their "
          f"{report.gap_neighbours_dropped} neighbouring verse pairs")
    chapters = ", ".join(f"{b} {c}" for b, c in report.shifted_chapters)
    print(f"dropped {len(report.shifted_chapters)} chapters detected as shifted "
          f"({report.shift_dropped_verses} verse pairs): {chapters}")
    print(f"dropped {len(report.ratio_dropped)} pairs with es/en length ratio "
          f"outside [{MIN_RATIO}, {MAX_RATIO}]")
    for p in report.ratio_dropped:
        print(f"  {p.ref[0]} {p.ref[1]}:{p.ref[2]} ratio={length_ratio(p.es, p.en):.2f}")
    print(f"dropped {report.train_overlap_dropped} train pairs sharing a sentence with dev/test")

    args.out.mkdir(parents=True, exist_ok=True)
    print(f"{'split':6} {'lines':>7} {'es words':>9} {'en words':>9}  books")
    total = 0
    for name in ("train", "dev", "test"):
        sp = splits[name]
        es_lines, en_lines = [p.es for p in sp], [p.en for p in sp]
        write_gzip_lines(args.out / f"{name}.es.gz", es_lines)
        write_gzip_lines(args.out / f"{name}.en.gz", en_lines)
        books = sorted({p.ref[0] for p in sp}, key=BOOK_ORDER.get)
        shown = ", ".join(books) if len(books) < 10 else f"{len(books)} books"
        print(f"{name:6} {len(sp):7d} {word_count(es_lines):9d} "
              f"{word_count(en_lines):9d}  {shown}")
        total += len(sp)
    print(f"total  {total:7d}  -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
