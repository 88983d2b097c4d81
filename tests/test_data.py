"""Reading sources (streamed in chunks), filtering, loading, several corpora and their epoch mix,
batching, collate, sharding, and every data error. Encoding and the cache: test_corpus.py."""

import gzip
import hashlib
import json
import os

import numpy as np
import pytest
import torch

from nmt.data import batches as D
from nmt.text import sources
from nmt.config import CorpusConfig, config_from_dict
from nmt.errors import UserError
from nmt.text.sources import read_corpus
from nmt.data.corpus import filter_pairs
from nmt.layout import collate, pack
from nmt.text.tokenizer import BOS_ID, EOS_ID, PAD_ID, build_tokenizer

from helpers import corpus, corpus_cfg, dirty_corpus, from_lists, make_cfg, prepare_data, quiet, write

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
def test_iter_pairs_streams_chunks(tmp_path, gz):
    src, tgt = corpus(50)
    c = make_cfg(tmp_path, corpus_cfg(write(tmp_path / "a.es", src, gz), write(tmp_path / "a.en", tgt, gz))).data.train
    chunks = list(sources.iter_pairs(c, "es", "en", chunk=7))
    assert [(len(a), len(b)) for a, b in chunks] == [(7, 7)] * 7 + [(1, 1)]
    assert sum((a for a, _ in chunks), []) == src and sum((b for _, b in chunks), []) == tgt
    capped = CorpusConfig(**{**c.__dict__, "max_sentences": 10})
    assert [len(a) for a, _ in sources.iter_pairs(capped, "es", "en", chunk=7)] == [7, 3]
    assert list(sources.iter_side(c, "tgt", "es", "en")) == tgt
    assert list(sources.iter_side(capped, "src", "es", "en")) == src[:10]


@pytest.mark.parametrize("short", ["src", "tgt"])
def test_line_count_mismatch_found_while_streaming(tmp_path, short):
    src, tgt = corpus(50)
    src, tgt = (src[:-1], tgt) if short == "src" else (src, tgt[:-1])
    c = make_cfg(tmp_path, corpus_cfg(write(tmp_path / "a.es", src), write(tmp_path / "a.en", tgt))).data.train
    it = sources.iter_pairs(c, "es", "en", chunk=7)
    assert len(next(it)[0]) == 7  # chunks come before the end is known
    with pytest.raises(UserError) as e:
        list(it)
    assert f"a.es has {len(src)}, " in str(e.value) and str(e.value).endswith(f"a.en has {len(tgt)}")


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
    datasets = pytest.importorskip("datasets", reason="the Hugging Face datasets package (a dependency) is not installed")
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


def test_hf_reads_arrow_batches(tmp_path, hf_cache):
    src, tgt = corpus(20)
    hf_cache.Dataset.from_dict({"translation": [{"es": s, "en": t} for s, t in zip(src, tgt)]}
                               ).save_to_disk(str(tmp_path / "one"))
    c = hf_cfg(tmp_path, hf_path=str(tmp_path / "one"))
    chunks = list(sources.iter_pairs(c, "es", "en", chunk=6))
    assert [len(a) for a, _ in chunks] == [6, 6, 6, 2]
    assert sum((a for a, _ in chunks), []) == src and sum((b for _, b in chunks), []) == tgt
    capped = hf_cfg(tmp_path, hf_path=str(tmp_path / "one"), max_sentences=8)
    assert [len(a) for a, _ in sources.iter_pairs(capped, "es", "en", chunk=6)] == [6, 2]
    assert list(sources.iter_side(capped, "tgt", "es", "en")) == tgt[:8]


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
    same = np.array([1, 0, 1, 1, 0, 0, 0, 1, 1, 0], bool)  # pairs whose target is the source
    for mask in (None, same):
        keep, counts = filter_pairs(s, t, max_len=10, max_ratio=3.0, identical=mask)
        expect = {"pairs": 10, "empty": 0, "too_long": 0, "ratio": 0, "identical": 0, "kept": 0}
        ref_keep = []
        for a, b, m in zip(s, t, same if mask is not None else [False] * 10):  # reference, rule by rule
            rule = ("empty" if a == 0 or b == 0 else "too_long" if max(a, b) > 10
                    else "ratio" if max(a, b) / min(a, b) > 3.0 else "identical" if m else "kept")
            expect[rule] += 1
            ref_keep.append(rule == "kept")
        assert counts == expect
        assert keep.tolist() == ref_keep
    assert counts == {"pairs": 10, "empty": 3, "too_long": 2, "ratio": 1, "identical": 2, "kept": 2}
    keep, counts = filter_pairs(s, t, max_len=10, max_ratio=None, identical=same)  # valid: only over-long pairs go
    assert counts["too_long"] == 2 and counts["kept"] == 8 and counts["empty"] == 0 and counts["identical"] == 0


def test_load_data_filters_and_logs(tmp_path):
    train, src, tgt = dirty_corpus(tmp_path)
    cfg = make_cfg(tmp_path, train, max_len=30, max_ratio=3.0)
    logs = []
    tok, data = prepare_data(cfg, str(tmp_path / "run"), log=logs.append)
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


def test_drop_identical_drops_the_pairs_whose_target_is_the_source(tmp_path):
    src, tgt = corpus(300)
    copies = {5: "perro  gato", 17: "sol", 40: "casa perro"}  # whitespace runs aside, the target is the source
    for i, line in copies.items():
        src[i], tgt[i] = line, " ".join(line.split())
    src[60], tgt[60] = "perro gato", "perro gato sol"  # not identical: kept
    train = corpus_cfg(write(tmp_path / "t.es", src), write(tmp_path / "t.en", tgt))
    kept = {}
    for drop in (False, True):
        logs = []
        cfg = make_cfg(tmp_path, train, max_len=30, max_ratio=3.0, drop_identical=drop)
        tok, data = prepare_data(cfg, str(tmp_path / "run"), log=logs.append)
        kept[drop] = tok.decode_tgt([data.train.tgt(i).tolist() for i in range(len(data.train))])
        assert data.train.stats["identical"] == (3 if drop else 0)
        assert any("3 with the target equal to the source" in m for m in logs) == drop
        assert len(data.valid) == 300  # validation keeps them
    assert len(kept[True]) == len(kept[False]) - 3
    copied = {tgt[i] for i in copies}  # Spanish words: no other target has them
    assert copied <= set(kept[False]) and kept[True] == [t for t in kept[False] if t not in copied]
    cfg = make_cfg(tmp_path, corpus_cfg(write(tmp_path / "c.es", src[:3]), write(tmp_path / "c.en", src[:3])),
                   drop_identical=True)
    with pytest.raises(UserError, match="3 with the target equal to the source"):
        prepare_data(cfg, str(tmp_path / "run2"), log=quiet)


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
    eff = padding_efficiency(s, t, batches)
    enc = from_lists([[5] * n for n in s], [[6] * n for n in t])  # independent count from collated tensors
    real = padded = 0
    for b in batches:
        batch = collate(enc, b)
        real += int(batch.src_mask.sum() + (batch.tgt_out != PAD_ID).sum())
        padded += batch.src.numel() + batch.tgt_out.numel()
    assert eff == pytest.approx(real / padded)
    assert eff >= 0.90
    assert padding_efficiency(s, t, D.batch_indices(s, t, 4096, 1, 0, pool_size=2000)) >= 0.85


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
    b = collate(enc, np.array([0, 1]))
    assert b.src.tolist() == [[5, 6, 7, EOS_ID], [10, EOS_ID, PAD_ID, PAD_ID]]
    assert b.src_mask.tolist() == [[True, True, True, True], [True, True, False, False]]
    assert b.tgt_in.tolist() == [[BOS_ID, 8, 9, PAD_ID], [BOS_ID, 11, 12, 13]]
    assert b.tgt_out.tolist() == [[8, 9, EOS_ID, PAD_ID], [11, 12, 13, EOS_ID]]
    assert (b.n_src_tokens, b.n_tgt_tokens, len(b)) == (6, 7, 2)
    assert b.src.dtype == b.tgt_in.dtype == b.tgt_out.dtype == torch.int64 and b.src_mask.dtype == torch.bool
    moved = b.to("cpu")
    assert torch.equal(moved.tgt_out, b.tgt_out) and moved.n_tgt_tokens == 7
    rev = collate(enc, np.array([1, 0]), pin_memory=True)
    assert rev.src.tolist() == [[10, EOS_ID, PAD_ID, PAD_ID], [5, 6, 7, EOS_ID]]
    empty_tgt = collate(from_lists([[4]], [[]]), np.array([0]))
    assert empty_tgt.tgt_in.tolist() == [[BOS_ID]] and empty_tgt.tgt_out.tolist() == [[EOS_ID]]


# --------------------------------------------------------------------------- several corpora, epoch mix

def old_epoch_batches(corpus, cfg, epoch, *, rank=0, world_size=1, offset=0):
    """`epoch_batches` before issue 17 (one corpus, no mix), kept as the reference."""
    d = cfg.data
    batches = D.batch_indices(corpus.src_lens, corpus.tgt_lens, d.batch_tokens, cfg.seed, epoch,
                              max_batch_size=d.max_batch_size, pool_size=d.pool_size)
    return D.shard_batches(batches, rank, world_size)[offset:]


def digest(batches):
    flat = np.concatenate([np.concatenate(batches), [len(b) for b in batches]]).astype(np.int64)
    return hashlib.sha256(flat.tobytes()).hexdigest()[:16]


@pytest.mark.parametrize("train", [{"src": "x", "tgt": "y"}, [{"src": "x", "tgt": "y"}],
                                   [{"src": "x", "tgt": "y", "weight": 2.5}]])
def test_one_corpus_gives_todays_batches(tmp_path, train):
    s, t = lognormal_lengths(2000)
    enc = from_lists([[5] * n for n in s], [[6] * n for n in t])
    raw = {"data": {"src_lang": "es", "tgt_lang": "en", "train": train, "valid": {"src": "x", "tgt": "y"},
                    "batch_tokens": 1024, "pool_size": 500}, "seed": 7}
    cfg = config_from_dict(raw, check_files=False)
    # digests of the batches computed with the code before issue 17 (commit 1e9da51)
    for epoch, expected in ((1, "bcd183ddb0385173"), (2, "da769e0ddff7d617")):
        assert digest(D.epoch_batches(enc, cfg, epoch)) == expected
        for rank, offset in ((0, 0), (1, 3)):
            new = D.epoch_batches(enc, cfg, epoch, rank=rank, world_size=2, offset=offset)
            old = old_epoch_batches(enc, cfg, epoch, rank=rank, world_size=2, offset=offset)
            assert [b.tolist() for b in new] == [b.tolist() for b in old]


def test_epoch_mix_counts_and_draws():
    parts, weights = [10, 1000, 37, 5], [1.0, 0.5, 3.0, 0.0]
    counts = D.mix_counts(parts, weights)
    assert counts == [round(w / 4.5 * 1052) for w in weights] == [234, 117, 701, 0]
    chosen = D.epoch_pairs(parts, weights, seed=1, epoch=2)
    assert chosen.dtype == np.int64 and len(chosen) == sum(counts)
    starts = np.cumsum([0] + parts)
    for i, (size, n) in enumerate(zip(parts, counts)):
        mine = chosen[(chosen >= starts[i]) & (chosen < starts[i] + size)] - starts[i]
        seen = np.bincount(mine, minlength=size)
        whole, rest = divmod(n, size)
        # whole passes, then `rest` different pairs once more (a subset without replacement)
        assert set(seen.tolist()) <= {whole, whole + 1} and int((seen == whole + 1).sum()) == rest
    again = D.epoch_pairs(parts, weights, seed=1, epoch=2)
    assert np.array_equal(chosen, again)  # a pure function of (seed, epoch)
    assert not np.array_equal(chosen, D.epoch_pairs(parts, weights, seed=1, epoch=3))
    assert not np.array_equal(chosen, D.epoch_pairs(parts, weights, seed=2, epoch=2))
    # each corpus draws from its own generator (seed, epoch, index): corpus 1's subset does not
    # depend on the other corpora's draws
    other = D.epoch_pairs([10, 1000, 37, 5], [1.0, 0.5, 3.0, 0.0], seed=1, epoch=2)
    sub = lambda ch: ch[(ch >= 10) & (ch < 1010)]
    assert np.array_equal(sub(chosen), sub(other))
    assert D.epoch_pairs([10, 20], [1, 2], seed=1, epoch=1) is None  # shares equal sizes: every pair once
    assert D.epoch_pairs([30], [0.3], seed=1, epoch=1) is None


def test_mixed_epoch_batches_cover_the_mix_and_resume(tmp_path):
    s, t = lognormal_lengths(900)
    enc = from_lists([[5] * n for n in s], [[6] * n for n in t], parts=[600, 300])
    train = [{"src": "x", "tgt": "y"}, {"src": "x2", "tgt": "y2", "weight": 3.0, "src_tag": "<BT>"}]
    cfg = make_cfg(tmp_path, train, valid={"src": "x", "tgt": "y"}, batch_tokens=1024)
    full = D.epoch_batches(enc, cfg, epoch=3)
    flat = np.concatenate(full)
    assert np.array_equal(np.sort(flat), np.sort(D.epoch_pairs([600, 300], [1.0, 3.0], cfg.seed, 3)))
    assert len(flat) == 900 and (flat < 600).sum() == 225 and (flat >= 600).sum() == 675
    for b in full:  # the budget holds on the real pairs
        assert len(b) * max(s[b].max() + 1, t[b].max() + 1) <= 1024 or len(b) == 1
    assert [b.tolist() for b in D.epoch_batches(enc, cfg, epoch=3, offset=5)] == [b.tolist() for b in full[5:]]
    r1 = D.epoch_batches(enc, cfg, epoch=3, rank=1, world_size=2, offset=2)
    assert [b.tolist() for b in r1] == [b.tolist() for b in D.shard_batches(full, 1, 2)[2:]]
    with pytest.raises(ValueError, match="parts"):
        D.epoch_batches(from_lists([[5]], [[6]]), cfg, epoch=1)


def test_several_corpora_tags_stats_and_logs(tmp_path):
    src, tgt = corpus(200)
    bt_src, bt_tgt = corpus(120, seed=5)
    real = corpus_cfg(write(tmp_path / "real.es", src), write(tmp_path / "real.en", tgt))
    bt = {**corpus_cfg(write(tmp_path / "bt.es", bt_src + [""]), write(tmp_path / "bt.en", bt_tgt + ["x"])),
          "weight": 0.5, "src_tag": "<BT>"}
    cfg = make_cfg(tmp_path, [real, bt], valid=real, max_ratio=100.0)
    logs = []
    tok, data = prepare_data(cfg, str(tmp_path / "run"), log=logs.append)
    train = data.train
    assert train.parts == (200, 120) and len(train) == 320
    assert [c["name"] for c in train.stats["corpora"]] == ["real.es", "bt.es"]
    assert train.stats["corpora"][1]["pairs"] == 121 and train.stats["corpora"][1]["empty"] == 1
    assert train.stats["pairs"] == 321 and train.stats["kept"] == 320
    (tag_id,) = tok.encode_src(["<BT>"])[0]
    assert [train.src(i).tolist() for i in range(200)] == tok.encode_src(src)  # untagged
    assert [train.src(200 + i).tolist() for i in range(120)] == [[tag_id] + x for x in tok.encode_src(bt_src)]
    assert any(m.startswith("data train[0] real.es: 200 pairs read;") for m in logs)
    assert any(m.startswith("data train[1] bt.es, tag <BT>: 121 pairs read; dropped 1 with an empty side") for m in logs)
    mix = [m for m in logs if "epoch mix" in m]
    assert mix == ["data train: epoch mix of 2 corpora (320 pairs an epoch): "
                   "real.es 200 pairs x1.06 (66.6%), bt.es 120 pairs x0.89 (33.4%)"]  # 213 and 107 pairs


def test_one_corpus_as_a_list_trains_the_same(tmp_path):
    """`data.train: X` and `data.train: [X]` give the same run: same batches, same weights."""
    import torch

    from nmt.model import checkpoint as ckpt
    from nmt.train import train
    from helpers import tiny_config_dict

    results = []
    for name, wrap in (("mapping", False), ("list", True)):
        raw = tiny_config_dict(tmp_path, max_steps=4, warmup_steps=2, valid_every=4, valid_bleu=False, metric="loss")
        raw["name"] = name
        if wrap:
            raw["data"]["train"] = [raw["data"]["train"]]
        result = train(config_from_dict(raw), quiet=True)
        saved = ckpt.load_checkpoint(os.path.join(result["run_dir"], "checkpoints", "latest.pt"))
        results.append((result["valid"]["loss"], saved["model"]))
    (loss_a, model_a), (loss_b, model_b) = results
    assert loss_a == loss_b
    assert all(torch.equal(model_a[k], model_b[k]) for k in model_a)


def padding_efficiency(src_lens: np.ndarray, tgt_lens: np.ndarray, batches: list[np.ndarray]) -> float:
    """Real positions / padded positions over both sides: sum(s+1 + t+1) / sum(B*(S+T))."""
    s, t = np.asarray(src_lens) + 1, np.asarray(tgt_lens) + 1
    real = sum(int(s[b].sum() + t[b].sum()) for b in batches)
    padded = sum(len(b) * int(s[b].max() + t[b].max()) for b in batches)
    return real / padded if padded else 1.0


# --------------------------------------------------------------------------- issue 56: shapes and masks

def _random_ids(s, t, seed=0):
    r = np.random.default_rng(seed)
    return from_lists([r.integers(4, 50, n).tolist() for n in s], [r.integers(4, 50, n).tolist() for n in t])


def test_length_buckets_give_one_shape_per_bucket_within_the_budget():
    """data.length_buckets: every batch padded to (rows, bucket) with rows * bucket <= budget, one shape per
    bucket over the epoch, every pair once; the padded batch holds the unpadded one, and its extra rows
    are EOS alone with no target position in the loss."""
    s, t = lognormal_lengths(3000)
    t[5] = 0  # an empty target
    buckets, budget = [16, 32, 64, 128, 256], 2048
    enc = _random_ids(s, t)
    batches = D.batch_indices(s, t, budget, seed=1, epoch=0, buckets=buckets)
    assert np.array_equal(np.sort(np.concatenate(batches)), np.arange(3000))
    shapes = set()
    for b in batches:
        rows, length = D.bucket_shape(s[b], t[b], buckets, budget)
        shapes.add((rows, length))
        assert rows * length <= budget and length == min(x for x in buckets if x > max(s[b].max(), t[b].max()))
        padded, plain = collate(enc, b, shape=(rows, length)), collate(enc, b)
        B, S, T = len(b), plain.src.shape[1], plain.tgt_out.shape[1]
        assert padded.src.shape == padded.tgt_in.shape == padded.tgt_out.shape == (rows, length)
        assert torch.equal(padded.src[:B, :S], plain.src) and torch.equal(padded.tgt_in[:B, :T], plain.tgt_in)
        assert torch.equal(padded.tgt_out[:B, :T], plain.tgt_out) and torch.equal(padded.src_mask[:B, :S], plain.src_mask)
        assert not padded.src_mask[:B, S:].any() and (padded.tgt_out[:, T:] == PAD_ID).all()
        assert (padded.src[B:, 0] == EOS_ID).all() and padded.src_mask[B:].sum(1).eq(1).all()
        assert (padded.tgt_out[B:] == PAD_ID).all() and (padded.tgt_in[B:, 0] == BOS_ID).all()
        assert (padded.n_src_tokens, padded.n_tgt_tokens) == (plain.n_src_tokens, plain.n_tgt_tokens)
    assert len(shapes) == len(buckets)
    assert len({(len(b), collate(enc, b).src.shape[1]) for b in batches}) > 3 * len(buckets)  # without: many
    long = D.bucket_shape(np.array([300]), np.array([10]), buckets, budget)  # beyond the last bucket: its own
    assert long == (6, 301)


def test_same_source_length_batches_have_no_source_padding_and_no_mask():
    s, t = lognormal_lengths(3000)
    enc = _random_ids(s, t)
    batches = D.batch_indices(s, t, 2048, seed=1, epoch=0, same_source_length=True)
    assert np.array_equal(np.sort(np.concatenate(batches)), np.arange(3000))
    for b in batches:
        assert len(set(s[b].tolist())) == 1 and len(b) * max(s[b].max() + 1, t[b].max() + 1) <= 2048
        unmasked, plain = collate(enc, b, masks=False), collate(enc, b)
        assert unmasked.src_mask is None and plain.src_mask.all()
        assert torch.equal(unmasked.src, plain.src) and torch.equal(unmasked.tgt_out, plain.tgt_out)
    mixed = np.array([int(np.argmin(s)), int(np.argmax(s))])  # two source lengths
    with pytest.raises(ValueError, match="one length"):
        collate(enc, mixed, masks=False)


@pytest.mark.parametrize("kind", ["plain", "buckets", "same_source"])
def test_batches_padded_on_the_device_equal_collate(kind):
    """data.collate: device: `pack(...).to(device)` (flat tokens, padded by scatters there) gives collate's
    Batch for the same pairs, shape and masks (here the device is the CPU)."""
    s, t = lognormal_lengths(2000)
    t[3] = 0
    enc = _random_ids(s, t, seed=2)
    buckets = [16, 32, 64, 128, 256] if kind == "buckets" else ()
    batches = D.batch_indices(s, t, 1024, seed=3, epoch=0, buckets=buckets, same_source_length=kind == "same_source")
    for b in batches:
        shape = D.bucket_shape(s[b], t[b], buckets, 1024) if buckets else None
        masks = kind != "same_source"
        host, device = collate(enc, b, shape=shape, masks=masks), pack(enc, b, shape=shape, masks=masks).to("cpu")
        for name in ("src", "tgt_in", "tgt_out"):
            assert torch.equal(getattr(host, name), getattr(device, name)), name
        assert (host.src_mask is None) == (device.src_mask is None) == (not masks)
        assert host.src_mask is None or torch.equal(host.src_mask, device.src_mask)
        assert (host.n_src_tokens, host.n_tgt_tokens) == (device.n_src_tokens, device.n_tgt_tokens)
