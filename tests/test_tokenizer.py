"""SentencePiece training/loading, reserved ids, round trips, serialization, errors."""

import io
import os
import random

import pytest
import sentencepiece as spm

from nmt.config import config_from_dict
from nmt.errors import UserError
from nmt.tokenizer import (BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer, build_tokenizer, read_model_file,
                           sample_sentences)

ES = "casa perro gato árbol niño libro agua sol luna mar cielo tierra fuego viento año señor".split()
EN = "house dog cat tree child book water sun moon sea sky earth fire wind year lord".split()


def corpus(n=300, seed=0):
    r = random.Random(seed)
    src, tgt = [], []
    for _ in range(n):
        k = [r.randrange(len(ES)) for _ in range(r.randint(1, 12))]
        src.append(" ".join(ES[i] for i in k).capitalize() + ".")
        tgt.append(" ".join(EN[i] for i in k).capitalize() + ".")
    return src, tgt


def write_corpus(tmp_path, n=300):
    src, tgt = corpus(n)
    (tmp_path / "train.es").write_text("\n".join(src) + "\n", encoding="utf-8")
    (tmp_path / "train.en").write_text("\n".join(tgt) + "\n", encoding="utf-8")
    return src, tgt


def make_cfg(tmp_path, **tok):
    base = {"vocab_size": 60, "threads": 2}
    base.update(tok)
    train = {"src": str(tmp_path / "train.es"), "tgt": str(tmp_path / "train.en")}
    return config_from_dict({"data": {"src_lang": "es", "tgt_lang": "en", "train": train, "valid": train,
                                      "tokenizer": base}, "model": {"share_embeddings": base.get("joint", True)},
                             "output_dir": str(tmp_path), "name": "run"},
                            check_files=False)


def quiet(msg):
    pass


def test_reserved_ids_and_round_trip(tmp_path, capfd):
    src, tgt = write_corpus(tmp_path)
    tok = build_tokenizer(make_cfg(tmp_path), str(tmp_path / "run"), log=quiet)
    assert tok.joint and (PAD_ID, UNK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3)
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "run" / "spm.model"))  # independent reader
    assert [sp.id_to_piece(i) for i in range(4)] == ["<pad>", "<unk>", "<s>", "</s>"]
    assert (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()) == (0, 1, 2, 3)
    ids = tok.encode_src(src[:50])
    assert ids == [sp.encode(x) for x in src[:50]]
    assert all(i >= 4 for seq in ids for i in seq)  # no specials added while encoding
    assert tok.decode_tgt(tok.encode_tgt(tgt)) == tgt
    assert tok.decode_tgt(ids) == src[:50]
    assert capfd.readouterr().err == ""  # no SentencePiece chatter


def test_decode_ignores_specials(tmp_path):
    src, tgt = write_corpus(tmp_path)
    tok = build_tokenizer(make_cfg(tmp_path), str(tmp_path / "run"), log=quiet)
    y = tok.encode_tgt([tgt[0]])[0]
    assert tok.decode_tgt([[BOS_ID] + y + [EOS_ID, PAD_ID, PAD_ID]]) == [tgt[0]]
    assert tok.decode_tgt([]) == []


def test_separate_models(tmp_path):
    src, tgt = write_corpus(tmp_path)
    run = tmp_path / "run"
    tok = build_tokenizer(make_cfg(tmp_path, joint=False, vocab_size=50), str(run), log=quiet)
    assert not tok.joint
    assert sorted(os.listdir(run)) == ["spm.src.model", "spm.tgt.model"]
    sp_src = spm.SentencePieceProcessor(model_file=str(run / "spm.src.model"))
    sp_tgt = spm.SentencePieceProcessor(model_file=str(run / "spm.tgt.model"))
    assert tok.encode_src(src[:20]) == [sp_src.encode(x) for x in src[:20]]
    assert tok.encode_tgt(tgt[:20]) == [sp_tgt.encode(x) for x in tgt[:20]]
    assert sp_src.id_to_piece(10) != sp_tgt.id_to_piece(10) or sp_src.id_to_piece(11) != sp_tgt.id_to_piece(11)
    assert tok.src_vocab_size == sp_src.vocab_size() and tok.tgt_vocab_size == sp_tgt.vocab_size()
    assert tok.decode_tgt(tok.encode_tgt(tgt)) == tgt


@pytest.mark.parametrize("joint", [True, False])
def test_bytes_round_trip(tmp_path, joint):
    src, tgt = write_corpus(tmp_path)
    tok = build_tokenizer(make_cfg(tmp_path, joint=joint), str(tmp_path / "run"), log=quiet)
    d = tok.to_bytes()
    assert d["joint"] is joint and isinstance(d["src"], bytes)
    again = Tokenizer.from_bytes(d)
    assert again.joint == joint
    assert again.encode_src(src) == tok.encode_src(src) and again.encode_tgt(tgt) == tok.encode_tgt(tgt)
    again.save(str(tmp_path / "copy"))
    loaded = Tokenizer.load(str(tmp_path / "copy"))
    assert loaded.to_bytes() == d


def test_training_is_deterministic(tmp_path):
    write_corpus(tmp_path, n=600)
    cfg = make_cfg(tmp_path, max_sentences=200, model_type="bpe")
    a = build_tokenizer(cfg, str(tmp_path / "a"), log=quiet).to_bytes()
    b = build_tokenizer(cfg, str(tmp_path / "b"), log=quiet).to_bytes()
    assert a == b


@pytest.mark.parametrize("model_type", ["unigram", "bpe", "char", "word"])
def test_model_types(tmp_path, model_type):
    src, tgt = write_corpus(tmp_path)
    # word: a vocabulary above the number of distinct words (soft limit) so nothing maps to UNK
    vocab = 500 if model_type == "word" else 80
    tok = build_tokenizer(make_cfg(tmp_path, model_type=model_type, vocab_size=vocab), str(tmp_path / "run"), log=quiet)
    assert tok.decode_tgt(tok.encode_tgt(tgt[:30])) == tgt[:30]
    if model_type == "char":
        assert len(tok.encode_src(["casa"])[0]) >= 4


def test_sample_sentences():
    lines = [f"s{i}" for i in range(100)] + ["", ""]
    a = sample_sentences(lines, 10, seed=3)
    assert a == sample_sentences(lines, 10, seed=3) and len(a) == 10
    assert a != sample_sentences(lines, 10, seed=4)
    assert a == sorted(a, key=lambda x: int(x[1:]))  # corpus order kept
    assert sample_sentences(lines, 1000, seed=3) == lines[:100]  # empties dropped, all kept


def test_resume_loads_without_reading(tmp_path):
    write_corpus(tmp_path)
    cfg = make_cfg(tmp_path)
    first = build_tokenizer(cfg, str(tmp_path / "run"), log=quiet)
    logs = []

    def boom():
        raise AssertionError("training corpus must not be read on resume")
    again = build_tokenizer(cfg, str(tmp_path / "run"), log=logs.append, read_train=boom)
    assert again.to_bytes() == first.to_bytes()
    assert any("loaded from" in m for m in logs)
    with pytest.raises(UserError, match="joint"):
        build_tokenizer(make_cfg(tmp_path, joint=False), str(tmp_path / "run"), log=quiet, read_train=boom)


def test_load_existing_model_files(tmp_path):
    write_corpus(tmp_path)
    trained = build_tokenizer(make_cfg(tmp_path, joint=False), str(tmp_path / "first"), log=quiet)
    cfg = make_cfg(tmp_path, joint=False, src_model=str(tmp_path / "first" / "spm.src.model"),
                   tgt_model=str(tmp_path / "first" / "spm.tgt.model"))

    def boom():
        raise AssertionError("must not train")
    tok = build_tokenizer(cfg, str(tmp_path / "run"), log=quiet, read_train=boom)
    assert tok.to_bytes() == trained.to_bytes()
    assert sorted(os.listdir(tmp_path / "run")) == ["spm.src.model", "spm.tgt.model"]


def test_wrong_special_ids_rejected(tmp_path):
    src, _ = corpus()
    out = io.BytesIO()  # SentencePiece defaults: unk=0, bos=1, eos=2, no pad
    spm.SentencePieceTrainer.train(sentence_iterator=iter(src), model_writer=out, vocab_size=40, minloglevel=2)
    path = tmp_path / "default.model"
    path.write_bytes(out.getvalue())
    with pytest.raises(UserError, match=r"default\.model.*pad=-1 unk=0 bos=1 eos=2"):
        read_model_file(str(path))
    write_corpus(tmp_path)
    with pytest.raises(UserError, match=r"default\.model"):
        build_tokenizer(make_cfg(tmp_path, model=str(path)), str(tmp_path / "run"), log=quiet)


def test_bad_model_files(tmp_path):
    (tmp_path / "junk.model").write_bytes(b"not a model")
    with pytest.raises(UserError, match=r"junk\.model: not a valid SentencePiece model"):
        read_model_file(str(tmp_path / "junk.model"))
    with pytest.raises(UserError, match="not found"):
        read_model_file(str(tmp_path / "missing.model"))


def test_tiny_corpus(tmp_path):
    write_corpus(tmp_path, n=20)
    logs = []
    tok = build_tokenizer(make_cfg(tmp_path, vocab_size=5000), str(tmp_path / "run"), log=logs.append)
    assert 4 < tok.src_vocab_size < 5000
    assert any("too large" in m for m in logs)
    with pytest.raises(UserError, match="vocab_size") as e:
        build_tokenizer(make_cfg(tmp_path, vocab_size=8), str(tmp_path / "run2"), log=quiet)
    assert "\n" not in str(e.value)
