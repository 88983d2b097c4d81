"""nmt.data.corpus: streamed encoding equals the in-memory reference; the cache (read or mapped); atomic cache writes."""

import glob
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from nmt.data import corpus as C
from nmt.data import batches as D
from nmt.text import sources
from nmt.errors import UserError
from nmt.layout import collate
from nmt.text.tokenizer import build_tokenizer
from nmt.config import config_from_dict

from helpers import (ENV, ROOT, corpus, corpus_cfg, dirty_corpus, make_cfg, make_pairs, quiet, run_nmt,
                     tiny_config_dict, write, write_yaml)


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
    monkeypatch.setattr(tok, "encode_src", lambda lines, src_lang=None: seen.append(len(lines)) or encode(lines, src_lang))
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
        assert not arr.flags.writeable  # read from the cache files (small: into memory; see test_small_entries_are_read_large_ones_mapped_both_read_only)
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


# --------------------------------------------------------------------------- the encoded-corpus cache cannot be fooled (edits, corruption, truncation, a full disk)

def _prepared(tmp_path, n: int = 400) -> tuple["Config", "Tokenizer", str]:  # noqa: F821
    """A config of the tiny task on a copy of its training files, with its run directory's tokenizer."""
    from nmt.text.tokenizer import build_tokenizer

    raw = tiny_config_dict(str(tmp_path))
    raw["data"]["train"]["max_sentences"] = n
    cfg = config_from_dict(raw)
    return cfg, build_tokenizer(cfg, cfg.run_dir, log=lambda m: None), cfg.run_dir


def _load(cfg, tok, logs: list | None = None):
    from nmt.data.batches import load_data

    return load_data(cfg, tok, cfg.run_dir, log=(logs if logs is not None else []).append)


def _pairs(enc) -> list:
    return [(enc.src(i).tolist(), enc.tgt(i).tolist()) for i in range(len(enc))]


def _same_size_edit(path: str) -> None:
    """dog <-> cat in a file: the same size; a copy with the old mtime (what `cp -p` keeps) is prepared."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    edited = text.replace("dog", "@@@").replace("cat", "dog").replace("@@@", "cat")
    assert edited != text and len(edited) == len(text)
    with open(path + ".edited", "w", encoding="utf-8") as f:
        f.write(edited)
    st = os.stat(path)
    os.utime(path + ".edited", ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["cp -p", "tar x", "os.utime"])
def test_an_edit_of_the_same_size_and_mtime_is_not_served_from_the_cache(tmp_path, tool):
    """The cache trusted (path, size, mtime): `cp -p`, `rsync -a`, `tar x` of an edited file of the same
    size with its mtime kept reused the stale encoded corpus."""
    cfg, tok, run = _prepared(tmp_path)
    before = _pairs(_load(cfg, tok).train)
    path = cfg.data.train.tgt
    _same_size_edit(path)
    time.sleep(0.02)  # ctime granularity: a new tick
    if tool == "cp -p":
        subprocess.run(["cp", "-p", path + ".edited", path], check=True)
    elif tool == "tar x":
        os.makedirs(tmp_path / "t")
        os.replace(path + ".edited", tmp_path / "t" / os.path.basename(path))
        subprocess.run(["tar", "cf", str(tmp_path / "x.tar"), "-C", str(tmp_path / "t"), os.path.basename(path)],
                       check=True)
        subprocess.run(["tar", "xf", str(tmp_path / "x.tar"), "-C", os.path.dirname(path)], check=True)
    else:  # an editor, or a script, that restores the mtime
        with open(path + ".edited", encoding="utf-8") as f, open(path, "w", encoding="utf-8") as g:
            g.write(f.read())
        st = os.stat(path + ".edited")
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    logs: list[str] = []
    after = _pairs(_load(cfg, tok, logs).train)
    assert after != before
    fresh = _pairs(_load(cfg, tok, []).train)  # the entry now in the cache is the edited file's
    assert after == fresh
    assert any("a resumed run does not continue exactly" in m for m in logs), logs


def test_a_touched_file_is_encoded_again_without_a_false_warning(tmp_path):
    """A changed ctime with the same content (chmod, a copy, a checkout) costs one encoding; the
    arrays' digest then shows the data are the same, so nothing claims the resume is inexact."""
    cfg, tok, run = _prepared(tmp_path)
    before = _pairs(_load(cfg, tok).train)
    os.chmod(cfg.data.train.src, 0o640)
    logs: list[str] = []
    assert _pairs(_load(cfg, tok, logs).train) == before
    assert not any("loaded encoded corpus" in m for m in logs if m.startswith("data train"))  # encoded again
    assert not any("differ" in m for m in logs), logs


@pytest.mark.parametrize("damage", ["token id", "offset"])
def test_a_cache_corrupted_in_place_is_encoded_again(tmp_path, damage):
    """An id outside the vocabulary ended in an IndexError traceback deep in the embedding; corrupt
    offsets trained on garbage pairs without a word."""
    import numpy as np

    cfg, tok, run = _prepared(tmp_path)
    before = _pairs(_load(cfg, tok).train)
    name = "src_tokens" if damage == "token id" else "tgt_offsets"
    (path,) = glob.glob(os.path.join(run, "cache", f"train-*.{name}.bin"))
    value = np.array([32000], np.int16) if damage == "token id" else np.array([10**9], np.int64)
    with open(path, "r+b") as f:
        f.seek(value.itemsize * 7)
        f.write(value.tobytes())
    logs: list[str] = []
    assert _pairs(_load(cfg, tok, logs).train) == before
    (line,) = [m for m in logs if "unreadable cache" in m]
    assert ("outside the vocabulary" if damage == "token id" else "tgt_offsets") in line


def test_small_entries_are_read_large_ones_mapped_both_read_only(tmp_path, monkeypatch):
    import numpy as np

    from nmt.data import corpus as C

    cfg, tok, run = _prepared(tmp_path)
    _load(cfg, tok)
    (marker,) = glob.glob(os.path.join(run, "cache", "train-*.json"))
    prefix = marker[:-len(".json")]
    read, mapped = C.EncodedCorpus.load(prefix), C.EncodedCorpus.load(prefix, in_memory=False)
    assert _pairs(read) == _pairs(mapped)
    assert not isinstance(read.src_tokens.base, np.memmap) and isinstance(mapped.src_tokens.base, np.memmap)
    assert not read.src_tokens.flags.writeable and not mapped.src_tokens.flags.writeable
    monkeypatch.setattr(C, "in_memory_limit", lambda: 100)  # too large for memory: mapped
    assert isinstance(C.EncodedCorpus.load(prefix).tgt_tokens.base, np.memmap)


@pytest.mark.slow
def test_truncating_the_cache_during_a_run_does_not_kill_it(tmp_path):
    """Truncating a mapped cache file during a run ended it with SIGBUS (exit 135) and no checkpoint."""
    raw = tiny_config_dict(str(tmp_path), max_steps=400, valid_every=10_000, valid_bleu=False, metric="loss")
    path = write_yaml(tmp_path / "c.yaml", raw)
    log = os.path.join(raw["output_dir"], raw["name"], "train.log")
    proc = subprocess.Popen([sys.executable, "-m", "nmt", "train", "--config", path, "--quiet"], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            if os.path.exists(log) and "step 40 |" in open(log, encoding="utf-8").read():
                break
            time.sleep(0.05)
        for cache_file in glob.glob(os.path.join(raw["output_dir"], raw["name"], "cache", "*.bin")):
            os.truncate(cache_file, 0)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-2000:]
    assert "stopped at step 400" in err


@pytest.mark.slow
def test_a_full_disk_while_writing_the_cache_names_the_cause_and_the_file(tmp_path):
    """numpy said "5117176 requested and 448512 written" (no cause, no file)."""
    import resource

    raw = tiny_config_dict(str(tmp_path))
    pairs = make_pairs(60_000, 3)  # ~1 MB of token ids a side: past the limit below
    for side, col in (("src", 0), ("tgt", 1)):
        with open(raw["data"]["train"][side], "w", encoding="utf-8") as f:
            f.write("".join(p[col] + "\n" for p in pairs))
    path = write_yaml(tmp_path / "c.yaml", raw)
    limit = 300_000  # bytes per file: the tokenizer, config and log fit, the cache does not

    def cap():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = subprocess.run([sys.executable, "-m", "nmt", "train", "--config", path, "--quiet"], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=300, preexec_fn=cap)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert last.startswith("nmt train: error: File too large: ") and "/cache/train-" in last and \
        last.endswith(".bin"), last
    assert "requested" not in proc.stderr and "Traceback" not in proc.stderr
    assert glob.glob(os.path.join(raw["output_dir"], raw["name"], "cache", "*")) == []  # nothing half-written


@pytest.mark.slow
def test_resuming_after_the_corpus_changed_says_it_is_not_exact(tmp_path):
    """Resuming after the corpus changed re-encoded without a word that the resume is no longer exact."""
    raw = tiny_config_dict(str(tmp_path), max_steps=4, warmup_steps=2, valid_every=10_000, valid_bleu=False,
                           metric="loss")
    path = write_yaml(tmp_path / "c.yaml", raw)
    assert run_nmt("train", "--config", path, "--quiet").returncode == 0
    _same_size_edit(raw["data"]["train"]["tgt"])
    time.sleep(0.02)
    subprocess.run(["cp", "-p", raw["data"]["train"]["tgt"] + ".edited", raw["data"]["train"]["tgt"]], check=True)
    proc = run_nmt("train", "--config", path, "--quiet", "--resume", "--set", "train.max_steps=6")
    assert proc.returncode == 0, proc.stderr
    (line,) = [m for m in proc.stderr.splitlines() if "differ" in m]
    assert line.startswith("data train: the encoded train data differ") and "does not continue exactly" in line
