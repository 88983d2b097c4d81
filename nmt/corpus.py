"""Encoded corpora: streaming encode + filter into cache files, loaded as memory-mapped arrays.

A split (train or valid) is one or more corpora read chunk by chunk
(`nmt.sources.iter_pairs`, 100k pairs at a time), encoded with SentencePiece,
filtered (`filter_pairs`) and appended to six flat files; memory does not grow
with the corpus. The corpora of a split are stored one after another: the
first `parts[0]` pairs come from corpus 0, and so on.

Cache entry `run_dir/cache/<split>-<key>`:
    .src_tokens.bin   [total source tokens] int16 (vocab <= 32768) or int32
    .src_offsets.bin  [N+1] int64: pair i = src_tokens[off[i]:off[i+1]]
    .src_lens.bin     [N] int32
    .tgt_tokens.bin, .tgt_offsets.bin, .tgt_lens.bin   the same for the targets
    .json             version, dtypes and lengths of the arrays, statistics
The key hashes CACHE_VERSION, the split, each corpus' source fingerprint
(`nmt.sources.source_fingerprint`) and tag, the tokenizer model bytes and the
filter settings and `data.protect`. Files are written under `.tmp` names and renamed; the .json
marker comes last, so an entry is complete only when its .json exists. A cache
miss first removes every file of the split (stale entries, partial writes).
Loading maps the files read-only (`np.memmap`): ranks of one node that map
the same entry share the pages.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import itertools
import json
import os
from typing import Callable, Iterable, Iterator, NamedTuple, Sequence

import numpy as np

from nmt import sources
from nmt.errors import UserError
from nmt.tokenizer import Tokenizer

CACHE_VERSION = 2  # 2: streamed, memory-mapped .bin files, several corpora per split
SIDES = ("src", "tgt")
ARRAYS = ("src_tokens", "src_offsets", "src_lens", "tgt_tokens", "tgt_offsets", "tgt_lens")
COUNTS = ("pairs", "empty", "too_long", "ratio", "kept", "src_tokens", "tgt_tokens")


def token_dtype(vocab_size: int) -> np.dtype:
    """int16 when every id fits (vocab <= 32768), else int32."""
    return np.dtype(np.int16 if vocab_size <= 2**15 else np.int32)


class EncodedCorpus:
    """N encoded pairs as flat token arrays plus offsets (no BOS/EOS stored).

    Pair i's source ids are src_tokens[src_offsets[i]:src_offsets[i+1]]
    (offsets int64 [N+1]); likewise for the target. The arrays are in memory or
    memory-mapped files (`load`). `stats` holds the counts from reading and
    filtering, per corpus under "corpora"; `parts` the number of pairs of each
    corpus, in order.
    """

    def __init__(self, src_tokens: np.ndarray, src_offsets: np.ndarray, tgt_tokens: np.ndarray,
                 tgt_offsets: np.ndarray, stats: dict | None = None, *,
                 src_lens: np.ndarray | None = None, tgt_lens: np.ndarray | None = None):
        self.src_tokens, self.src_offsets = src_tokens, src_offsets
        self.tgt_tokens, self.tgt_offsets = tgt_tokens, tgt_offsets
        self.stats = dict(stats or {})
        self._src_lens, self._tgt_lens = src_lens, tgt_lens

    def __len__(self) -> int:
        return len(self.src_offsets) - 1

    @property
    def src_lens(self) -> np.ndarray:
        """[N] source lengths (without EOS); int32 when loaded from the cache."""
        if self._src_lens is None:
            self._src_lens = np.diff(self.src_offsets)
        return self._src_lens

    @property
    def tgt_lens(self) -> np.ndarray:
        """[N] target lengths (without BOS/EOS)."""
        if self._tgt_lens is None:
            self._tgt_lens = np.diff(self.tgt_offsets)
        return self._tgt_lens

    @property
    def parts(self) -> tuple[int, ...]:
        """Pairs per corpus, in order (one part when the corpus has no per-corpus statistics)."""
        corpora = self.stats.get("corpora")
        return tuple(c["kept"] for c in corpora) if corpora else (len(self),)

    def src(self, i: int) -> np.ndarray:
        return self.src_tokens[self.src_offsets[i]:self.src_offsets[i + 1]]

    def tgt(self, i: int) -> np.ndarray:
        return self.tgt_tokens[self.tgt_offsets[i]:self.tgt_offsets[i + 1]]

    @classmethod
    def load(cls, prefix: str) -> "EncodedCorpus":
        """Map a complete cache entry read-only; ValueError if it is not one of this version."""
        with open(prefix + ".json", encoding="utf-8") as f:
            meta = json.load(f)
        if meta.get("version") != CACHE_VERSION:
            raise ValueError("other cache version")
        arrays = {}
        for name in ARRAYS:
            dtype, length = np.dtype(meta["arrays"][name]["dtype"]), int(meta["arrays"][name]["length"])
            path = f"{prefix}.{name}.bin"
            if os.path.getsize(path) != length * dtype.itemsize:
                raise ValueError(f"{path} has the wrong size")
            # a plain ndarray view of the mapping (which it keeps open); np.memmap cannot map 0 bytes
            arrays[name] = np.memmap(path, dtype, "r", shape=(length,)).view(np.ndarray) if length \
                else np.zeros(0, dtype)
        return cls(arrays["src_tokens"], arrays["src_offsets"], arrays["tgt_tokens"], arrays["tgt_offsets"],
                   meta["stats"], src_lens=arrays["src_lens"], tgt_lens=arrays["tgt_lens"])


def filter_pairs(src_lens: np.ndarray, tgt_lens: np.ndarray, max_len: int,
                 max_ratio: float | None) -> tuple[np.ndarray, dict]:
    """Keep mask [N] and counts per rule; each dropped pair is counted under its first rule.

    Rules in order: `empty` (either side has no tokens), `too_long` (either side
    longer than max_len tokens, BOS/EOS not counted), `ratio` (longer/shorter
    > max_ratio; skipped when max_ratio is None). Counts: pairs, empty,
    too_long, ratio, kept. Per pair, so filtering chunk by chunk equals filtering the whole.
    """
    s, t = np.asarray(src_lens), np.asarray(tgt_lens)
    empty = (s == 0) | (t == 0) if max_ratio is not None else np.zeros(len(s), bool)
    too_long = ~empty & ((s > max_len) | (t > max_len))
    ratio = np.zeros(len(s), bool)
    if max_ratio is not None:
        ratio = ~empty & ~too_long & (np.maximum(s, t) > max_ratio * np.minimum(s, t))
    keep = ~(empty | too_long | ratio)
    counts = {"pairs": len(s), "empty": int(empty.sum()), "too_long": int(too_long.sum()),
              "ratio": int(ratio.sum()), "kept": int(keep.sum())}
    return keep, counts


# --------------------------------------------------------------------------- streaming encode

class Source(NamedTuple):
    """One corpus of a split, as `encode_split` reads it."""

    name: str                                                 # label in logs and statistics
    describe: str                                             # how errors name it
    chunks: Callable[[], Iterator[tuple[list[str], list[str]]]]  # aligned (src, tgt) chunks
    tag: str | None = None                                    # prepended to non-empty source lines
    protect: bool = False                                     # protected spans -> placeholders (nmt/protect.py)


def _flatten(seqs: list[list[int]], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Lists of ids -> (flat tokens, lengths [n] int64)."""
    lens = np.fromiter(map(len, seqs), np.int64, len(seqs))
    return np.fromiter(itertools.chain.from_iterable(seqs), dtype, int(lens.sum())), lens


def encode_chunk(tokenizer: Tokenizer, src: list[str], tgt: list[str], tag: str | None = None,
                 protect: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(src tokens, src lens [n], tgt tokens, tgt lens [n]) of aligned lines; with `protect` each pair's
    spans become placeholders (`protect.mask_pair`); `tag + " "` goes before every non-empty source
    line (an empty one stays empty, so the pair is dropped)."""
    if protect:
        from nmt.protect import mask_pair

        src, tgt = map(list, zip(*(mask_pair(a, b) for a, b in zip(src, tgt)))) if src else (src, tgt)
    if tag:
        src = [f"{tag} {x}" if x else x for x in src]
    st, sl = _flatten(tokenizer.encode_src(src), token_dtype(tokenizer.src_vocab_size))
    tt, tl = _flatten(tokenizer.encode_tgt(tgt), token_dtype(tokenizer.tgt_vocab_size))
    return st, sl, tt, tl


class _Writer:
    """Appends pairs to the temporary files of one cache entry; `commit` renames them and writes the marker."""

    def __init__(self, prefix: str, dtypes: dict[str, np.dtype]):
        self.prefix, self.dtypes = prefix, dtypes
        self.files = {name: open(f"{prefix}.{name}.bin.tmp", "wb") for name in ARRAYS}
        self.length = dict.fromkeys(ARRAYS, 0)
        self.end = dict.fromkeys(SIDES, 0)  # tokens written per side
        for side in SIDES:
            self._put(f"{side}_offsets", np.zeros(1, np.int64))

    def _put(self, name: str, arr: np.ndarray) -> None:
        arr.astype(self.dtypes[name], copy=False).tofile(self.files[name])
        self.length[name] += len(arr)

    def add(self, side: str, tokens: np.ndarray, lens: np.ndarray) -> None:
        """Pairs of one side: flat tokens and their lengths [n]."""
        self._put(f"{side}_tokens", tokens)
        self._put(f"{side}_lens", lens)
        self._put(f"{side}_offsets", self.end[side] + np.cumsum(lens))
        self.end[side] += int(lens.sum())

    def commit(self, stats: dict) -> None:
        for f in self.files.values():
            f.close()
        for name in ARRAYS:
            os.replace(f"{self.prefix}.{name}.bin.tmp", f"{self.prefix}.{name}.bin")
        meta = {"version": CACHE_VERSION, "stats": stats,
                "arrays": {n: {"dtype": self.dtypes[n].name, "length": self.length[n]} for n in ARRAYS}}
        with open(self.prefix + ".json.tmp", "w", encoding="utf-8") as f:
            json.dump(meta, f)
        os.replace(self.prefix + ".json.tmp", self.prefix + ".json")

    def abort(self) -> None:
        for name, f in self.files.items():
            f.close()
            with contextlib.suppress(FileNotFoundError):
                os.remove(f"{self.prefix}.{name}.bin.tmp")


def _empty_error(split: str, src: Source, counts: dict, max_len: int, max_ratio: float | None) -> UserError:
    if counts["pairs"] == 0:
        return UserError(f"the {split} corpus is empty: {src.describe}")
    return UserError(
        f"the {split} corpus is empty after filtering: {src.describe} ({counts['pairs']} pairs read: "
        f"{counts['empty']} with an empty side, {counts['too_long']} longer than data.max_len="
        f"{max_len}, {counts['ratio']} with length ratio > data.max_ratio={max_ratio})")


def encode_split(prefix: str, split: str, sources: Sequence[Source], tokenizer: Tokenizer, max_len: int,
                 max_ratio: float | None, filter_ratio: bool = True) -> dict:
    """Encode and filter every source into the cache entry `prefix`, chunk by chunk; returns the stats.

    `filter_ratio=False` (validation) applies only the max_len rule. A corpus
    with no pair left is a UserError (nothing is written then).
    """
    dtypes = {f"{s}_tokens": token_dtype(getattr(tokenizer, f"{s}_vocab_size")) for s in SIDES}
    dtypes.update({f"{s}_offsets": np.dtype(np.int64) for s in SIDES})
    dtypes.update({f"{s}_lens": np.dtype(np.int32) for s in SIDES})
    writer = _Writer(prefix, dtypes)
    per_corpus = []
    try:
        for src in sources:
            counts = dict.fromkeys(COUNTS, 0)
            for src_lines, tgt_lines in src.chunks():
                st, sl, tt, tl = encode_chunk(tokenizer, src_lines, tgt_lines, src.tag, src.protect)
                keep, c = filter_pairs(sl, tl, max_len, max_ratio if filter_ratio else None)
                writer.add("src", st[np.repeat(keep, sl)], sl[keep])
                writer.add("tgt", tt[np.repeat(keep, tl)], tl[keep])
                c.update(src_tokens=int(sl[keep].sum()), tgt_tokens=int(tl[keep].sum()))
                counts = {k: counts[k] + c[k] for k in COUNTS}
            if counts["kept"] == 0:
                raise _empty_error(split, src, counts, max_len, max_ratio)
            per_corpus.append({"name": src.name, **counts})
        stats = {k: sum(c[k] for c in per_corpus) for k in COUNTS}
        stats["corpora"] = per_corpus
        writer.commit(stats)
    except BaseException:
        writer.abort()
        raise
    return stats


# --------------------------------------------------------------------------- cache

def cache_prefix(run_dir: str, split: str, key: list) -> str:
    """run_dir/cache/<split>-<20 hex digits of the hash of CACHE_VERSION, split and key>."""
    text = json.dumps([CACHE_VERSION, split, key])
    return os.path.join(run_dir, "cache", f"{split}-{hashlib.sha256(text.encode()).hexdigest()[:20]}")


def remove_split(cache_dir: str, split: str) -> None:
    """Delete every cache file of `split` in cache_dir (complete entries, partial writes)."""
    for path in glob.glob(os.path.join(glob.escape(cache_dir), f"{split}-*")):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def cached_split(prefix: str, split: str, sources: Sequence[Source], tokenizer: Tokenizer, max_len: int,
                 max_ratio: float | None, log: Callable[[str], None], filter_ratio: bool = True) -> EncodedCorpus:
    """The encoded split: mapped from the cache entry `prefix`, or encoded into it first."""
    if os.path.isfile(prefix + ".json"):
        try:
            enc = EncodedCorpus.load(prefix)
            log(f"data {split}: loaded encoded corpus from {prefix}.*")
            return enc
        except (OSError, ValueError, KeyError, TypeError):
            log(f"data {split}: unreadable cache at {prefix}, encoding again")
    remove_split(os.path.dirname(prefix), split)
    os.makedirs(os.path.dirname(prefix), exist_ok=True)
    encode_split(prefix, split, sources, tokenizer, max_len, max_ratio, filter_ratio)
    return EncodedCorpus.load(prefix)


def chunked(src: Sequence[str], tgt: Sequence[str], size: int | None = None) -> Iterable[tuple[list[str], list[str]]]:
    """Aligned in-memory lines as chunks of `size` (default `nmt.sources.CHUNK`; e.g. validation, read already)."""
    size = size or sources.CHUNK
    for i in range(0, len(src), size):
        yield list(src[i:i + size]), list(tgt[i:i + size])
