"""SentencePiece training/loading, reserved ids, round trips, serialization, streamed sampling,
source tags, the saved settings (stale models are not reused), errors."""

import io
import json
import os
import random

import numpy as np
import pytest
import sentencepiece as spm

from nmt.text import sources
from nmt.config import config_from_dict
from nmt.errors import UserError
from nmt.text.tokenizer import (BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer, build_tokenizer, iter_sample,
                           read_model_file, sample_indices)

from helpers import quiet

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


def make_cfg(tmp_path, train=None, seed=1, valid=None, **tok):
    base = {"vocab_size": 60, "threads": 2}
    base.update(tok)
    default = {"src": str(tmp_path / "train.es"), "tgt": str(tmp_path / "train.en")}
    return config_from_dict({"data": {"src_lang": "es", "tgt_lang": "en", "train": train or default,
                                      "valid": valid or default,
                                      "tokenizer": base}, "model": {"share_embeddings": base.get("joint", True)},
                             "output_dir": str(tmp_path), "name": "run", "seed": seed},
                            check_files=False)


def no_reading(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("the training corpus must not be read")
    monkeypatch.setattr(sources, "iter_pairs", boom)
    monkeypatch.setattr(sources, "iter_side", boom)


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
    assert sorted(os.listdir(run)) == ["spm.json", "spm.src.model", "spm.tgt.model"]
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


def old_sample_sentences(lines, max_sentences, seed):
    """`sample_sentences` before issue 17 (all lines in memory), kept as the reference."""
    lines = [x for x in lines if x]
    if len(lines) <= max_sentences:
        return lines
    keep = np.sort(np.random.default_rng(seed).choice(len(lines), max_sentences, replace=False))
    return [lines[i] for i in keep]


def test_sample_sentences():
    lines = [f"s{i}" for i in range(100)] + ["", ""]
    a = sample_sentences(lines, 10, seed=3)
    assert a == sample_sentences(lines, 10, seed=3) and len(a) == 10
    assert a != sample_sentences(lines, 10, seed=4)
    assert a == sorted(a, key=lambda x: int(x[1:]))  # corpus order kept
    assert sample_sentences(lines, 1000, seed=3) == lines[:100]  # empties dropped, all kept
    mixed = [("" if i % 7 == 0 else f"s{i}") for i in range(5000)]
    for m in (1, 10, 99, 4000, 4285, 4286, 10**6):  # 4285 non-empty lines
        assert sample_sentences(mixed, m, seed=5) == old_sample_sentences(mixed, m, seed=5)


def old_train(lines, vocab_size, max_sentences, seed, model_type="unigram", threads=2):
    """The in-memory training path before issue 17: sample a list, feed it to SentencePiece."""
    spm.set_random_generator_seed(seed)
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(old_sample_sentences(lines, max_sentences, seed)), model_writer=out,
        vocab_size=vocab_size, model_type=model_type, character_coverage=1.0, num_threads=threads,
        input_sentence_size=max_sentences, shuffle_input_sentence=True,
        pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID, minloglevel=2)
    return out.getvalue()


@pytest.mark.parametrize("joint", [True, False])
def test_streamed_training_is_byte_identical_to_in_memory(tmp_path, monkeypatch, joint):
    monkeypatch.setattr(sources, "CHUNK", 50)
    src, tgt = corpus(700)
    src[10] = src[400] = tgt[20] = ""  # empty lines are skipped before sampling
    bt_src, bt_tgt = corpus(300, seed=9)
    files = {}
    for name, lines in (("a.es", src), ("a.en", tgt), ("b.es", bt_src), ("b.en", bt_tgt)):
        (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
        files[name] = str(tmp_path / name)
    train = [{"src": files["a.es"], "tgt": files["a.en"]}, {"src": files["b.es"], "tgt": files["b.en"], "weight": 2}]
    cfg = make_cfg(tmp_path, train, seed=3, joint=joint, max_sentences=450, vocab_size=60)
    tok = build_tokenizer(cfg, str(tmp_path / "run"), log=quiet).to_bytes()
    all_src, all_tgt = src + bt_src, tgt + bt_tgt  # corpora in order; joint: all sources, then all targets
    if joint:
        assert tok["src"] == old_train(all_src + all_tgt, 60, 450, 3)
    else:
        assert (tok["src"], tok["tgt"]) == (old_train(all_src, 60, 450, 3), old_train(all_tgt, 60, 450, 3))
    small = make_cfg(tmp_path, train[:1], seed=3, joint=joint, max_sentences=10**6, vocab_size=60)  # all sampled
    assert build_tokenizer(small, str(tmp_path / "run2"), log=quiet).to_bytes()["src"] == \
        old_train(src + tgt if joint else src, 60, 10**6, 3)


@pytest.mark.parametrize("model_type", ["unigram", "bpe", "char", "word"])
def test_tags_are_one_token(tmp_path, model_type):
    src, tgt = write_corpus(tmp_path)
    train = [{"src": str(tmp_path / "train.es"), "tgt": str(tmp_path / "train.en")},
             {"src": str(tmp_path / "train.es"), "tgt": str(tmp_path / "train.en"), "src_tag": "<BT>"},
             {"src": str(tmp_path / "train.es"), "tgt": str(tmp_path / "train.en"), "src_tag": "<b.t-2_x>"}]
    vocab = 500 if model_type == "word" else 80
    tok = build_tokenizer(make_cfg(tmp_path, train, model_type=model_type, vocab_size=vocab),
                          str(tmp_path / "run"), log=quiet)
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "run" / "spm.model"))  # independent reader
    for tag in ("<BT>", "<b.t-2_x>"):
        tag_id = sp.piece_to_id("\u2581" + tag)
        assert tag_id > UNK_ID
        ids = tok.encode_src([f"{tag} hola", tag, f"{tag} {src[0]}"])
        assert ids[0][0] == ids[1][0] == ids[2][0] == tag_id and ids[1] == [tag_id]
        assert ids[2][1:] == tok.encode_src([src[0]])[0]  # the rest encodes as without the tag
        assert tok.decode_tgt([ids[2]]) == [f"{tag} {src[0]}"]


def test_loaded_model_tags_are_checked(tmp_path):
    write_corpus(tmp_path)
    build_tokenizer(make_cfg(tmp_path), str(tmp_path / "plain"), log=quiet)
    tagged = [{"src": str(tmp_path / "train.es"), "tgt": str(tmp_path / "train.en"), "src_tag": "<BT>"}]
    build_tokenizer(make_cfg(tmp_path, tagged), str(tmp_path / "with_tag"), log=quiet)
    ok = build_tokenizer(make_cfg(tmp_path, tagged, model=str(tmp_path / "with_tag" / "spm.model")),
                         str(tmp_path / "run_ok"), log=quiet)
    assert len(ok.encode_src(["<BT>"])[0]) == 1
    with pytest.raises(UserError) as e:
        build_tokenizer(make_cfg(tmp_path, tagged, model=str(tmp_path / "plain" / "spm.model")),
                        str(tmp_path / "run_bad"), log=quiet)
    msg = str(e.value)
    assert "src_tag <BT> is not one token" in msg and "plain/spm.model" in msg and "\n" not in msg


def test_reused_only_with_the_same_settings(tmp_path, monkeypatch):
    write_corpus(tmp_path)
    cfg = make_cfg(tmp_path)
    run = str(tmp_path / "run")
    first = build_tokenizer(cfg, run, log=quiet)
    settings = json.loads((tmp_path / "run" / "spm.json").read_text())
    assert settings["tokenizer"]["vocab_size"] == 60 and "threads" not in settings["tokenizer"]
    assert settings["seed"] == 1 and settings["tags"] == [] and settings["sources"][0][0] == "text"
    logs = []
    with monkeypatch.context() as m:
        no_reading(m)
        again = build_tokenizer(make_cfg(tmp_path, threads=1), run, log=logs.append)  # threads do not count
    assert again.to_bytes() == first.to_bytes() and any("loaded from" in x for x in logs)
    logs = []
    separate = build_tokenizer(make_cfg(tmp_path, joint=False), run, log=logs.append)  # other settings: retrained
    assert not separate.joint and sorted(os.listdir(run)) == ["spm.json", "spm.src.model", "spm.tgt.model"]
    assert any("not reusing" in x and "data.tokenizer.joint" in x for x in logs)
    assert Tokenizer.load(run).to_bytes() == separate.to_bytes()


def test_stale_tokenizer_is_not_reused(tmp_path):
    """Issue 15 item 5: a first attempt writes spm.model and then fails; the rerun with another
    data.tokenizer.vocab_size must not train with the old model."""
    from helpers import prepare_data

    write_corpus(tmp_path)
    (tmp_path / "bad.es").write_text("uno\ndos\n", encoding="utf-8")
    (tmp_path / "bad.en").write_text("one\n", encoding="utf-8")
    run = str(tmp_path / "run")
    failing = make_cfg(tmp_path, vocab_size=60, valid={"src": str(tmp_path / "bad.es"), "tgt": str(tmp_path / "bad.en")})
    with pytest.raises(UserError, match="different line counts"):  # the first attempt fails after the tokenizer
        prepare_data(failing, run, log=quiet)
    assert Tokenizer.load(run).src_vocab_size == 60
    logs = []
    tok, _ = prepare_data(make_cfg(tmp_path, vocab_size=80), run, log=logs.append)
    assert tok.src_vocab_size == 80 == Tokenizer.load(run).src_vocab_size
    assert any("not reusing the model" in m and "data.tokenizer.vocab_size" in m for m in logs)
    os.remove(os.path.join(run, "spm.json"))  # a model without its settings (an older run) counts as different
    logs = []
    build_tokenizer(make_cfg(tmp_path, vocab_size=80), run, log=logs.append)
    assert any("no settings file" in m for m in logs)
    logs = []
    build_tokenizer(make_cfg(tmp_path, vocab_size=80, model_type="bpe"), run, log=logs.append)
    assert any("data.tokenizer.model_type" in m for m in logs)
    write_corpus(tmp_path, n=250)  # the corpus changed
    logs = []
    build_tokenizer(make_cfg(tmp_path, vocab_size=80, model_type="bpe"), run, log=logs.append)
    assert any("training corpora" in m for m in logs)


def test_load_existing_model_files(tmp_path, monkeypatch):
    write_corpus(tmp_path)
    trained = build_tokenizer(make_cfg(tmp_path, joint=False), str(tmp_path / "first"), log=quiet)
    cfg = make_cfg(tmp_path, joint=False, src_model=str(tmp_path / "first" / "spm.src.model"),
                   tgt_model=str(tmp_path / "first" / "spm.tgt.model"))
    no_reading(monkeypatch)
    tok = build_tokenizer(cfg, str(tmp_path / "run"), log=quiet)
    assert tok.to_bytes() == trained.to_bytes()
    assert sorted(os.listdir(tmp_path / "run")) == ["spm.json", "spm.src.model", "spm.tgt.model"]
    settings = json.loads((tmp_path / "run" / "spm.json").read_text())
    assert [fp[0] for fp in settings["sources"]] == [cfg.data.tokenizer.src_model, cfg.data.tokenizer.tgt_model]


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


def sample_sentences(lines: list[str], max_sentences: int, seed: int) -> list[str]:
    """At most max_sentences non-empty lines, a seeded uniform sample in corpus order."""
    n = sum(1 for x in lines if x)
    return list(iter_sample(lines, sample_indices(n, max_sentences, seed)))
