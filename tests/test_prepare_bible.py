"""Tests for scripts/prepare_bible.py and the shipped data/bible-es-en corpus.

They need neither diatheke nor the SWORD modules: the cleaning, alignment,
filtering and split functions are pure Python and are tested on snippets of
the real ``diatheke -f internal`` markup of spaRV1909eb (RV1909) and
engWEB2015eb (WEB).
"""

from __future__ import annotations

import gzip
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "prepare_bible.py"
DATA = ROOT / "data" / "bible-es-en"
SPLITS = ("train", "dev", "test")


def _load_module():
    spec = importlib.util.spec_from_file_location("prepare_bible", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["prepare_bible"] = module  # dataclasses look the module up
    spec.loader.exec_module(module)
    return module


pb = _load_module()


# ---------------------------------------------------------------------------
# clean_verse on real markup
# ---------------------------------------------------------------------------

# WEB Genesis 1:1: "God" and "created" are adjacent <w> elements with no space.
WEB_GEN_1_1 = (
    '<w savlm="strong:H0430">In</w> <w savlm="strong:H0853">the</w> '
    '<w savlm="strong:H7225">beginning</w>, <w savlm="strong:H0430">God</w>'
    '<w savlm="strong:H1254">created</w> <w savlm="strong:H0853">the</w> '
    '<w savlm="strong:H8064">heavens</w> <w savlm="strong:H0430">and</w> '
    '<w savlm="strong:H0853">the</w> <w savlm="strong:H0776">earth</w>.'
)

# RV1909 Genesis 1:1 (one <w> may hold several words).
RV_GEN_1_1 = (
    '<w savlm="strong:H7225">En el principio</w> <w savlm="strong:H1254">crió</w> '
    '<w savlm="strong:H0430">Dios</w> <w savlm="strong:H8064">los cielos</w> '
    '<w savlm="strong:H0776">y la tierra</w>.'
)

# RV1909 Matthew 14:13: an enclitic pronoun marked as a translator's addition
# ("oyéndo" + "lo"), a proclitic one ("lo oyeron"), and a lemma attribute.
RV_MATT_14_13 = (
    '<w savlm="strong:G2532">Y</w> <w savlm="strong:G0191">oyéndo</w>'
    '<transChange type="added">lo</transChange><w savlm="strong:G2424">Jesús</w>, '
    '<w savlm="strong:G0402">se apartó</w> <w savlm="strong:G1564">de allí</w> '
    '<w savlm="strong:G1722">en</w> <w savlm="strong:G4143">un barco</w> '
    '<w savlm="strong:G1519">á</w> <w savlm="strong:G5117">un lugar</w> '
    '<w savlm="strong:G2048">descierto</w>, '
    '<w lemma="G2398" savlm="strong:G2596 G2398">apartado</w>: '
    '<w savlm="strong:G3588">y cuando las</w> <w savlm="strong:G3793">gentes</w>'
    '<transChange type="added">lo</transChange><w savlm="strong:G0191">oyeron</w>, '
    '<w savlm="strong:G0846">le</w> <w savlm="strong:G0190">siguieron</w> '
    '<w savlm="strong:G3979">á pie</w> <w savlm="strong:G3588">de las</w> '
    '<w savlm="strong:G4172">ciudades</w>.'
)

# WEB Matthew 1:1 as exported with footnotes switched on (diatheke -o f),
# plus the note's text as stored in the module.
WEB_MATT_1_1_NOTE = (
    '<w savlm="strong:G2424">The</w> <w savlm="strong:G0976">book</w> '
    '<w savlm="strong:G5207">of</w> <w savlm="strong:G2424">the</w> '
    '<w savlm="strong:G1078">genealogy</w> <w savlm="strong:G5207">of</w> '
    '<w savlm="strong:G2424">Jesus</w> <w savlm="strong:G5547">Christ</w>,'
    '<note placement="foot" swordFootnote="1">Messiah (Hebrew) and Christ '
    '(Greek) both mean “Anointed One”</note><w savlm="strong:G2424">the</w> '
    '<w savlm="strong:G5207">son</w> <w savlm="strong:G5207">of</w> '
    '<w savlm="strong:G1138">David</w>, <w savlm="strong:G2424">the</w> '
    '<w savlm="strong:G5207">son</w> <w savlm="strong:G5207">of</w> '
    '<w savlm="strong:G0011">Abraham</w>. <div eID="gen30281" type="x-p"/>'
)

# WEB Psalm 3:1: poetry line milestones between words, untagged words.
WEB_PS_3_1 = (
    'Yahweh, how <w savlm="strong:H1732">my</w> adversaries '
    '<w savlm="strong:H1121">have</w> increased!<l eID="gen7861" level="1"/> '
    '<l level="2" sID="gen7862"/>Many <w savlm="strong:H1121">are</w> '
    '<w savlm="strong:H1121">those</w> <w savlm="strong:H1121">who</w> rise '
    '<w savlm="strong:H1121">up</w> <w savlm="strong:H6440">against</w> '
    '<w savlm="strong:H6440">me</w>. <l eID="gen7862" level="2"/>'
)


def test_clean_verse_removes_strongs_markup_and_keeps_punctuation():
    out = pb.clean_verse(RV_GEN_1_1)
    assert out == "En el principio crió Dios los cielos y la tierra."
    assert "<" not in out and "strong" not in out and "H0430" not in out


def test_clean_verse_inserts_space_between_glued_word_elements():
    assert pb.clean_verse(WEB_GEN_1_1) == (
        "In the beginning, God created the heavens and the earth."
    )
    # A text node glued to a following <w> (WEB Psalm 42:8).
    assert pb.clean_verse('Yahweh<w savlm="strong:H3068">will</w> command') == (
        "Yahweh will command"
    )
    # Two translator additions glued to ordinary words (RV1909 Genesis 7:4).
    raw = ('<w savlm="strong:H3588">Porque</w><transChange type="added">pasados'
           '</transChange><w savlm="strong:H5750">aún</w> <w>siete</w> <w>días</w>')
    assert pb.clean_verse(raw) == "Porque pasados aún siete días"


def test_clean_verse_joins_enclitic_but_not_proclitic_pronouns():
    out = pb.clean_verse(RV_MATT_14_13)
    assert out.startswith("Y oyéndolo Jesús, se apartó de allí")
    assert "las gentes lo oyeron, le siguieron á pie" in out
    assert "G2398" not in out and "apartado:" in out
    # "sáca" + "lo" before a space is one word (RV1909 Genesis 19:12).
    assert pb.clean_verse(
        '<w>en la ciudad</w>, <w>sáca</w><transChange type="added">lo</transChange>'
        ' <w>de</w> <w>este lugar</w>'
    ) == "en la ciudad, sácalo de este lugar"


def test_clean_verse_removes_notes_and_keeps_the_space_they_held():
    out = pb.clean_verse(WEB_MATT_1_1_NOTE)
    assert out == ("The book of the genealogy of Jesus Christ, the son of David, "
                   "the son of Abraham.")
    assert "Messiah" not in out and "Anointed" not in out
    # Self-closing note left behind by diatheke's footnote filter (Gen 2:4).
    assert pb.clean_verse(
        '<w>that</w> <w>Yahweh</w><note placement="foot" swordFootnote="1"/>'
        '<w>God</w> <w>made</w>'
    ) == "that Yahweh God made"


def test_clean_verse_poetry_lines_titles_and_speakers():
    assert pb.clean_verse(WEB_PS_3_1) == (
        "Yahweh, how my adversaries have increased! "
        "Many are those who rise up against me."
    )
    assert pb.clean_verse(
        '<title canonical="true" type="psalm">A Psalm by David.</title> '
        '<w>Blessed</w> <w>is</w> <w>the</w> <w>man</w>'
    ) == "Blessed is the man"
    assert pb.clean_verse(
        '<speaker>Beloved</speaker> <w>Take</w> <w>me</w> <w>away</w>'
    ) == "Take me away"


def test_clean_verse_drops_text_after_end_of_book():
    # WEB Revelation 22:21 is followed by the glossary on the same line.
    raw = (
        '<w>The</w> <w>grace</w> <w>of</w> <w>the</w> <w>Lord</w> saints. Amen.  '
        '<chapter eID="Rev.22"/><div eID="gen35836" type="x-p"/> '
        '<div canonical="true" eID="gen35575" osisID="Rev" type="book"/> '
        '<div sID="gen35837" type="glossary"/> <list> <item><seg type="keyword">'
        'Abaddon</seg> Abaddon is Hebrew for destruction.</item></list>'
    )
    assert pb.clean_verse(raw) == "The grace of the Lord saints. Amen."


def test_clean_verse_whitespace_and_spanish_punctuation():
    # WEB Luke 12:6 has "coins</q>  <q marker="">?"; RV1909 Job 32:2 has ",,".
    assert pb.clean_verse(
        '<w>two</w> assaria coins</q>  <q marker="">? <w>Not</w> <w>one</w>'
    ) == "two assaria coins? Not one"
    assert pb.clean_verse("Bucita,, de la familia") == "Bucita, de la familia"
    assert pb.clean_verse("¡ <w>Oh</w>   Jehová !") == "¡Oh Jehová!"


@pytest.mark.parametrize("raw", [
    "",
    "   ",
    '<div eID="gen35567" type="x-p"/> ',
    '<chapter eID="Rom.16"/><div eID="gen1108" type="x-p"/>',
])
def test_clean_verse_empty_verses(raw):
    assert pb.clean_verse(raw) == ""


# ---------------------------------------------------------------------------
# Parsing and RV1909 specifics
# ---------------------------------------------------------------------------


def test_parse_diatheke_keeps_only_fresh_psalm_titles():
    out = "\n".join([
        '<title canonical="true" type="psalm">A Psalm by David.</title> '
        '<lg sID="gen1"/> <l level="1" sID="gen2"/>Psalms 3:1: Yahweh, how',
        '<title canonical="true" type="psalm">A Psalm by David.</title> '
        '<lg sID="gen1"/> <l level="1" sID="gen2"/>Psalms 3:2: Many there are',
        "I Samuel 1:1: Now there was a certain man",
        "of Ramathaim",  # continuation line
        "Revelation of John 22:21: The grace",
        "(engWEB2015eb)",
    ])
    verses = pb.parse_diatheke(out)
    assert [(v.book, v.chapter, v.verse) for v in verses] == [
        ("Psalms", 3, 1), ("Psalms", 3, 2), ("I Samuel", 1, 1),
        ("Revelation of John", 22, 21),
    ]
    assert verses[0].heading == "A Psalm by David."
    assert verses[1].heading == ""  # stale repetition of the previous heading
    assert verses[0].text == "Yahweh, how"
    assert verses[2].text == "Now there was a certain man of Ramathaim"


def test_split_chapter_opening_titles_and_capitals():
    casing = {"jehová": "Jehová", "hiram": "Hiram"}
    assert pb.split_chapter_opening("Salmo de David. JEHOVÁ es mi pastor", casing) == (
        "Salmo de David.", "Jehová es mi pastor")
    assert pb.split_chapter_opening("Salmo de David. A TI, oh Jehová", casing) == (
        "Salmo de David.", "A ti, oh Jehová")
    assert pb.split_chapter_opening("¿POR qué se amotinan", casing) == (
        "", "¿Por qué se amotinan")
    assert pb.split_chapter_opening("E HIRAM rey de Tiro", casing) == (
        "", "E Hiram rey de Tiro")
    assert pb.split_chapter_opening("sin capitales", casing) == ("", "sin capitales")


def test_build_casing_prefers_mid_sentence_spelling():
    casing = pb.build_casing([
        "Y dijo Jehová á Moisés.", "Entonces Moisés dijo: Jehová es Dios.",
        "DIJO el necio.", "y dijo el rey",
    ])
    assert casing["jehová"] == "Jehová"
    assert casing["moisés"] == "Moisés"
    assert casing["dijo"] == "dijo"


def test_strip_subscription_and_acrostic():
    assert pb.strip_subscription(
        "Gracia sea con todos los que aman á nuestro Señor Jesucristo en "
        "sinceridad. Amén. Escrita de Roma á los Efesios por Tichîco."
    ).endswith("en sinceridad. Amén.")
    kept = "La gracia sea con vosotros. Amén."
    assert pb.strip_subscription(kept) == kept
    assert pb.strip_acrostic("BETH ¿Con qué limpiará el joven") == "¿Con qué limpiará el joven"
    assert pb.strip_acrostic("ALEPH. BIENAVENTURADOS los") == "BIENAVENTURADOS los"


# ---------------------------------------------------------------------------
# Alignment, ratio filter, split
# ---------------------------------------------------------------------------


def _chapter(book, chapter, texts, start=1):
    return {(book, chapter, start + i): t for i, t in enumerate(texts)}


def test_find_mismatched_chapters_detects_verse_moved_to_next_chapter():
    # RV1909 prints Numbers 12:16 as 13:1 (12:16 empty, 13:33 merged); the
    # WEB keeps 12:16. Chapter 14 is numbered identically.
    es = {**_chapter("Num", 12, ["v"] * 15 + [""]),
          **_chapter("Num", 13, ["v"] * 33),
          **_chapter("Num", 14, ["v"] * 45)}
    en = {**_chapter("Num", 12, ["v"] * 16),
          **_chapter("Num", 13, ["v"] * 33),
          **_chapter("Num", 14, ["v"] * 45)}
    assert pb.find_mismatched_chapters(es, en) == {("Num", 12)}
    # Different verse counts at the end of a chapter (2 Cor 13: 13 vs 14).
    assert pb.find_mismatched_chapters(
        _chapter("2Cor", 13, ["v"] * 13), _chapter("2Cor", 13, ["v"] * 14)
    ) == {("2Cor", 13)}
    # A chapter present in one Bible only.
    assert pb.find_mismatched_chapters({("Mal", 4, 1): "x"}, {}) == {("Mal", 4)}
    assert pb.find_mismatched_chapters(es, es) == set()


def test_interior_gap_is_not_a_numbering_mismatch():
    # Acts 8:37 exists in RV1909 but not in the WEB.
    es = _chapter("Acts", 8, ["v"] * 40)
    en = dict(es)
    en[("Acts", 8, 37)] = ""
    assert pb.find_mismatched_chapters(es, en) == set()
    missing, neighbours = pb.interior_gaps(es, en)
    assert missing == {("Acts", 8, 37)}
    assert neighbours == {("Acts", 8, 36), ("Acts", 8, 38)}


def test_find_shifted_chapters_flags_off_by_one_chapter():
    lengths = [20, 90, 35, 140, 25, 110, 60, 180, 30, 75]
    en = _chapter("Num", 13, ["x" * n for n in lengths])
    es_ok = _chapter("Num", 13, ["y" * n for n in lengths])
    es_shifted = _chapter("Num", 13, ["y" * n for n in [50] + lengths[:-1]])
    others = {**_chapter("Gen", 1, ["a" * 40] * 20)}
    assert pb.find_shifted_chapters({**es_ok, **others}, {**en, **others}) == set()
    assert pb.find_shifted_chapters({**es_shifted, **others}, {**en, **others}) == {("Num", 13)}


def test_ratio_filter():
    assert pb.ratio_ok("Y dijo Dios: Sea la luz: y fué la luz.",
                       "God said, “Let there be light,” and there was light.")
    # RV1909 1 John 5:7 (Comma Johanneum) against the WEB's short verse.
    assert not pb.ratio_ok(
        "Porque tres son los que dan testimonio en el cielo, el Padre, el Verbo, "
        "y el Espíritu Santo: y estos tres son uno.",
        "For there are three who testify:")
    assert not pb.ratio_ok("Amén.", "x" * 200)
    # Smoothing: very short verses are not dropped for a few characters.
    assert pb.ratio_ok("Jesús lloró.", "Jesus wept.")


def test_align_keeps_common_non_empty_verses_only():
    es = {("Gen", 1, 1): "En el principio crió Dios los cielos y la tierra.",
          ("Gen", 1, 2): "Y la tierra estaba desordenada y vacía.",
          ("Gen", 1, 3): ""}
    en = {("Gen", 1, 1): "In the beginning, God created the heavens and the earth.",
          ("Gen", 1, 2): "The earth was formless and empty.",
          ("Gen", 1, 3): "God said, “Let there be light,” and there was light."}
    report = pb.BuildReport()
    pairs = pb.align(es, en, report)
    # Gen 1:3 is empty in es: the last verse differs, so the chapter's
    # numbering is treated as mismatched and the whole chapter is dropped.
    assert pairs == [] and report.mismatched_chapters == [("Gen", 1)]
    es[("Gen", 1, 3)] = "Y dijo Dios: Sea la luz: y fué la luz."
    pairs = pb.align(es, en, pb.BuildReport())
    assert [p.ref for p in pairs] == [("Gen", 1, 1), ("Gen", 1, 2), ("Gen", 1, 3)]
    assert all(p.es and p.en for p in pairs)


def test_split_is_by_whole_book_and_deduplicates_train():
    assert pb.split_of("Josh") == "dev" and pb.split_of("Rom") == "dev"
    assert pb.split_of("Judg") == "test" and pb.split_of("John") == "test"
    assert pb.split_of("Gen") == "train"
    assert not set(pb.DEV_BOOKS) & set(pb.TEST_BOOKS)
    pairs = [
        pb.Pair(("Ps", 14, 1), "Dijo el necio", "The fool has said"),
        pb.Pair(("Ps", 53, 1), "Dijo el necio", "The fool has said"),
        pb.Pair(("Gen", 1, 1), "En el principio", "In the beginning"),
        pb.Pair(("John", 11, 35), "Y lloró Jesús.", "Jesus wept."),
        pb.Pair(("Luke", 1, 1), "Y lloró Jesús.", "Jesus cried."),
        pb.Pair(("Josh", 1, 1), "Dijo el necio", "The fool has said"),
    ]
    report = pb.BuildReport()
    splits = pb.split_pairs(pairs, report)
    assert [p.ref for p in splits["train"]] == [("Gen", 1, 1)]
    assert [p.ref for p in splits["test"]] == [("John", 11, 35)]
    assert [p.ref for p in splits["dev"]] == [("Josh", 1, 1)]
    assert report.train_overlap_dropped == 3


def test_write_gzip_lines_is_byte_deterministic(tmp_path):
    a, b = tmp_path / "a.gz", tmp_path / "b.gz"
    pb.write_gzip_lines(a, ["uno", "dós"])
    pb.write_gzip_lines(b, ["uno", "dós"])
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes()[4:8] == b"\0\0\0\0"  # mtime 0
    assert gzip.decompress(a.read_bytes()).decode("utf-8") == "uno\ndós\n"


def test_missing_diatheke_exits_2_with_install_hint(monkeypatch, capsys):
    monkeypatch.setattr(pb.shutil, "which", lambda name: None)
    assert pb.main(["--out", "unused"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "apt-get install diatheke sword-text-sparv sword-text-web" in err


@pytest.mark.slow
def test_missing_module_is_reported(monkeypatch):
    monkeypatch.setattr(pb.shutil, "which", lambda name: "/usr/bin/diatheke")
    listing = "Biblical Texts:\nspaRV1909eb : Reina Valera 1909\nCommentaries:\n"
    monkeypatch.setattr(pb.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(
        a, 0, stdout=listing, stderr=""))
    message = pb.check_requirements()
    assert message is not None and "engWEB2015eb" in message and "spaRV1909eb" not in message


# ---------------------------------------------------------------------------
# The shipped corpus
# ---------------------------------------------------------------------------


def _read(split: str, lang: str) -> list[str]:
    text = gzip.decompress((DATA / f"{split}.{lang}.gz").read_bytes()).decode("utf-8")
    assert text.endswith("\n"), f"{split}.{lang}: missing final newline"
    return text.split("\n")[:-1]


@pytest.fixture(scope="module")
def corpus() -> dict[str, list[tuple[str, str]]]:
    out = {}
    for split in SPLITS:
        es, en = _read(split, "es"), _read(split, "en")
        assert len(es) == len(en), f"{split}: {len(es)} es vs {len(en)} en lines"
        out[split] = list(zip(es, en, strict=True))
    return out


def test_corpus_files_exist():
    for split in SPLITS:
        for lang in ("es", "en"):
            path = DATA / f"{split}.{lang}.gz"
            assert path.is_file() and path.stat().st_size > 0, path
            assert path.read_bytes()[4:8] == b"\0\0\0\0", f"{path}: gzip mtime not 0"
    assert (DATA / "README.md").is_file()


def test_corpus_sizes(corpus):
    assert 25_000 <= len(corpus["train"]) <= 31_000
    for split in ("dev", "test"):
        assert 1_000 <= len(corpus[split]) <= 2_500, split
    assert 28_000 <= sum(len(v) for v in corpus.values()) <= 31_000


def test_corpus_lines_are_clean_and_non_empty(corpus):
    for split, pairs in corpus.items():
        for i, (es, en) in enumerate(pairs):
            for text in (es, en):
                assert text.strip() == text and text, f"{split}:{i + 1} empty/padded"
                assert "  " not in text, f"{split}:{i + 1} double space"
                assert not any(c in text for c in "<>\t\r\x00"), f"{split}:{i + 1} {text!r}"
            assert pb.ratio_ok(es, en), f"{split}:{i + 1} implausible length ratio"


def test_corpus_first_verse_is_genesis(corpus):
    assert corpus["train"][0] == (
        "En el principio crió Dios los cielos y la tierra.",
        "In the beginning, God created the heavens and the earth.",
    )


def test_corpus_splits_are_disjoint(corpus):
    """No dev/test sentence pair (nor either side of one) occurs in train.

    Identical verses do repeat inside train (e.g. Psalm 136's refrain), so
    this is checked on the sets of pairs and sentences.
    """
    train_pairs = set(corpus["train"])
    train_es = {es for es, _ in corpus["train"]}
    train_en = {en for _, en in corpus["train"]}
    for split in ("dev", "test"):
        held = set(corpus[split])
        assert not held & train_pairs, f"{split} pairs found in train"
        assert not {en for _, en in held} & train_en, f"{split} English in train"
        assert not {es for es, _ in held} & train_es, f"{split} Spanish in train"
    assert not set(corpus["dev"]) & set(corpus["test"])
