"""Reading sources, encoding + cache, filtering, batching, collate, sharding, and every data error."""

import gzip
import json
import random

import numpy as np
import pytest
import torch

from nmt import data as D
from nmt.config import CorpusConfig, config_from_dict
from nmt.errors import UserError
from nmt.sources import read_corpus
from nmt.tokenizer import BOS_ID, EOS_ID, PAD_ID, build_tokenizer

ES = "casa perro gato árbol niño libro agua sol luna mar cielo tierra fuego viento año señor".split()
EN = "house dog cat tree child book water sun moon sea sky earth fire wind year lord".split()


def corpus(n=300, seed=0):
    r = random.Random(seed)
    pairs = [[r.randrange(len(ES)) for _ in range(r.randint(1, 12))] for _ in range(n)]
    return [" ".join(ES[i] for i in k) for k in pairs], [" ".join(EN[i] for i in k) for k in pairs]


def write(path, lines, gz=False):
    text = ("\n".join(lines) + "\n").encode("utf-8")
    path.write_bytes(gzip.compress(text) if gz else text)
    return str(path)


def corpus_cfg(src, tgt):
    return {"src": str(src), "tgt": str(tgt)}


def make_cfg(tmp_path, train, valid=None, **data):
    d = {"src_lang": "es", "tgt_lang": "en", "train": train, "valid": valid or train,
         "tokenizer": {"vocab_size": 60, "threads": 2}, **data}
    return config_from_dict({"data": d, "output_dir": str(tmp_path), "name": "run"}, check_files=False)


def quiet(msg):
    pass


def from_lists(src, tgt, dtype=np.int16):
    """An EncodedCorpus built by hand from lists of ids."""
    def side(seqs):
        off = np.zeros(len(seqs) + 1, np.int64)
        off[1:] = np.cumsum([len(x) for x in seqs])
        return np.array([i for x in seqs for i in x], dtype), off
    return D.EncodedCorpus(*side(src), *side(tgt))


# --------------------------------------------------------------------------- sources

@pytest.mark.parametrize("gz", [False, True])
def test_text_files(tmp_path, gz):
    src, tgt = corpus(50)
    c = corpus_cfg(write(tmp_path / "a.es", src, gz), write(tmp_path / "a.en", tgt, gz))
    assert read_corpus(make_cfg(tmp_path, c).data.train, "es", "en") == (src, tgt)
    capped = make_cfg(tmp_path, {**c, "max_sentences": 7}).data.train
    assert read_corpus(capped, "es", "en") == (src[:7], tgt[:7])


def test_text_whitespace_bom_and_stray_cr(tmp_path):
    (tmp_path / "a.es").write_bytes("\ufeffuno \r\ndos\rtres\n  cuatro\n".encode())
    (tmp_path / "a.en").write_bytes(b"one\r\ntwo three\nfour\n")
    cfg = make_cfg(tmp_path, corpus_cfg(tmp_path / "a.es", tmp_path / "a.en"))
    assert read_corpus(cfg.data.train, "es", "en") == (["uno", "dos\rtres", "cuatro"], ["one", "two three", "four"])


def test_missing_file(tmp_path):
    write(tmp_path / "a.en", ["x"])
    cfg = make_cfg(tmp_path, corpus_cfg(tmp_path / "nope.es", tmp_path / "a.en"))
    with pytest.raises(UserError, match=r"data file not found: .*nope\.es"):
        read_corpus(cfg.data.train, "es", "en")


def test_line_count_mismatch(tmp_path):
    c = corpus_cfg(write(tmp_path / "a.es", ["a", "b", "c"]), write(tmp_path / "a.en", ["a", "b"], gz=True))
    with pytest.raises(UserError) as e:
        read_corpus(make_cfg(tmp_path, c).data.train, "es", "en")
    msg = str(e.value)
    assert "a.es has 3" in msg and "a.en has 2" in msg and "\n" not in msg
    with pytest.raises(UserError, match="different line counts"):  # also when only a prefix is read
        read_corpus(make_cfg(tmp_path, {**c, "max_sentences": 1}).data.train, "es", "en")


@pytest.mark.parametrize("gz", [False, True])
def test_invalid_utf8(tmp_path, gz):
    raw = b"ok\nstill ok\nbad \xff\xfe byte\n"
    (tmp_path / "a.es").write_bytes(gzip.compress(raw) if gz else raw)
    write(tmp_path / "a.en", ["a", "b", "c"])
    cfg = make_cfg(tmp_path, corpus_cfg(tmp_path / "a.es", tmp_path / "a.en"))
    with pytest.raises(UserError, match=r"a\.es: line 3: invalid UTF-8"):
        read_corpus(cfg.data.train, "es", "en")


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    return datasets


def hf_cfg(tmp_path, **c):
    return make_cfg(tmp_path, c).data.train


def test_hf_save_to_disk(tmp_path, hf_cache):
    ds = hf_cache
    src, tgt = corpus(20)
    features = ds.Features({"translation": ds.Translation(languages=["en", "es"]), "id": ds.Value("int32")})
    rows = {"translation": [{"es": s, "en": t} for s, t in zip(src, tgt)], "id": list(range(20))}
    ds.Dataset.from_dict(rows, features=features).save_to_disk(str(tmp_path / "one"))
    assert read_corpus(hf_cfg(tmp_path, hf_path=str(tmp_path / "one")), "es", "en") == (src, tgt)
    assert read_corpus(hf_cfg(tmp_path, hf_path=str(tmp_path / "one"), max_sentences=5), "es", "en") == (src[:5], tgt[:5])
    # a DatasetDict: the split is picked; dotted field names work
    small = ds.Dataset.from_dict({k: v[:3] for k, v in rows.items()}, features=features)
    ds.DatasetDict({"train": ds.Dataset.from_dict(rows, features=features), "validation": small}
                   ).save_to_disk(str(tmp_path / "dict"))
    c = hf_cfg(tmp_path, hf_path=str(tmp_path / "dict"), hf_split="validation",
               src_field="translation.en", tgt_field="translation.es")
    assert read_corpus(c, "es", "en") == (tgt[:3], src[:3])
    with pytest.raises(UserError, match=r"no split 'test' \(splits: train, validation\)"):
        read_corpus(hf_cfg(tmp_path, hf_path=str(tmp_path / "dict"), hf_split="test"), "es", "en")
    with pytest.raises(UserError, match=r"no field 'translation\.fr' \(fields: translation\.en, translation\.es, id\)"):
        read_corpus(hf_cfg(tmp_path, hf_path=str(tmp_path / "one")), "fr", "en")
    with pytest.raises(UserError, match="'id' is not a text column"):
        read_corpus(hf_cfg(tmp_path, hf_path=str(tmp_path / "one"), src_field="id"), "es", "en")


@pytest.mark.parametrize("fmt", ["json", "jsonl", "csv", "parquet"])
def test_hf_local_files(tmp_path, hf_cache, fmt):
    src, tgt = corpus(25)
    path = tmp_path / f"data.{fmt}"
    if fmt == "json":  # nested translation dict, the default fields
        path.write_text(json.dumps([{"translation": {"es": s, "en": t}} for s, t in zip(src, tgt)]))
        c = hf_cfg(tmp_path, hf_path="json", hf_data_files=[str(path)])
    elif fmt == "jsonl":
        path.write_text("".join(json.dumps({"es_text": s, "en_text": t}) + "\n" for s, t in zip(src, tgt)))
        c = hf_cfg(tmp_path, hf_path="json", hf_data_files=[str(path)], src_field="es_text", tgt_field="en_text")
    elif fmt == "csv":
        path.write_text("source,target\n" + "".join(f'"{s}","{t}"\n' for s, t in zip(src, tgt)))
        c = hf_cfg(tmp_path, hf_path="csv", hf_data_files=[str(path)], src_field="source", tgt_field="target")
    else:
        hf_cache.Dataset.from_dict({"source": src, "target": tgt}).to_parquet(str(path))
        c = hf_cfg(tmp_path, hf_path="parquet", hf_data_files=[str(path)], hf_split="valid",
                   src_field="source", tgt_field="target")
    assert read_corpus(c, "es", "en") == (src, tgt)
    with pytest.raises(UserError, match=r"has no field 'nope' \(fields: .+\)"):
        read_corpus(CorpusConfig(**{**c.__dict__, "src_field": "nope"}), "es", "en")


def test_hf_hub_offline(tmp_path, hf_cache, monkeypatch):
    monkeypatch.setattr(hf_cache.config, "HF_HUB_OFFLINE", True)
    c = hf_cfg(tmp_path, hf_path="someone/no-such-dataset", hf_name="de-en")
    with pytest.raises(UserError) as e:
        read_corpus(c, "de", "en")
    msg = str(e.value)
    assert "cannot load Hugging Face dataset 'someone/no-such-dataset', name=de-en, split 'train'" in msg
    assert "offline" in msg and "save_to_disk" in msg and "\n" not in msg


# --------------------------------------------------------------------------- encode, filter, cache

def test_filter_pairs_counts():
    s = np.array([0, 3, 5, 2, 9, 10, 4, 1, 0, 7])
    t = np.array([2, 0, 5, 7, 3, 10, 12, 3, 0, 14])
    keep, counts = D.filter_pairs(s, t, max_len=10, max_ratio=3.0)
    expect = {"pairs": 10, "empty": 0, "too_long": 0, "ratio": 0, "kept": 0}
    ref_keep = []
    for a, b in zip(s, t):  # reference, rule by rule
        rule = ("empty" if a == 0 or b == 0 else "too_long" if max(a, b) > 10
                else "ratio" if max(a, b) / min(a, b) > 3.0 else "kept")
        expect[rule] += 1
        ref_keep.append(rule == "kept")
    assert counts == expect == {"pairs": 10, "empty": 3, "too_long": 2, "ratio": 1, "kept": 4}
    assert keep.tolist() == ref_keep
    keep, counts = D.filter_pairs(s, t, max_len=10, max_ratio=None)  # valid: only over-long pairs go
    assert counts["too_long"] == 2 and counts["kept"] == 8 and counts["empty"] == 0


def test_encoded_corpus_compact_and_subset(tmp_path):
    src, tgt = corpus(100)
    c = corpus_cfg(write(tmp_path / "a.es", src), write(tmp_path / "a.en", tgt))
    tok = build_tokenizer(make_cfg(tmp_path, c), str(tmp_path / "run"), log=quiet)
    enc = D.encode_corpus(tok, src, tgt)
    assert enc.src_tokens.dtype == np.int16 and enc.src_offsets.dtype == np.int64
    assert D.token_dtype(32768) == np.int16 and D.token_dtype(32769) == np.int32
    ref_src, ref_tgt = tok.encode_src(src), tok.encode_tgt(tgt)
    assert [enc.src(i).tolist() for i in range(len(enc))] == ref_src
    assert [enc.tgt(i).tolist() for i in range(len(enc))] == ref_tgt
    keep = np.arange(100) % 3 == 0
    sub = enc.subset(keep)
    assert len(sub) == 34 and [sub.tgt(i).tolist() for i in range(34)] == ref_tgt[::3]
    assert sub.src_lens.tolist() == [len(x) for x in ref_src[::3]]


def dirty_corpus(tmp_path):
    """300 clean pairs plus 2 with an empty side, 2 over-long, 1 with a bad length ratio."""
    src, tgt = corpus(300)
    long_es, long_en = " ".join(["casa perro"] * 40), " ".join(["house dog"] * 40)
    src += ["", "gato", long_es, "sol", "perro perro perro perro perro perro perro perro perro perro"]
    tgt += ["cat", "", "sun", long_en, "dog"]
    return corpus_cfg(write(tmp_path / "t.es", src), write(tmp_path / "t.en", tgt)), src, tgt


def test_load_data_filters_and_logs(tmp_path):
    train, src, tgt = dirty_corpus(tmp_path)
    cfg = make_cfg(tmp_path, train, max_len=30, max_ratio=3.0)
    logs = []
    tok, data = D.prepare_data(cfg, str(tmp_path / "run"), log=logs.append)
    ref = {"empty": [], "too_long": [], "ratio": [], "kept": []}  # reference from the raw lines
    for i, (a, b) in enumerate(zip(map(len, tok.encode_src(src)), map(len, tok.encode_tgt(tgt)))):
        rule = ("empty" if a == 0 or b == 0 else "too_long" if max(a, b) > 30
                else "ratio" if max(a, b) > 3 * min(a, b) else "kept")
        ref[rule].append(i)
    assert ref["empty"] == [300, 301] and ref["too_long"] == [302, 303] and 304 in ref["ratio"]
    st = data.train.stats
    assert (st["pairs"], st["empty"], st["too_long"], st["ratio"], st["kept"]) == \
        (305, 2, 2, len(ref["ratio"]), len(ref["kept"]))
    assert any(f"dropped 2 with an empty side, 2 longer than 30 tokens, {st['ratio']} with length ratio > 3" in m
               for m in logs)
    train_tgt = tok.decode_tgt([data.train.tgt(i).tolist() for i in range(len(data.train))])
    assert train_tgt == [tgt[i] for i in ref["kept"]]
    valid, (vsrc, vref) = data.valid, data.valid_lines
    assert (vsrc, vref) == (src, tgt)  # every raw pair kept for BLEU
    assert len(valid) == 303 and valid.stats["too_long"] == 2  # loss: only over-long pairs dropped


def test_cache_hit_and_invalidation(tmp_path, monkeypatch):
    train, src, tgt = dirty_corpus(tmp_path)
    cfg = make_cfg(tmp_path, train)
    run = str(tmp_path / "run")
    tok = build_tokenizer(cfg, run, log=quiet)
    first = D.load_data(cfg, tok, run, log=quiet)

    def no_encode(*a, **k):
        raise AssertionError("must load from the cache")
    monkeypatch.setattr(D, "encode_corpus", no_encode)
    logs = []
    second = D.load_data(cfg, tok, run, log=logs.append, read_train=lambda: no_encode())
    assert any(m.startswith("data train: loaded encoded corpus from") for m in logs)
    for a, b in ((first.train, second.train), (first.valid, second.valid)):
        assert np.array_equal(a.src_tokens, b.src_tokens) and np.array_equal(a.tgt_offsets, b.tgt_offsets)
        assert a.stats == b.stats
    with pytest.raises(AssertionError, match="must load from the cache"):  # other filter settings: new key
        D.load_data(make_cfg(tmp_path, train, max_len=20), tok, run, log=quiet)
    write(tmp_path / "t.es", src[::-1])  # changed file (size/mtime): new key
    with pytest.raises(AssertionError, match="must load from the cache"):
        D.load_data(cfg, tok, run, log=quiet)


def test_empty_corpus_errors(tmp_path):
    (tmp_path / "e.es").write_text("")
    (tmp_path / "e.en").write_text("")
    good, _, _ = dirty_corpus(tmp_path)
    tok = build_tokenizer(make_cfg(tmp_path, good), str(tmp_path / "run"), log=quiet)
    with pytest.raises(UserError, match=r"the train corpus is empty: .*e\.es"):
        D.load_data(make_cfg(tmp_path, corpus_cfg(tmp_path / "e.es", tmp_path / "e.en"), good),
                    tok, str(tmp_path / "run"), log=quiet)
    bad = corpus_cfg(write(tmp_path / "b.es", ["casa", "", "perro perro perro perro"]),
                     write(tmp_path / "b.en", ["", "dog", "dog"]))
    with pytest.raises(UserError, match=r"empty after filtering: .*\(3 pairs read: 2 with an empty side, "
                                        r"0 longer than data.max_len=256, 1 with length ratio > data.max_ratio=3"):
        D.load_data(make_cfg(tmp_path, bad, good), tok, str(tmp_path / "run"), log=quiet)


# --------------------------------------------------------------------------- batching

def lognormal_lengths(n=20000, seed=0):
    r = np.random.default_rng(seed)
    s = np.clip(np.round(r.lognormal(3.0, 0.6, n)), 1, 250).astype(np.int64)
    t = np.clip(np.round(s * r.lognormal(0.0, 0.15, n)), 1, 250).astype(np.int64)
    return s, t


@pytest.mark.parametrize("pool_size,cap", [(0, 0), (1000, 0), (0, 50)])
def test_batches_budget_and_coverage(pool_size, cap):
    s, t = lognormal_lengths(5000)
    s[17] = 5000  # longer than the whole budget: its own batch
    batches = D.batch_indices(s, t, 2048, seed=1, epoch=0, max_batch_size=cap, pool_size=pool_size)
    flat = np.concatenate(batches)
    assert np.array_equal(np.sort(flat), np.arange(5000))  # every pair exactly once
    for b in batches:
        cost = len(b) * max(s[b].max() + 1, t[b].max() + 1)
        assert cost <= 2048 or len(b) == 1
        assert cap == 0 or len(b) <= cap
    assert [b.tolist() for b in batches if 17 in b] == [[17]]


def test_batches_deterministic_per_seed_and_epoch():
    s, t = lognormal_lengths(3000)
    run = lambda seed, epoch: [b.tolist() for b in D.batch_indices(s, t, 1024, seed=seed, epoch=epoch)]
    assert run(1, 0) == run(1, 0)
    assert run(1, 0) != run(1, 1) and run(1, 0) != run(2, 0)
    assert sorted(map(tuple, run(1, 0))) != sorted(map(tuple, run(1, 1)))  # different groupings, not only order


def test_padding_efficiency():
    s, t = lognormal_lengths(20000)
    batches = D.batch_indices(s, t, 4096, seed=1, epoch=0)
    eff = D.padding_efficiency(s, t, batches)
    enc = from_lists([[5] * n for n in s], [[6] * n for n in t])  # independent count from collated tensors
    real = padded = 0
    for b in batches:
        batch = D.collate(enc, b)
        real += int(batch.src_mask.sum() + (batch.tgt_out != PAD_ID).sum())
        padded += batch.src.numel() + batch.tgt_out.numel()
    assert eff == pytest.approx(real / padded)
    assert eff >= 0.90
    assert D.padding_efficiency(s, t, D.batch_indices(s, t, 4096, 1, 0, pool_size=2000)) >= 0.85


def test_shard_batches():
    batches = [np.array([i]) for i in range(10)]
    shards = [D.shard_batches(batches, r, 3) for r in range(3)]
    assert [[int(b[0]) for b in sh] for sh in shards] == [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]]
    assert D.shard_batches(batches, 0, 1) == batches


def test_epoch_batches_resume_offset(tmp_path):
    s, t = lognormal_lengths(2000)
    enc = from_lists([[5] * n for n in s], [[6] * n for n in t])
    cfg = make_cfg(tmp_path, {"src": "x", "tgt": "y"}, batch_tokens=1024)
    full = D.epoch_batches(enc, cfg, epoch=3)
    assert [b.tolist() for b in D.epoch_batches(enc, cfg, epoch=3, offset=5)] == [b.tolist() for b in full[5:]]
    r1 = D.epoch_batches(enc, cfg, epoch=3, rank=1, world_size=2, offset=2)
    assert [b.tolist() for b in r1] == [b.tolist() for b in D.shard_batches(full, 1, 2)[2:]]
    assert [b.tolist() for b in r1[:3]] == [b.tolist() for b in full[5:11:2]]


def test_collate_by_hand():
    enc = from_lists([[5, 6, 7], [10]], [[8, 9], [11, 12, 13]])
    b = D.collate(enc, np.array([0, 1]))
    assert b.src.tolist() == [[5, 6, 7, EOS_ID], [10, EOS_ID, PAD_ID, PAD_ID]]
    assert b.src_mask.tolist() == [[True, True, True, True], [True, True, False, False]]
    assert b.tgt_in.tolist() == [[BOS_ID, 8, 9, PAD_ID], [BOS_ID, 11, 12, 13]]
    assert b.tgt_out.tolist() == [[8, 9, EOS_ID, PAD_ID], [11, 12, 13, EOS_ID]]
    assert b.src_lengths.tolist() == [4, 2] and b.tgt_lengths.tolist() == [3, 4]
    assert (b.n_src_tokens, b.n_tgt_tokens, b.indices.tolist(), len(b)) == (6, 7, [0, 1], 2)
    assert b.src.dtype == b.tgt_in.dtype == b.tgt_out.dtype == torch.int64 and b.src_mask.dtype == torch.bool
    moved = b.to("cpu", non_blocking=True)
    assert torch.equal(moved.tgt_out, b.tgt_out) and moved.n_tgt_tokens == 7
    rev = D.collate(enc, np.array([1, 0]), pin_memory=True)
    assert rev.src.tolist() == [[10, EOS_ID, PAD_ID, PAD_ID], [5, 6, 7, EOS_ID]]
    empty_tgt = D.collate(from_lists([[4]], [[]]), np.array([0]))
    assert empty_tgt.tgt_in.tolist() == [[BOS_ID]] and empty_tgt.tgt_out.tolist() == [[EOS_ID]]
