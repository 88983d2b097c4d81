"""nmt/text/glossary.py: reading glossaries, matching terms as whole words, term use."""

from __future__ import annotations

import gzip
import os
import re
import threading

import pytest

from nmt.errors import UserError
from nmt.text.glossary import (Entry, Glossary, GlossaryTooLarge, appears, check_entries, joining_tokens, lines_with_terms,
                          match, needs_word_end, read_glossary, term_tokens, term_use, word_joining)


def spans(line, entries, ignore_case=False):
    return [(m.entry.source, line[m.start:m.end]) for m in match(line, entries, ignore_case)]


# --------------------------------------------------------------------------- reading

def test_read_tsv_with_comments_blanks_and_gzip(tmp_path):
    text = "# a glossary\n\nperro\tdog\n  Nueva York \t New York\r\n# end\ngato\tcat\nperro\tdog\n"
    plain = tmp_path / "g.tsv"
    plain.write_text(text, encoding="utf-8")
    packed = tmp_path / "g.tsv.gz"
    packed.write_bytes(gzip.compress(text.encode()))
    want = [Entry("perro", "dog"), Entry("Nueva York", "New York"), Entry("gato", "cat")]  # duplicate kept once
    assert read_glossary(str(plain)) == want
    assert read_glossary(str(packed)) == want


@pytest.mark.parametrize("packed", [False, True])
def test_read_from_a_named_pipe(tmp_path, packed):
    """A pipe cannot seek: fails with textio's old read-and-seek gzip check (`<(zcat g.tsv.gz)`)."""
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    data = gzip.compress(b"casa\thouse\n") if packed else b"casa\thouse\n"

    def write():
        with open(fifo, "wb") as f:
            f.write(data)
    writer = threading.Thread(target=write)
    writer.start()
    try:
        assert read_glossary(fifo) == [Entry("casa", "house")]
    finally:
        writer.join()


@pytest.mark.parametrize("line,problem", [
    ("perro dog", "found no tab"),
    ("perro\tdog\tnoun", "found 2 tabs"),
    ("perro\t", "the target term is empty"),
    ("\tdog", "the source term is empty"),
    ("perro\t  ", "the target term is empty"),
    ("perro\tdog </term>", "contains <term> or </term>"),
])
def test_malformed_line_is_one_line_error_naming_it(tmp_path, line, problem):
    path = tmp_path / "g.tsv"
    path.write_text(f"# header\ngato\tcat\n{line}\n", encoding="utf-8")
    with pytest.raises(UserError) as e:
        read_glossary(str(path))
    assert str(e.value).startswith(f"{path} line 3: ") and problem in str(e.value) and "\n" not in str(e.value)


def test_one_target_per_source_term(tmp_path):
    path = tmp_path / "g.tsv"
    path.write_text("perro\tdog\ngato\tcat\nperro\thound\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"line 3: the source term 'perro' already has the target 'dog' \(.*line 1\)"):
        read_glossary(str(path))
    with pytest.raises(UserError, match="same term \\(ignoring case\\) with different targets"):
        Glossary([Entry("Perro", "Dog"), Entry("perro", "dog")], ignore_case=True)
    assert len(Glossary([Entry("Perro", "Dog"), Entry("perro", "dog")])) == 2  # case-sensitive: two terms


def test_missing_file_and_bad_utf8(tmp_path):
    with pytest.raises(UserError, match="file not found"):
        read_glossary(str(tmp_path / "none.tsv"))
    bad = tmp_path / "bad.tsv"
    bad.write_bytes(b"ok\tfine\n\xff\tx\n")
    with pytest.raises(UserError, match="line 2: invalid UTF-8"):
        read_glossary(str(bad))


def test_check_entries_for_the_api():
    assert check_entries([["perro", "dog"], ("gato", " cat ")]) == [Entry("perro", "dog"), Entry("gato", "cat")]
    assert check_entries([]) == []
    for bad, problem in [("perro\tdog", "must be a list"), ({"perro": "dog"}, "must be a list"),
                         ([["perro"]], r"glossary\[0\] must be a \[source, target\] pair"),
                         ([["a", "b"], ["perro", 3]], r"glossary\[1\] must be"),
                         ([["a", "b"], ["", "x"]], r"glossary\[1\]: the source term is empty"),
                         ([["a", "b"], ["a", "c"]], r"glossary\[1\]: the source term 'a' already has the target 'b' "
                                                    r"\(glossary\[0\]\)")]:
        with pytest.raises(UserError, match=problem):
            check_entries(bad)
    with pytest.raises(GlossaryTooLarge, match="3 glossary entries \\(at most 2\\)"):
        check_entries([["a", "b"]] * 3, max_entries=2)


# --------------------------------------------------------------------------- matching

def test_whole_words_only():
    entries = [Entry("dog", "perro"), Entry("cat", "gato")]
    assert spans("dogs, hotdog, dog. (cat)", entries) == [("dog", "dog"), ("cat", "cat")]
    assert spans("Dog dog", entries) == [("dog", "dog")]  # case-sensitive by default
    assert spans("Dog DOG", entries, ignore_case=True) == [("dog", "Dog"), ("dog", "DOG")]
    assert spans("dog_house 2dog dog2", entries) == []  # '_' and digits are word characters


def test_terms_of_several_words_and_punctuation():
    entries = [Entry("New York", "Nueva York"), Entry("e-mail", "correo"), Entry("C++", "C++"),
               Entry(".NET", ".NET"), Entry("U.S.", "EE. UU.")]
    line = "New  York e-mail C++ C + + .NET the U.S. NewYork email"
    assert spans(line, entries) == [("New York", "New  York"), ("e-mail", "e-mail"), ("C++", "C++"),
                                    (".NET", ".NET"), ("U.S.", "U.S.")]


def test_unicode_words():
    entries = [Entry("café", "coffee"), Entry("niño", "child"), Entry("ファイル", "file"), Entry("文件", "file")]
    decomposed = "cafe\u0301 nin\u0303o"  # the same words with combining marks (NFC differs)
    assert spans(decomposed, entries) == [("café", "cafe\u0301"), ("niño", "nin\u0303o")]
    assert spans("cafés niños", entries) == []
    assert spans("このファイルを開く 打开文件夹", entries) == [("ファイル", "ファイル"), ("文件", "文件")]  # unspaced scripts
    assert spans("ÉCOLE", [Entry("école", "school")], ignore_case=True) == [("école", "ÉCOLE")]


def test_longest_match_first_then_left_to_right():
    entries = [Entry("a b", "X"), Entry("b c d", "Y"), Entry("a", "Z"), Entry("d e", "W")]
    # "b c d" is longest: it wins over "a b" and "d e" that overlap it; "a" fits before it
    assert spans("a b c d e", entries) == [("a", "a"), ("b c d", "b c d")]
    same = [Entry("x y", "1"), Entry("y z", "2")]
    assert spans("x y z", same) == [("x y", "x y")]  # equally long: the leftmost
    assert spans("x y z y z", same) == [("x y", "x y"), ("y z", "y z")]
    g = Glossary([Entry("dog", "perro"), Entry("hot dog", "perrito")])
    assert [m.entry.target for m in g.match("a hot dog and a dog")] == ["perrito", "perro"]
    assert g.targets("dog hot dog dog") == ["perro", "perrito"]  # distinct, in order of first match


def test_appears_and_word_ends():
    assert appears("New York", "I saw New York.") and not appears("New York", "New Yorker")
    assert appears("perro", "El perro, el gato") and not appears("perro", "los perros")
    assert appears("Perro", "el perro", ignore_case=True) and not appears("Perro", "el perro")
    assert needs_word_end("perro") and needs_word_end("niño") and not needs_word_end("C++")
    assert not needs_word_end("ファイル")  # an unspaced script has no word ends to respect
    assert word_joining(["▁the", "s", ",", "<unk>", "▁", "ing", "ñ", "文", "\u0301"]) == \
        [False, True, False, False, False, True, True, False, True]


# --------------------------------------------------------------------------- term use

def test_term_use_counts_matched_entries_per_line():
    entries = [Entry("perro", "dog"), Entry("gato", "cat"), Entry("casa", "house")]
    srcs = ["el perro y el perro", "el gato ve la casa", "nada", "el gato"]
    hyps = ["the dog and the dog", "the cats see the house", "nothing", "the Cat"]
    got = term_use(hyps, srcs, entries)
    # (line, entry) pairs: perro@0 (dog: yes), gato@1 (cats: not whole word), casa@1 (yes), gato@3 (Cat: case)
    assert got == {"term_use": 50.0, "term_matches": 4, "terms_used": 2, "term_lines": 3}
    assert term_use(hyps, srcs, entries, ignore_case=True)["terms_used"] == 3
    assert term_use(["x"], ["nothing here"], entries)["term_use"] is None
    assert lines_with_terms(srcs, Glossary(entries)) == [0, 1, 3]
    with pytest.raises(ValueError, match="2 translations for 1 source lines"):
        term_use(["a", "b"], ["a"], entries)


def test_term_tokens_and_joining_tokens():
    """What the search gets per line: the target terms' ids, once each, and which pieces join a word."""
    from nmt.config import TokenizerConfig
    from nmt.text.tokenizer import Tokenizer, train_sentencepiece

    from helpers import make_pairs

    text = [s for pair in make_pairs(300, 0) for s in pair]
    tok = Tokenizer(train_sentencepiece(text, TokenizerConfig(vocab_size=60, model_type="bpe", threads=1), seed=1,
                                        what="joint", log=lambda m: None))
    seqs, ends = term_tokens(["the red dog", "dog", "the  red dog", "sees"], tok)
    assert seqs == tok.encode_tgt(["the red dog", "dog", "sees"]) and ends == [True, True, True]
    pieces = tok.vocab_pieces()[1]
    joins = joining_tokens(tok)
    assert len(joins) == len(pieces) and joins is joining_tokens(tok)  # cached
    assert all(j == (not p.startswith("\u2581") and p[0].isalpha()) for p, j in zip(pieces, joins) if p.isascii()
               and not p.startswith("<"))
    assert any(joins) and not all(joins)
    with pytest.raises(UserError, match="'perro€' cannot be written by this model"):
        term_tokens(["perro€"], tok)


def test_a_placeholder_target_and_a_source_the_tokenizer_drops_are_refused_at_load():
    """`Moisés -> <ph_3>` passed and was never written (under --protect the search writes only the line's own
    placeholders); a source term of a zero-width space matched, but a line of it alone has no token and came out
    empty, without its term."""
    from nmt.config import TokenizerConfig
    from nmt.text.glossary import check_targets
    from nmt.text.protect import PLACEHOLDERS
    from nmt.text.tokenizer import Tokenizer, train_sentencepiece

    from helpers import make_pairs

    text = [s for pair in make_pairs(300, 0) for s in pair]
    tok = Tokenizer(train_sentencepiece(text, TokenizerConfig(vocab_size=60, model_type="bpe", threads=1), seed=1,
                                        what="joint", log=lambda m: None, symbols=list(PLACEHOLDERS)))
    check_targets(Glossary([Entry("perro", "dog")]), tok, 64)
    for entry, problem in [(Entry("perro", "<ph_3>"), "holds <ph_3>, a placeholder symbol"),
                           (Entry("perro", "the <ph_0> dog"), "holds <ph_0>"),
                           (Entry("\u200b", "dog"), "the source term '\\u200b' has no token for this model")]:
        with pytest.raises(UserError, match=re.escape(problem)):
            check_targets(Glossary([entry]), tok, 64)
    with pytest.raises(UserError, match="holds <ph_3>"):
        term_tokens(["<ph_3>"], tok)


def test_importable_without_torch():
    """The command layer reads glossaries before any model loads (and config checks import nmt.text.terms)."""
    import subprocess
    import sys

    code = "import sys, nmt.text.glossary, nmt.text.terms, nmt.config; assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
