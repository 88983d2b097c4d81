"""Encoded corpora: streaming encode + filter into cache files, loaded into memory or mapped.

A split (train or valid) is one or more corpora read chunk by chunk (`nmt.text.sources.iter_pairs`),
encoded with SentencePiece, filtered (`filter_pairs`) and appended to six flat files, so memory does
not grow with the corpus. The corpora of a split are stored one after another (`parts`).

Cache entry `run_dir/cache/<split>-<key>`:
    .src_tokens.bin   [total source tokens] int16 (vocab <= 32768) or int32
    .src_offsets.bin  [N+1] int64: pair i = src_tokens[off[i]:off[i+1]]
    .src_lens.bin     [N] int32
    .tgt_tokens.bin, .tgt_offsets.bin, .tgt_lens.bin   the same for the targets
    .json             version, dtypes and lengths of the arrays, statistics, digest of the arrays
The key hashes CACHE_VERSION, the split, each corpus' source fingerprint (path, size, mtime, ctime
and inode: `nmt.text.sources.source_fingerprint`; ctime because no tool can set it back after an
edit) and tag, the tokenizer model, the filter settings, `data.protect` and `data.terms`. Files are
written atomically (`nmt.textio.atomic_file`), the .json last: an entry is complete when its .json
exists. A cache miss removes every file of the split first; when the new arrays differ from the
entry the run directory held before (their digest), a log line says a resumed run does not
continue exactly.

Loading checks every entry (`EncodedCorpus.check`: offsets against sizes, ids against the vocabulary):
a corrupted file is encoded again, never an IndexError deep in training. An entry is read into memory
when it is small (`in_memory_limit`: 1/16 of the machine's memory shared between a node's ranks),
else memory-mapped read-only so that a node's ranks share its pages (a mapped file truncated while
a run uses it kills the run with SIGBUS, so only corpora too large to read are mapped).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import itertools
import json
import os
from typing import BinaryIO, Callable, Iterable, Iterator, NamedTuple, Sequence

import numpy as np

from nmt import textio

from nmt.text import sources
from nmt.errors import UserError
from nmt.text.tokens import TokenizerLike

CACHE_VERSION = 2  # 2: streamed, memory-mapped .bin files, several corpora per split
SIDES = ("src", "tgt")
ARRAYS = ("src_tokens", "src_offsets", "src_lens", "tgt_tokens", "tgt_offsets", "tgt_lens")
COUNTS = ("pairs", "empty", "too_long", "ratio", "identical", "kept", "src_tokens", "tgt_tokens")


def token_dtype(vocab_size: int) -> np.dtype:
    """int16 when every id fits (vocab <= 32768), else int32."""
    return np.dtype(np.int16 if vocab_size <= 2**15 else np.int32)


class EncodedCorpus:
    """N encoded pairs as flat token arrays plus offsets (no BOS/EOS stored): pair i's source ids are
    src_tokens[src_offsets[i]:src_offsets[i+1]] (offsets int64 [N+1]), likewise the target; in memory or
    memory-mapped (`load`). `stats`: counts from reading and filtering (per corpus under "corpora");
    `parts`: the pairs of each corpus, in order."""

    def __init__(self, src_tokens: np.ndarray, src_offsets: np.ndarray, tgt_tokens: np.ndarray,
                 tgt_offsets: np.ndarray, stats: dict | None = None, *,
                 src_lens: np.ndarray | None = None, tgt_lens: np.ndarray | None = None, digest: str | None = None):
        self.src_tokens, self.src_offsets = src_tokens, src_offsets
        self.tgt_tokens, self.tgt_offsets = tgt_tokens, tgt_offsets
        self.stats = dict(stats or {})
        self._src_lens, self._tgt_lens = src_lens, tgt_lens
        self.digest = digest  # of the cache files (`array_digest`), when loaded from the cache

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
    def load(cls, prefix: str, in_memory: bool | None = None) -> "EncodedCorpus":
        """A complete cache entry, read-only: read into memory, or mapped (in_memory None: by
        `in_memory_limit`); ValueError if it is not one of this version or a size is wrong."""
        with open(prefix + ".json", encoding="utf-8") as f:
            meta = json.load(f)
        if meta.get("version") != CACHE_VERSION:
            raise ValueError("other cache version")
        shapes = {name: (np.dtype(meta["arrays"][name]["dtype"]), int(meta["arrays"][name]["length"]))
                  for name in ARRAYS}
        if in_memory is None:
            in_memory = sum(dtype.itemsize * n for dtype, n in shapes.values()) <= in_memory_limit()
        arrays = {}
        for name, (dtype, length) in shapes.items():
            path = f"{prefix}.{name}.bin"
            if os.path.getsize(path) != length * dtype.itemsize:
                raise ValueError(f"{path} has the wrong size")
            if in_memory:
                arr = np.fromfile(path, dtype, count=length)
                if len(arr) != length:  # the file shrank since the size check
                    raise ValueError(f"{path} has the wrong size")
                arr.flags.writeable = False
            else:  # a plain ndarray view of the mapping (which it keeps open); np.memmap cannot map 0 bytes
                arr = np.memmap(path, dtype, "r", shape=(length,)).view(np.ndarray) if length else np.zeros(0, dtype)
            arrays[name] = arr
        return cls(arrays["src_tokens"], arrays["src_offsets"], arrays["tgt_tokens"], arrays["tgt_offsets"],
                   meta["stats"], src_lens=arrays["src_lens"], tgt_lens=arrays["tgt_lens"], digest=meta.get("digest"))

    def check(self, src_vocab_size: int, tgt_vocab_size: int) -> None:
        """ValueError (naming the array) unless the arrays are consistent: per side N+1 offsets from 0
        to the number of tokens, never decreasing, their differences the N lengths, every id inside
        the vocabulary; the per-corpus counts sum to N. One vectorised pass over each array."""
        n = len(self)
        if sum(self.parts) != n:
            raise ValueError(f"the statistics count {sum(self.parts)} pairs, the arrays {n}")
        for side, vocab in (("src", src_vocab_size), ("tgt", tgt_vocab_size)):
            tokens, offsets = getattr(self, f"{side}_tokens"), getattr(self, f"{side}_offsets")
            lens = getattr(self, f"{side}_lens")
            if len(offsets) != n + 1 or offsets[0] != 0 or offsets[-1] != len(tokens) or len(lens) != n:
                raise ValueError(f"{side}_offsets do not match the sizes of {side}_tokens and {side}_lens")
            steps = np.diff(offsets)
            if not np.array_equal(steps, lens) or (n and steps.min() < 0):
                raise ValueError(f"{side}_offsets and {side}_lens disagree")
            if len(tokens) and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
                bad = int(tokens.max()) if int(tokens.max()) >= vocab else int(tokens.min())
                raise ValueError(f"{side}_tokens hold the id {bad}, outside the vocabulary (0 to {vocab - 1})")


def in_memory_limit() -> int:
    """Bytes up to which a cache entry is read into memory rather than mapped: 1/16 of the
    machine's memory, divided between the processes torchrun starts on this node
    (LOCAL_WORLD_SIZE), each of which holds its own copy."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not on every platform
        total = 8 << 30
    local = max(int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1), 1)
    return total // 16 // local


def filter_pairs(src_lens: np.ndarray, tgt_lens: np.ndarray, max_len: int,
                 max_ratio: float | None, tgt_prefix: int = 0,
                 identical: np.ndarray | None = None) -> tuple[np.ndarray, dict]:
    """Keep mask [N] and counts per rule (pairs, empty, too_long, ratio, identical, kept); a dropped pair
    counts under its first rule: `empty`, `too_long` (over max_len tokens, BOS/EOS not counted), `ratio`
    (longer/shorter > max_ratio), `identical` (the mask `identical` [N]). With max_ratio None (validation)
    only `too_long` applies. Per pair, so filtering chunk by chunk equals filtering the whole.
    tgt_prefix: tokens before every non-empty target (a language token), not counted by the ratio rule."""
    s, t = np.asarray(src_lens), np.asarray(tgt_lens)
    empty = (s == 0) | (t == 0) if max_ratio is not None else np.zeros(len(s), bool)
    too_long = ~empty & ((s > max_len) | (t > max_len))
    ratio = np.zeros(len(s), bool)
    if max_ratio is not None:
        text = np.where(t > 0, t - tgt_prefix, 0)
        ratio = ~empty & ~too_long & (np.maximum(s, text) > max_ratio * np.minimum(s, text))
    same = np.zeros(len(s), bool)
    if max_ratio is not None and identical is not None:
        same = ~empty & ~too_long & ~ratio & np.asarray(identical, bool)
    keep = ~(empty | too_long | ratio | same)
    counts = {"pairs": len(s), "empty": int(empty.sum()), "too_long": int(too_long.sum()),
              "ratio": int(ratio.sum()), "identical": int(same.sum()), "kept": int(keep.sum())}
    return keep, counts


def identical_pairs(src: list[str], tgt: list[str]) -> np.ndarray:
    """Mask [N] of the pairs whose target is the source as written (whitespace runs aside): an
    untranslated message, a name, a command. `data.drop_identical` drops them from training."""
    return np.fromiter((a.split() == b.split() for a, b in zip(src, tgt)), bool, len(src))


# --------------------------------------------------------------------------- streaming encode

class Source(NamedTuple):
    """One corpus of a split, as `encode_split` reads it."""

    name: str                                                 # label in logs and statistics
    describe: str                                             # how errors name it
    chunks: Callable[[], Iterator[tuple[list[str], list[str]]]]  # aligned (src, tgt) chunks
    tag: str | None = None                                    # prepended to non-empty source lines
    protect: bool = False                                     # protected spans -> placeholders (nmt/text/protect.py)
    tgt_prefix: tuple[int, ...] = ()                          # ids before every non-empty target (a language token)
    protect_inject: float = 0.0                               # share of span-less pairs given placeholders (protect)
    terms: Callable[[list[str], list[str]], list[str]] | None = None  # term-annotated sources (`annotate_chunk`)
    drop_identical: bool = False                              # drop pairs whose target is the source (`identical_pairs`)
    src_lang: str | None = None                               # its language (the token an imported M2M100/NLLB puts first)


def _flatten(seqs: list[list[int]], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Lists of ids -> (flat tokens, lengths [n] int64)."""
    lens = np.fromiter(map(len, seqs), np.int64, len(seqs))
    return np.fromiter(itertools.chain.from_iterable(seqs), dtype, int(lens.sum())), lens


def encode_chunk(tokenizer: TokenizerLike, src: list[str], tgt: list[str], tag: str | None = None,
                 protect: bool = False, tgt_prefix: tuple[int, ...] = (), protect_inject: float = 0.0,
                 src_lang: str | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(src tokens, src lens [n], tgt tokens, tgt lens [n]) of aligned lines; with `protect` each pair's
    spans become placeholders (`mask_chunk`); `tag + " "` goes before every non-empty source
    line (an empty one stays empty, so the pair is dropped); `tgt_prefix` (a multilingual model's
    language token, nmt/text/languages.py) goes before every non-empty target; `src_lang` picks the source
    language token of an imported M2M100/NLLB model (`TokenizerLike.encode_src`)."""
    if protect:
        src, tgt = mask_chunk(src, tgt, protect_inject)
    st, sl = _flatten(tokenizer.encode_src(_tagged(src, tag), src_lang), token_dtype(tokenizer.src_vocab_size))
    tgt_ids = tokenizer.encode_tgt(tgt)
    if tgt_prefix:
        tgt_ids = [list(tgt_prefix) + ids if ids else ids for ids in tgt_ids]
    tt, tl = _flatten(tgt_ids, token_dtype(tokenizer.tgt_vocab_size))
    return st, sl, tt, tl


def _tagged(src: list[str], tag: str | None) -> list[str]:
    return [f"{tag} {x}" if x else x for x in src] if tag else src


def mask_chunk(src: list[str], tgt: list[str], protect_inject: float = 0.0) -> tuple[list[str], list[str]]:
    """Aligned lines with each pair's protected spans as placeholders (`protect.mask_pair`;
    `protect_inject`: the share of pairs without spans that get placeholders at aligned positions)."""
    from nmt.text.protect import mask_pair

    pairs = [mask_pair(a, b, inject=protect_inject) for a, b in zip(src, tgt)]
    if not pairs:
        return src, tgt
    masked_src, masked_tgt = zip(*pairs)
    return list(masked_src), list(masked_tgt)


def annotate_chunk(tokenizer: TokenizerLike, src: list[str], tgt: list[str], st: np.ndarray, sl: np.ndarray,
                   keep: np.ndarray, source: Source, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(src tokens, src lens [n]) with the kept pairs' sources term-annotated (`source.terms`, data.terms),
    each where its annotated form still fits max_len: the filters judged the plain pair, so annotations
    never drop a pair (a short pair with a term would fail data.max_ratio) nor keep one."""
    annotated = source.terms(src, tgt)  # type: ignore[misc]
    changed = [i for i, (a, b) in enumerate(zip(src, annotated)) if a != b and keep[i]]
    if not changed:
        return st, sl
    seqs = np.split(st, np.cumsum(sl)[:-1]) if len(sl) else []
    for i, ids in zip(changed, tokenizer.encode_src(_tagged([annotated[i] for i in changed], source.tag),
                                                    source.src_lang)):
        if len(ids) <= max_len:
            seqs[i] = ids
    return _flatten(seqs, st.dtype)


def array_digest(hashes: dict[str, str]) -> str:
    """The digest of an entry's arrays from the sha256 of each array file (ARRAYS order)."""
    return hashlib.sha256(json.dumps([[name, hashes[name]] for name in ARRAYS]).encode()).hexdigest()


def file_digest(prefix: str) -> str:
    """`array_digest` of the files of the entry `prefix` as they are on disk."""
    hashes = {}
    for name in ARRAYS:
        h = hashlib.sha256()
        with open(f"{prefix}.{name}.bin", "rb") as f:
            while block := f.read(1 << 20):
                h.update(block)
        hashes[name] = h.hexdigest()
    return array_digest(hashes)


@contextlib.contextmanager
def _naming(path: str) -> Iterator[None]:
    """An OSError inside names `path` (a write to a full disk raises one without a file name)."""
    try:
        yield
    except OSError as e:
        if e.filename is not None or e.errno is None:
            raise
        raise OSError(e.errno, e.strerror, path) from None


class _Aborted(Exception):
    """Thrown into the cache files' writers by `_Writer.abort`: they remove their temporary files."""


class _Writer:
    """Appends pairs to the six files of one cache entry, each written through `textio.atomic_file`
    (a temporary `<split>-<key>.<array>.bin.*.tmp` beside it, which `remove_split` also matches); `commit`
    renames them into place and writes the marker last, `abort` removes them."""

    def __init__(self, prefix: str, dtypes: dict[str, np.dtype]):
        self.prefix, self.dtypes = prefix, dtypes
        self.files: dict[str, BinaryIO] = {}
        self._writers: dict[str, contextlib.AbstractContextManager] = {}  # the atomic_file of each open file
        try:
            for name in ARRAYS:
                path = f"{prefix}.{name}.bin"
                writer = textio.atomic_file(path, prefix=os.path.basename(path) + ".")
                with _naming(path):
                    self.files[name] = writer.__enter__()
                self._writers[name] = writer
        except BaseException:
            self.abort()
            raise
        self.hashes = {name: hashlib.sha256() for name in ARRAYS}
        self.length = dict.fromkeys(ARRAYS, 0)
        self.end = dict.fromkeys(SIDES, 0)  # tokens written per side
        for side in SIDES:
            self._put(f"{side}_offsets", np.zeros(1, np.int64))

    def _put(self, name: str, arr: np.ndarray) -> None:
        data = memoryview(np.ascontiguousarray(arr.astype(self.dtypes[name], copy=False))).cast("B")
        with _naming(f"{self.prefix}.{name}.bin"):  # (numpy's tofile would say "N requested and M written")
            self.files[name].write(data)
        self.hashes[name].update(data)
        self.length[name] += len(arr)

    def add(self, side: str, tokens: np.ndarray, lens: np.ndarray) -> None:
        """Pairs of one side: flat tokens and their lengths [n]."""
        self._put(f"{side}_tokens", tokens)
        self._put(f"{side}_lens", lens)
        self._put(f"{side}_offsets", self.end[side] + np.cumsum(lens))
        self.end[side] += int(lens.sum())

    def commit(self, stats: dict) -> str:
        """Close and rename the files, write the marker; returns the digest of the arrays."""
        for name in ARRAYS:
            with _naming(f"{self.prefix}.{name}.bin"):
                self._writers.pop(name).__exit__(None, None, None)  # flushes (a full disk may show only now), renames
        digest = array_digest({name: h.hexdigest() for name, h in self.hashes.items()})
        meta = {"version": CACHE_VERSION, "stats": stats, "digest": digest,
                "arrays": {n: {"dtype": self.dtypes[n].name, "length": self.length[n]} for n in ARRAYS}}
        with _naming(self.prefix + ".json"):
            textio.write_file(self.prefix + ".json", json.dumps(meta).encode())
        return digest

    def abort(self) -> None:
        """Close and remove the files not renamed yet."""
        while self._writers:
            _, writer = self._writers.popitem()
            with contextlib.suppress(OSError, _Aborted):  # a full disk fails the flush again: the file goes anyway
                writer.__exit__(_Aborted, _Aborted(), None)


def _empty_error(split: str, src: Source, counts: dict, max_len: int, max_ratio: float | None) -> UserError:
    if counts["pairs"] == 0:
        return UserError(f"the {split} corpus is empty: {src.describe}")
    return UserError(
        f"the {split} corpus is empty after filtering: {src.describe} ({counts['pairs']} pairs read: "
        f"{counts['empty']} with an empty side, {counts['too_long']} longer than data.max_len="
        f"{max_len}, {counts['ratio']} with length ratio > data.max_ratio={max_ratio}"
        + (f", {counts['identical']} with the target equal to the source (data.drop_identical)" if counts["identical"] else "")
        + ")")


def encode_split(prefix: str, split: str, sources: Sequence[Source], tokenizer: TokenizerLike, max_len: int,
                 max_ratio: float | None, filter_ratio: bool = True) -> dict:
    """Encode and filter every source into the cache entry `prefix`, chunk by chunk; returns the stats.

    `filter_ratio=False` (validation) applies only the max_len rule (empty pairs are kept). A corpus
    with no pair left is a UserError (nothing is written then).
    """
    dtypes = {"src_tokens": token_dtype(tokenizer.src_vocab_size), "tgt_tokens": token_dtype(tokenizer.tgt_vocab_size)}
    dtypes.update({f"{s}_offsets": np.dtype(np.int64) for s in SIDES})
    dtypes.update({f"{s}_lens": np.dtype(np.int32) for s in SIDES})
    writer = _Writer(prefix, dtypes)
    per_corpus = []
    try:
        for src in sources:
            counts = dict.fromkeys(COUNTS, 0)
            for src_lines, tgt_lines in src.chunks():
                same = identical_pairs(src_lines, tgt_lines) if src.drop_identical else None
                if src.protect:
                    src_lines, tgt_lines = mask_chunk(src_lines, tgt_lines, src.protect_inject)
                st, sl, tt, tl = encode_chunk(tokenizer, src_lines, tgt_lines, src.tag, tgt_prefix=src.tgt_prefix,
                                              src_lang=src.src_lang)
                keep, c = filter_pairs(sl, tl, max_len, max_ratio if filter_ratio else None, len(src.tgt_prefix), same)
                if src.terms is not None:
                    st, sl = annotate_chunk(tokenizer, src_lines, tgt_lines, st, sl, keep, src, max_len)
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


def cached_split(prefix: str, split: str, sources: Sequence[Source], tokenizer: TokenizerLike, max_len: int,
                 max_ratio: float | None, log: Callable[[str], None], filter_ratio: bool = True) -> EncodedCorpus:
    """The encoded split: loaded from the cache entry `prefix` (checked), or encoded into it first."""
    if os.path.isfile(prefix + ".json"):
        try:
            enc = EncodedCorpus.load(prefix)
            enc.check(tokenizer.src_vocab_size, tokenizer.tgt_vocab_size)
            log(f"data {split}: loaded encoded corpus from {prefix}.*")
            return enc
        except (OSError, ValueError, KeyError, TypeError) as e:
            log(f"data {split}: unreadable cache at {prefix} ({_reason(e)}), encoding again")
    cache_dir = os.path.dirname(prefix)
    before = previous_digest(cache_dir, split)
    remove_split(cache_dir, split)
    os.makedirs(cache_dir, exist_ok=True)
    encode_split(prefix, split, sources, tokenizer, max_len, max_ratio, filter_ratio)
    enc = EncodedCorpus.load(prefix)
    if before is not None and before != enc.digest:
        log(f"data {split}: the encoded {split} data differ from those this run directory held before (a corpus file "
            f"or a data setting changed): " + ("a resumed run does not continue exactly (other pairs, other batches)"
                                               if split == "train" else "validation scores are not comparable "
                                               "with the earlier ones"))
    return enc


def _reason(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def previous_digest(cache_dir: str, split: str) -> str | None:
    """The digest of the complete entry of `split` the cache directory holds (from its marker, or
    computed from its files for entries written before digests were stored); None if there is
    none or it cannot be read. (A miss happens when the key changed: that entry is the old one.)"""
    for marker in sorted(glob.glob(os.path.join(glob.escape(cache_dir), f"{split}-*.json"))):
        prefix = marker[:-len(".json")]
        try:
            with open(marker, encoding="utf-8") as f:
                digest = json.load(f).get("digest")
            return digest or file_digest(prefix)
        except (OSError, ValueError, AttributeError):
            continue
    return None


def chunked(src: Sequence[str], tgt: Sequence[str], size: int | None = None) -> Iterable[tuple[list[str], list[str]]]:
    """Aligned in-memory lines as chunks of `size` (default `nmt.text.sources.CHUNK`; e.g. validation, read already)."""
    size = size or sources.CHUNK
    for i in range(0, len(src), size):
        yield list(src[i:i + size]), list(tgt[i:i + size])
