"""nmt/text/terms.py and data.terms: inline term annotation (Dinu et al., 2019) of training pairs, the
dictionary extracted from a corpus, and the tokenizer's term markers."""

from __future__ import annotations

import re

import pytest

from nmt.config import ConfigError
from nmt.errors import UserError
from nmt.text.glossary import Entry, Glossary
from nmt.text.terms import TERM_SYMBOLS, annotate, annotate_pair, extract_dictionary, known_by
from nmt.text.tokenizer import build_tokenizer

from helpers import EN, ES, corpus, corpus_cfg, make_cfg, prepare_data, quiet, write

DICTIONARY = {"casa": "house", "perro": "dog", "niño": "child"}


def test_annotate_format():
    g = Glossary([Entry("perro", "dog"), Entry("Nueva York", "New York")])
    line = "el perro ve Nueva York, y el perro."
    assert annotate(line, g.match(line)) == ("el perro <term> dog </term> ve Nueva York <term> New York </term>, "
                                             "y el perro <term> dog </term>.")
    assert annotate("nada", []) == "nada"


def test_annotate_pair_needs_the_target_term_and_draws_a_share():
    g = Glossary([Entry("perro", "dog"), Entry("gato", "cat")])
    assert annotate_pair("el perro y el gato", "the dog and the cats", g, 1.0) == "el perro <term> dog </term> y el gato"
    assert annotate_pair("el perro", "the dog", g, 0.0) == "el perro"
    pairs = [(f"el perro {i}", f"the dog {i}") for i in range(600)]
    done = [annotate_pair(s, t, g, 0.5) for s, t in pairs]
    assert done == [annotate_pair(s, t, g, 0.5) for s, t in pairs]  # a pair always comes out the same
    share = sum("<term>" in x for x in done) / len(done)
    assert 0.43 < share < 0.57


# --------------------------------------------------------------------------- extraction

def test_extract_dictionary_recovers_a_word_for_word_mapping():
    """The helpers' corpus translates ES[i] as EN[i] word for word, in bags of random words: each true
    pair co-occurs in all its lines, any other pair in about a third of them."""
    src, tgt = corpus(1500, seed=3)
    src += ["casa", "casa", "zorro", "zorro", "zorro", "lobo lobo", "lobo", "lobo", "lobo"]
    tgt += ["house", "house", "fox", "fox", "fox", "wolf", "wolf", "wolf", "animal"]
    found = extract_dictionary(zip(src, tgt), stopwords=0)
    rare = {Entry("zorro", "fox"), Entry("lobo", "wolf")}  # lobo: wolf in 3 of its 4 lines (75%)
    assert set(found) == {Entry(s, t) for s, t in zip(ES, EN)} | rare
    assert found[0] == Entry("zorro", "fox")  # the rarest source word first (3 lines)
    assert Entry("zorro", "fox") not in extract_dictionary(zip(src, tgt), stopwords=0, min_count=4)
    assert Entry("lobo", "wolf") not in extract_dictionary(zip(src, tgt), stopwords=0, min_share=0.8)
    df = {w: sum(w in line.split() for line in src + tgt) for w in ES + EN}
    for asked, dropped in ((3, 1), (1, 1), (0, 0)):  # 18 distinct words a side: a tenth of them is 1
        frequent = set(sorted(ES, key=lambda w: (-df[w], w))[:dropped])
        frequent |= set(sorted(EN, key=lambda w: (-df[w], w))[:dropped])
        want = {Entry(s, t) for s, t in zip(ES, EN) if s not in frequent and t not in frequent} | rare
        assert set(extract_dictionary(zip(src, tgt), stopwords=asked)) == want
        assert len(want) < len(ES) + 2 or not dropped
    assert extract_dictionary(zip(src, tgt), stopwords=0, max_lines=2) == []


def test_extract_dictionary_leaves_out_ambiguous_words():
    src = ["el banco"] * 5 + ["un banco"] * 5 + ["el río"] * 6
    tgt = ["the bank"] * 5 + ["a bench"] * 5 + ["the river"] * 6
    found = {e.source: e.target for e in extract_dictionary(zip(src, tgt), stopwords=0)}
    assert "banco" not in found and found["río"] == "river"  # banco: each target in only half its lines


# --------------------------------------------------------------------------- training data

def _expected(src: str, tgt: str) -> str:
    """An independent annotation of a helpers-corpus pair (space-separated words)."""
    words = tgt.split()
    return " ".join(w + (f" <term> {DICTIONARY[w]} </term>" if w in DICTIONARY and DICTIONARY[w] in words else "")
                    for w in src.split())


def _terms_cfg(tmp_path, **data):
    src, tgt = corpus(300)
    train = corpus_cfg(write(tmp_path / "t.es", src), write(tmp_path / "t.en", tgt))
    gloss = write(tmp_path / "g.tsv", ["# es\ten"] + [f"{a}\t{b}" for a, b in DICTIONARY.items()])
    data = {"terms": 1.0, "term_dictionary": gloss, **data}
    return make_cfg(tmp_path, train, **data), src, tgt


def _decoded(tokenizer, enc, side):
    return [tokenizer.decode_tgt([getattr(enc, side)(i)])[0] for i in range(len(enc))]


def test_training_pairs_get_term_annotations(tmp_path):
    cfg, src, tgt = _terms_cfg(tmp_path)
    logs = []
    tokenizer, data = prepare_data(cfg, cfg.run_dir, logs.append)
    assert known_by(tokenizer)
    assert [len(tokenizer.encode_src([s])[0]) for s in TERM_SYMBOLS] == [1, 1]  # one symbol each
    plain = dict(zip(tgt, src))
    got_src, got_tgt = _decoded(tokenizer, data.train, "src"), _decoded(tokenizer, data.train, "tgt")
    assert len(got_src) > 250 and sum("<term>" in s for s in got_src) > 100  # (a few fail max_ratio)
    assert got_src == [_expected(plain[t], t) for t in got_tgt]
    assert all("<term>" not in s for s in _decoded(tokenizer, data.valid, "src"))  # validation stays plain
    assert any("3 term dictionary entries from" in x for x in logs)


def test_extracted_dictionary_when_none_is_given(tmp_path):
    cfg, src, tgt = _terms_cfg(tmp_path, term_dictionary=None)
    logs = []
    tokenizer, data = prepare_data(cfg, cfg.run_dir, logs.append)
    found = [x for x in logs if "term dictionary entries extracted from the corpus" in x]
    assert found and int(re.search(r"(\d+) term dictionary", found[0]).group(1)) > 0
    got = _decoded(tokenizer, data.train, "src")
    pairs = re.findall(r"(\S+) <term> (\S+) </term>", " ".join(got))
    assert pairs and all(EN[ES.index(s)] == t for s, t in pairs)  # terms of the corpus' own mapping


def test_the_extracted_training_dictionary_leaves_out_words_translated_by_themselves(tmp_path):
    """A name on both sides aligns as well as any term, but a model copies it anyway: annotating it
    (half of the gettext annotations were such) cost that corpus' terms model 2 BLEU (issue 37).
    data.term_identical keeps them."""
    src, tgt = corpus(300)
    src, tgt = ([line + " Madrid" if i % 3 == 0 else line for i, line in enumerate(side)] for side in (src, tgt))
    assert ("Madrid", "Madrid") in {(e.source, e.target) for e in extract_dictionary(zip(src, tgt))}
    train = corpus_cfg(write(tmp_path / "t.es", src), write(tmp_path / "t.en", tgt))
    cfg = make_cfg(tmp_path, train, terms=1.0, term_dictionary=None)
    tokenizer, data = prepare_data(cfg, cfg.run_dir, lambda msg: None)
    pairs = re.findall(r"(\S+) <term> (\S+) </term>", " ".join(_decoded(tokenizer, data.train, "src")))
    assert pairs and all(EN[ES.index(s)] == t for s, t in pairs)  # the real terms, and no Madrid
    cfg = make_cfg(tmp_path / "kept", train, terms=1.0, term_dictionary=None, term_identical=True)
    tokenizer, data = prepare_data(cfg, cfg.run_dir, lambda msg: None)  # (another cache key: not the one above)
    pairs = re.findall(r"(\S+) <term> (\S+) </term>", " ".join(_decoded(tokenizer, data.train, "src")))
    assert ("Madrid", "Madrid") in pairs and all(s == "Madrid" or EN[ES.index(s)] == t for s, t in pairs)


def test_annotations_never_drop_or_keep_a_pair(tmp_path):
    """The filters judge the plain pair (an annotated short pair would exceed max_ratio), and a source
    whose annotated form would exceed max_len stays plain."""
    cfg, src, tgt = _terms_cfg(tmp_path, max_ratio=1.5, max_len=12)
    tokenizer, data = prepare_data(cfg, cfg.run_dir, quiet)
    n_src = lambda x: len(tokenizer.encode_src([x])[0])  # noqa: E731
    n_tgt = lambda x: len(tokenizer.encode_tgt([x])[0])  # noqa: E731
    kept = [(s, t) for s, t in zip(src, tgt)
            if 0 < n_src(s) <= 12 and 0 < n_tgt(t) <= 12 and max(n_src(s), n_tgt(t)) <= 1.5 * min(n_src(s), n_tgt(t))]
    assert data.train.stats["kept"] == len(kept)
    want = [_expected(s, t) if n_src(_expected(s, t)) <= 12 else s for s, t in kept]
    assert _decoded(tokenizer, data.train, "src") == want
    annotated = [(s, t) for s, t in kept if _expected(s, t) != s]
    assert any(n_src(_expected(s, t)) > 1.5 * n_tgt(t) for s, t in annotated if n_src(_expected(s, t)) <= 12)
    assert any(n_src(_expected(s, t)) > 12 for s, t in annotated) and any(w != s for w, (s, _) in zip(want, kept))


def test_term_settings_in_config_and_tokenizer(tmp_path):
    cfg, src, tgt = _terms_cfg(tmp_path)
    train = cfg.data.train
    for data, problem in [({"term_dictionary": "g.tsv"}, "'data.term_dictionary' is set but 'data.terms' is 0"),
                          ({"terms": 0.5, "term_dictionary": str(tmp_path / "none.tsv")}, "data file not found"),
                          ({"terms": 1.5}, "data.terms"),
                          ({"term_identical": True}, "'data.term_identical' is for the dictionary extracted"),
                          ({"terms": 0.5, "term_dictionary": "g.tsv", "term_identical": True}, "no 'data.term_dictionary'"),
                          ({"train": {**corpus_cfg(train.src, train.tgt), "src_tag": "<term>"}}, "reserved for the term")]:
        d = {"src_lang": "es", "tgt_lang": "en", "train": corpus_cfg(train.src, train.tgt),
             "valid": corpus_cfg(train.src, train.tgt), **data}
        from nmt.config import config_from_dict
        with pytest.raises(ConfigError, match=re.escape(problem)):
            config_from_dict({"data": d, "output_dir": str(tmp_path), "name": "x"})
    plain, _, _ = _terms_cfg(tmp_path, terms=0.0, term_dictionary=None)
    tokenizer = build_tokenizer(plain, cfg.run_dir, quiet)
    assert not known_by(tokenizer)
    logs = []
    assert known_by(build_tokenizer(cfg, cfg.run_dir, logs.append))  # not the one without markers
    assert any("not reusing" in x and "data.terms" in x for x in logs)
    from nmt.data.batches import load_data
    with pytest.raises(UserError, match="no term markers"):
        load_data(cfg, tokenizer, cfg.run_dir, quiet)
