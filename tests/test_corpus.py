"""nmt.corpus: streamed encoding equals the in-memory reference; the cache (read or mapped); atomic cache writes."""

import glob
import os

import numpy as np
import pytest

from nmt import corpus as C
from nmt import data as D
from nmt import sources
from nmt.errors import UserError
from nmt.layout import collate
from nmt.tokenizer import build_tokenizer

from helpers import corpus, corpus_cfg, dirty_corpus, make_cfg, quiet, write


def reference_encode(tok, src, tgt, max_len, max_ratio, tag=None):
    """The in-memory path before issue 17 (encode every line, then filter pair by pair), as plain lists."""
    if tag:
        src = [f"{tag} {x}" if x else x for x in src]
    s_ids, t_ids = tok.encode_src(src), tok.encode_tgt(tgt)
    kept, counts = [], {"pairs": len(src), "empty": 0, "too_long": 0, "ratio": 0, "kept": 0}
    for i, (a, b) in enumerate(zip(map(len, s_ids), map(len, t_ids))):
        rule = ("empty" if max_ratio is not None and (a == 0 or b == 0) else "too_long" if max(a, b) > max_len
                else "ratio" if max_ratio is not None and max(a, b) > max_ratio * min(a, b) else "kept")
        counts[rule] += 1
        if rule == "kept":
            kept.append(i)
    return [s_ids[i] for i in kept], [t_ids[i] for i in kept], counts


def as_lists(enc):
    return [enc.src(i).tolist() for i in range(len(enc))], [enc.tgt(i).tolist() for i in range(len(enc))]


def cache_files(run):
    return sorted(os.path.basename(p) for p in glob.glob(os.path.join(run, "cache", "*")))


def test_token_dtype():
    assert C.token_dtype(32768) == np.int16 and C.token_dtype(32769) == np.int32


@pytest.mark.parametrize("chunk", [7, 100_000])
def test_streamed_encoding_equals_in_memory(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(sources, "CHUNK", chunk)
    train, src, tgt = dirty_corpus(tmp_path)
    cfg = make_cfg(tmp_path, train, max_len=30, max_ratio=2.5)
    run = str(tmp_path / "run")
    tok = build_tokenizer(cfg, run, log=quiet)
    seen = []
    encode = tok.encode_src
    monkeypatch.setattr(tok, "encode_src", lambda lines: seen.append(len(lines)) or encode(lines))
    data = D.load_data(cfg, tok, run, log=quiet)
    assert max(seen) <= chunk and sum(seen) == 2 * len(src)  # train + valid, never more than a chunk at once
    ref_src, ref_tgt, counts = reference_encode(tok, src, tgt, 30, 2.5)
    assert as_lists(data.train) == (ref_src, ref_tgt)
    enc = data.train
    assert enc.src_tokens.dtype == np.int16 and enc.src_offsets.dtype == np.int64
    assert enc.src_lens.tolist() == [len(x) for x in ref_src] and enc.tgt_lens.tolist() == [len(x) for x in ref_tgt]
    assert {k: enc.stats[k] for k in counts} == counts
    assert enc.stats["src_tokens"] == sum(map(len, ref_src)) and enc.parts == (len(ref_src),)
    for arr in (enc.src_tokens, enc.src_offsets, enc.src_lens, enc.tgt_tokens, enc.tgt_offsets, enc.tgt_lens):
        assert not arr.flags.writeable  # read from the cache files (small: into memory, test_reliability3.py)
    v_src, v_tgt, v_counts = reference_encode(tok, src, tgt, 30, None)  # valid: only the max_len rule
    assert as_lists(data.valid) == (v_src, v_tgt) and data.valid.stats["too_long"] == v_counts["too_long"]


def test_tag_prepended_to_non_empty_sources(tmp_path):
    train, src, tgt = dirty_corpus(tmp_path)
    cfg = make_cfg(tmp_path, {**train, "src_tag": "<BT>"}, valid=train, max_len=30)
    run = str(tmp_path / "run")
    tok = build_tokenizer(cfg, run, log=quiet)
    enc = D.load_data(cfg, tok, run, log=quiet).train
    ref_src, ref_tgt, counts = reference_encode(tok, src, tgt, 30, 3.0, tag="<BT>")
    assert as_lists(enc) == (ref_src, ref_tgt) and enc.stats["empty"] == counts["empty"] == 2
    tag_id = tok.encode_src(["<BT>"])[0]
    assert len(tag_id) == 1 and all(enc.src(i)[0] == tag_id[0] for i in range(len(enc)))


def test_cache_hit_maps_the_same_arrays_and_invalidation(tmp_path, monkeypatch):
    train, src, tgt = dirty_corpus(tmp_path)
    cfg = make_cfg(tmp_path, train)
    tagged = make_cfg(tmp_path, {**train, "src_tag": "<x>"}, valid=train)
    run = str(tmp_path / "run")
    tok = build_tokenizer(tagged, run, log=quiet)  # <x> is a symbol of the model
    first = D.load_data(cfg, tok, run, log=quiet)

    def no_encode(*a, **k):
        raise AssertionError("must load from the cache")
    monkeypatch.setattr(C, "encode_split", no_encode)
    monkeypatch.setattr(sources, "iter_text_pairs", no_encode)  # not even read
    monkeypatch.setattr(sources, "read_corpus", lambda *a: (src, tgt))  # valid lines (BLEU) are read always
    monkeypatch.setattr(D, "read_corpus", lambda *a: (src, tgt))
    logs = []
    second = D.load_data(cfg, tok, run, log=logs.append)
    assert any(m.startswith("data train: loaded encoded corpus from") for m in logs)
    for a, b in ((first.train, second.train), (first.valid, second.valid)):
        assert as_lists(a) == as_lists(b) and a.stats == b.stats
    for change in ({"max_len": 20}, {"max_ratio": 2.0}):  # other filter settings: new key
        with pytest.raises(AssertionError, match="must load from the cache"):
            D.load_data(make_cfg(tmp_path, train, **change), tok, run, log=quiet)
    with pytest.raises(AssertionError, match="must load from the cache"):  # a tag: new key
        D.load_data(tagged, tok, run, log=quiet)
    write(tmp_path / "t.es", src[::-1])  # changed file (size/mtime): new key
    with pytest.raises(AssertionError, match="must load from the cache"):
        D.load_data(cfg, tok, run, log=quiet)


def test_failed_encoding_leaves_no_entry_and_stale_files_go(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "CHUNK", 5)
    src, tgt = corpus(40)
    good = corpus_cfg(write(tmp_path / "g.es", src), write(tmp_path / "g.en", tgt))
    bad = corpus_cfg(write(tmp_path / "b.es", src), write(tmp_path / "b.en", tgt[:-3], gz=True))
    run = str(tmp_path / "run")
    tok = build_tokenizer(make_cfg(tmp_path, good), run, log=quiet)
    D.load_data(make_cfg(tmp_path, good), tok, run, log=quiet)
    old = cache_files(run)
    assert len([f for f in old if f.startswith("train-")]) == 7  # 6 arrays + the json marker
    with pytest.raises(UserError) as e:  # found after 7 chunks were written
        D.load_data(make_cfg(tmp_path, bad, good), tok, run, log=quiet)
    assert "b.es has 40" in str(e.value) and "b.en has 37" in str(e.value) and "\n" not in str(e.value)
    assert [f for f in cache_files(run) if f.startswith("train-")] == []  # the stale entry went, no partial one
    # a crash mid-write leaves temporary files: the next miss removes them
    for name in ("train-0123.src_tokens.bin.tmp", "train-0123.json.tmp", "train-4567.src_lens.bin"):
        (tmp_path / "run" / "cache" / name).write_bytes(b"x")
    D.load_data(make_cfg(tmp_path, good), tok, run, log=quiet)
    assert cache_files(run) == old


def test_truncated_cache_file_is_encoded_again(tmp_path):
    train, src, tgt = dirty_corpus(tmp_path)
    cfg = make_cfg(tmp_path, train)
    run = str(tmp_path / "run")
    tok = build_tokenizer(cfg, run, log=quiet)
    first = as_lists(D.load_data(cfg, tok, run, log=quiet).train)
    (path,) = glob.glob(os.path.join(run, "cache", "train-*.tgt_tokens.bin"))
    with open(path, "r+b") as f:
        f.truncate(10)
    logs = []
    assert as_lists(D.load_data(cfg, tok, run, log=logs.append).train) == first
    assert any("unreadable cache" in m for m in logs)


def test_empty_side_arrays_map(tmp_path):
    """A split whose kept pairs have no target tokens at all (valid: empty sides are kept) still maps."""
    src, tgt = corpus(10)
    good = corpus_cfg(write(tmp_path / "g.es", src), write(tmp_path / "g.en", tgt))
    empty_tgt = corpus_cfg(write(tmp_path / "v.es", src[:3]), write(tmp_path / "v.en", ["", "", ""]))
    run = str(tmp_path / "run")
    tok = build_tokenizer(make_cfg(tmp_path, good), run, log=quiet)
    valid = D.load_data(make_cfg(tmp_path, good, empty_tgt), tok, run, log=quiet).valid
    assert len(valid) == 3 and valid.tgt_lens.tolist() == [0, 0, 0] and valid.tgt_tokens.size == 0
    batch = collate(valid, np.arange(3))
    assert batch.tgt_out[:, 0].tolist() == [3, 3, 3]  # EOS only
