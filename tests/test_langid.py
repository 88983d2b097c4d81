"""Tests for nmt/text/langid.py: exact naive Bayes scores against a hand computation, accuracy on
generated languages, size bound, checkpoint-safe serialisation, off_target; and, when the
gettext corpus is built (scripts/prepare_gettext.py), accuracy per language on its dev split."""

from __future__ import annotations

import io
import json
import math
import random
from pathlib import Path

import pytest
import torch

from nmt.errors import UserError
from nmt.text.langid import LanguageIdentifier, ngrams, off_target

ROOT = Path(__file__).resolve().parents[1]
GETTEXT = ROOT / "data" / "gettext"
GETTEXT_LANGS = ("es", "de", "fr", "pt_BR", "it", "ru", "ja", "zh_CN")


def test_ngrams():
    assert ngrams("Ab  c", (1, 2)) == [" ", "a", "b", " ", "c", " ", " a", "ab", "b ", " c", "c "]
    assert ngrams("", (1, 2, 3)) == [" ", " ", "  "]


def test_scores_match_hand_computation():
    ident = LanguageIdentifier.train({"x": ["ab", "a"], "y": ["bb"]}, orders=(1,), alpha=1.0)
    # x: " ab " + " a " -> " ":4, a:2, b:1 (total 7); y: " bb " -> " ":2, b:2 (total 4); V = 3
    # "b a" -> " b a " -> unigrams " ", b, " ", a, " ": three spaces, one b, one a
    expected = {"x": 3 * math.log(5 / 10) + math.log(2 / 10) + math.log(3 / 10),
                "y": 3 * math.log(3 / 7) + math.log(3 / 7) + math.log(1 / 7)}
    scores = ident.scores("b a")
    assert ident.langs == ["x", "y"]
    for i, lang in enumerate(ident.langs):
        assert scores[i] == pytest.approx(expected[lang], rel=1e-6)
    assert ident.predict("b a") == ("x" if expected["x"] > expected["y"] else "y")
    assert ident.scores("zzz") is not None  # spaces are known n-grams
    assert ident.predict("") is not None


def test_unknown_text_gives_none():
    ident = LanguageIdentifier.train({"x": ["ab"], "y": ["cd"]}, orders=(2,))
    assert ident.predict("") is None and ident.scores("qq") is None  # no bigram of "  ", " qq " is known


def _language(seed: int, syllables: list[str]):
    """A generated language: 300 words of 1-3 syllables; sentences of 3-12 words."""
    rng = random.Random(seed)
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(300)]

    def sentences(n: int, rng: random.Random) -> list[str]:
        return [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(n)]
    return sentences


SYLLABLES = {  # overlapping inventories: "ka", "to", "ra" are shared
    "aa": ["ka", "ki", "ku", "to", "ra", "mi", "no", "sa", "shi", "ta"],
    "bb": ["sch", "ein", "ka", "ung", "ter", "ra", "ich", "ber", "to", "st"],
    "cc": ["ou", "eau", "ra", "ka", "qu", "ien", "to", "ette", "ais", "on"],
    "dd": ["ко", "ра", "ни", "то", "ка", "ст", "ов", "ый", "ме", "ль"],
}


def test_accuracy_on_generated_languages():
    gens = {lang: _language(i, syl) for i, (lang, syl) in enumerate(sorted(SYLLABLES.items()))}
    rng = random.Random(7)
    ident = LanguageIdentifier.train({lang: gen(500, rng) for lang, gen in gens.items()})
    held_out = {lang: gen(200, random.Random(100 + i)) for i, (lang, gen) in enumerate(gens.items())}
    for lang, lines in held_out.items():
        predicted = [ident.predict(line) for line in lines]
        accuracy = sum(p == lang for p in predicted) / len(lines)
        assert accuracy >= 0.99, (lang, accuracy)


def test_size_bound_and_tie_order():
    lines = ["abcdefghij klmnop", "qrstuv wxyz"]
    ident = LanguageIdentifier.train({"x": lines, "y": [s.upper()[::-1] for s in lines]}, max_ngrams=25)
    for grams, counts, total in ident.profiles.values():
        assert len(grams) == 25 and counts == sorted(counts, reverse=True) and total > sum(counts)
    assert len(ident.index) <= 50
    counts = {}
    for g in ngrams(lines[0], (1, 2, 3, 4)) + ngrams(lines[1], (1, 2, 3, 4)):
        counts[g] = counts.get(g, 0) + 1
    expected = sorted(counts, key=lambda g: (-counts[g], g))[:25]
    assert ident.profiles["x"][0] == expected


def test_max_lines():
    ident = LanguageIdentifier.train({"x": iter(["aaa", "bbb"]), "y": ["ccc"]}, orders=(1,), max_lines=1)
    assert "b" not in ident.profiles["x"][0]


def test_serialisation_round_trip_is_weights_only_safe():
    rng = random.Random(3)
    gens = {lang: _language(i, syl) for i, (lang, syl) in enumerate(sorted(SYLLABLES.items()))}
    ident = LanguageIdentifier.train({lang: gen(100, rng) for lang, gen in gens.items()}, max_ngrams=500)
    buffer = io.BytesIO()
    torch.save({"langid": ident.to_dict()}, buffer)
    buffer.seek(0)
    loaded = LanguageIdentifier.from_dict(torch.load(buffer, weights_only=True)["langid"])
    again = LanguageIdentifier.from_dict(json.loads(json.dumps(ident.to_dict())))  # plain types only
    probe = [gen(1, random.Random(50))[0] for gen in gens.values()] + ["ka to ra", "ストリング"]
    for text in probe:
        assert (loaded.scores(text) == ident.scores(text)).all()
        assert again.predict(text) == ident.predict(text)
    with pytest.raises(UserError, match="not a language identifier"):
        LanguageIdentifier.from_dict({"format": "something else"})
    broken = ident.to_dict()
    del broken["profiles"]["aa"]["total"]
    with pytest.raises(UserError, match="damaged language identifier"):
        LanguageIdentifier.from_dict(broken)


def test_errors_are_user_errors():
    with pytest.raises(UserError, match="no training text for 'y'"):
        LanguageIdentifier.train({"x": ["abc"], "y": []})
    with pytest.raises(UserError, match="no languages"):
        LanguageIdentifier.train({})


def test_off_target():
    gens = {lang: _language(i, syl) for i, (lang, syl) in enumerate(sorted(SYLLABLES.items()))}
    rng = random.Random(11)
    ident = LanguageIdentifier.train({lang: gen(400, rng) for lang, gen in gens.items()})
    r = random.Random(12)
    aa, bb, dd = gens["aa"](3, r), gens["bb"](2, r), gens["dd"](1, r)
    hyps = [aa[0], bb[0], "", "123 -- 4.5", aa[1], dd[0], bb[1], aa[2]]
    assert off_target(hyps, "aa", ident) == (3, [2, 6, 7])  # 1-based; empty and letterless lines never count
    assert off_target(hyps, "bb", ident, margin=0) == (4, [1, 5, 6, 8])
    assert off_target([], "aa", ident) == (0, [])
    short = "ka"  # shared by every generated language: within the margin, not off-target
    scores = ident.scores(short)
    gap = float(scores.max() - scores[ident.langs.index("bb")])
    assert 0 < gap < 10 and off_target([short], "bb", ident) == (0, [])
    assert off_target([short], "bb", ident, margin=gap / 2) == (1, [1])
    with pytest.raises(UserError, match="not 'zz'"):
        off_target(hyps, "zz", ident)


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")[:-1]


@pytest.mark.skipif(not all((GETTEXT / f"{s}.en-{x}.{x}").is_file() for s in ("train", "dev") for x in GETTEXT_LANGS),
                    reason="gettext corpus not built (python3 scripts/prepare_gettext.py writes data/gettext)")
def test_accuracy_on_gettext_dev():
    corpora = {x: _lines(GETTEXT / f"train.en-{x}.{x}") for x in GETTEXT_LANGS}
    corpora["en"] = _lines(GETTEXT / "train.en-fr.en")
    ident = LanguageIdentifier.train(corpora, max_lines=20000)  # 20,000: keeps the test under ~10 s
    dev = {x: _lines(GETTEXT / f"dev.en-{x}.{x}") for x in GETTEXT_LANGS}
    dev["en"] = _lines(GETTEXT / "dev.en-fr.en")
    right = total = 0
    for lang, lines in dev.items():
        long = [line for line in lines if len(line) >= 20]
        accuracy = sum(p == lang for p in (ident.predict(line) for line in long)) / len(long)
        print(f"{lang:6} dev lines of 20+ characters: {len(long):5d}, accuracy {100 * accuracy:.1f}%")
        assert accuracy >= 0.90, lang
        right, total = right + accuracy * len(long), total + len(long)
    assert right / total >= 0.95
