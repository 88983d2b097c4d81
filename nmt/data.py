"""Parallel data: encode, filter and cache corpora; token-budget batches; `Batch`.

Sequence layout (fairseq style), with x = source ids and y = target ids:
    src     = x + [EOS]             (no BOS on the source)
    tgt_in  = [BOS] + y             (decoder input, teacher forcing)
    tgt_out = y + [EOS]             (labels)
padded on the right with PAD = 0, so a pair occupies len(x)+1 source and
len(y)+1 target positions; "tokens" in budgets and counts mean these positions.

Encoded corpora are cached in `run_dir/cache/` as .npy files, keyed by a hash
of the source fingerprint (file paths + sizes + mtimes, see
`nmt.sources.source_fingerprint`), the tokenizer model bytes and the filter
settings; a second run with the same inputs does not re-encode.
"""

from __future__ import annotations

import glob
import hashlib
import itertools
import json
import os
from dataclasses import dataclass, field, fields
from typing import Callable, Iterator, NamedTuple

import numpy as np
import torch

from nmt.config import Config, CorpusConfig
from nmt.errors import UserError
from nmt.masks import padding_mask
from nmt.sources import read_corpus, source_fingerprint
from nmt.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer, build_tokenizer

__all__ = ["read_corpus", "EncodedCorpus", "encode_corpus", "filter_pairs", "load_data", "Data", "prepare_data",
           "batch_indices", "shard_batches", "epoch_batches", "padding_efficiency",
           "Batch", "collate", "iter_batches"]

CACHE_VERSION = 1
_ENCODE_CHUNK = 100_000  # lines per encode call: bounds the size of the Python id lists


# --------------------------------------------------------------------------- corpus

def token_dtype(vocab_size: int) -> np.dtype:
    """int16 when every id fits (vocab <= 32768), else int32."""
    return np.dtype(np.int16 if vocab_size <= 2**15 else np.int32)


@dataclass
class EncodedCorpus:
    """N encoded pairs as flat token arrays plus offsets (no BOS/EOS stored).

    Pair i's source ids are src_tokens[src_offsets[i]:src_offsets[i+1]]
    (offsets int64 [N+1]); likewise for the target. `stats` holds the counts
    from reading and filtering.
    """

    src_tokens: np.ndarray
    src_offsets: np.ndarray
    tgt_tokens: np.ndarray
    tgt_offsets: np.ndarray
    stats: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.src_offsets) - 1

    @property
    def src_lens(self) -> np.ndarray:
        """[N] int64 source lengths (without EOS)."""
        return np.diff(self.src_offsets)

    @property
    def tgt_lens(self) -> np.ndarray:
        """[N] int64 target lengths (without BOS/EOS)."""
        return np.diff(self.tgt_offsets)

    def src(self, i: int) -> np.ndarray:
        return self.src_tokens[self.src_offsets[i]:self.src_offsets[i + 1]]

    def tgt(self, i: int) -> np.ndarray:
        return self.tgt_tokens[self.tgt_offsets[i]:self.tgt_offsets[i + 1]]

    def subset(self, keep: np.ndarray) -> "EncodedCorpus":
        """The pairs where the boolean mask keep [N] is True, in order."""
        def side(tokens, offsets):
            lens = np.diff(offsets)
            new_off = np.zeros(int(keep.sum()) + 1, np.int64)
            np.cumsum(lens[keep], out=new_off[1:])
            return tokens[np.repeat(keep, lens)], new_off
        s, so = side(self.src_tokens, self.src_offsets)
        t, to = side(self.tgt_tokens, self.tgt_offsets)
        return EncodedCorpus(s, so, t, to, dict(self.stats))

    def save(self, prefix: str) -> None:
        """Write prefix.<array>.npy for each array, then prefix.json (stats; marks completion)."""
        for f in fields(self):
            if f.name != "stats":
                with open(f"{prefix}.{f.name}.npy.tmp", "wb") as fh:
                    np.save(fh, getattr(self, f.name))
                os.replace(f"{prefix}.{f.name}.npy.tmp", f"{prefix}.{f.name}.npy")
        with open(prefix + ".json.tmp", "w") as fh:
            json.dump({"version": CACHE_VERSION, "stats": self.stats}, fh)
        os.replace(prefix + ".json.tmp", prefix + ".json")

    @classmethod
    def load(cls, prefix: str) -> "EncodedCorpus":
        with open(prefix + ".json") as fh:
            stats = json.load(fh)["stats"]
        arrays = {f.name: np.load(f"{prefix}.{f.name}.npy") for f in fields(cls) if f.name != "stats"}
        return cls(**arrays, stats=stats)


def _flatten(seqs: list[list[int]], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Lists of ids -> (flat tokens, lengths [n] int64)."""
    lens = np.fromiter(map(len, seqs), np.int64, len(seqs))
    return np.fromiter(itertools.chain.from_iterable(seqs), dtype, int(lens.sum())), lens


def encode_corpus(tokenizer: Tokenizer, src_lines: list[str], tgt_lines: list[str]) -> EncodedCorpus:
    """Encode aligned lines with SentencePiece batch encoding, chunk by chunk."""
    parts: dict[str, list[np.ndarray]] = {"st": [], "sl": [], "tt": [], "tl": []}
    sdt, tdt = token_dtype(tokenizer.src_vocab_size), token_dtype(tokenizer.tgt_vocab_size)
    for i in range(0, len(src_lines), _ENCODE_CHUNK):
        st, sl = _flatten(tokenizer.encode_src(src_lines[i:i + _ENCODE_CHUNK]), sdt)
        tt, tl = _flatten(tokenizer.encode_tgt(tgt_lines[i:i + _ENCODE_CHUNK]), tdt)
        for key, arr in zip(("st", "sl", "tt", "tl"), (st, sl, tt, tl)):
            parts[key].append(arr)

    def cat(key: str, dtype: np.dtype) -> np.ndarray:
        return np.concatenate(parts[key]) if parts[key] else np.zeros(0, dtype)

    def offsets(lens: np.ndarray) -> np.ndarray:
        off = np.zeros(len(lens) + 1, np.int64)
        np.cumsum(lens, out=off[1:])
        return off
    return EncodedCorpus(cat("st", sdt), offsets(cat("sl", np.int64)), cat("tt", tdt), offsets(cat("tl", np.int64)))


def filter_pairs(src_lens: np.ndarray, tgt_lens: np.ndarray, max_len: int,
                 max_ratio: float | None) -> tuple[np.ndarray, dict]:
    """Keep mask [N] and counts per rule; each dropped pair is counted under its first rule.

    Rules in order: `empty` (either side has no tokens), `too_long` (either side
    longer than max_len tokens, BOS/EOS not counted), `ratio` (longer/shorter
    > max_ratio; skipped when max_ratio is None). Counts: pairs, empty,
    too_long, ratio, kept.
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


# --------------------------------------------------------------------------- loading + cache

class Data(NamedTuple):
    """What `load_data` returns; unpacks as (train, valid, (valid_src, valid_ref))."""

    train: EncodedCorpus
    valid: EncodedCorpus
    valid_lines: tuple[list[str], list[str]]


def _describe(corpus: CorpusConfig) -> str:
    return f"{corpus.src} / {corpus.tgt}" if corpus.kind == "text" else f"Hugging Face dataset {corpus.hf_path}"


def _cache_prefix(cfg: Config, split: str, corpus: CorpusConfig, tokenizer: Tokenizer, run_dir: str) -> str:
    d = cfg.data
    protos = tokenizer.to_bytes()
    key = json.dumps([CACHE_VERSION, split, source_fingerprint(corpus, d.src_lang, d.tgt_lang),
                      hashlib.sha256(protos["src"] + (protos["tgt"] or b"")).hexdigest(),
                      d.max_len, d.max_ratio if split == "train" else None])
    return os.path.join(run_dir, "cache", f"{split}-{hashlib.sha256(key.encode()).hexdigest()[:20]}")


def _encode_cached(cfg: Config, split: str, tokenizer: Tokenizer, run_dir: str,
                   read: Callable[[], tuple[list[str], list[str]]], log: Callable[[str], None]) -> EncodedCorpus:
    """Read, encode and filter one split, or load it from the cache."""
    corpus: CorpusConfig = getattr(cfg.data, split)
    prefix = _cache_prefix(cfg, split, corpus, tokenizer, run_dir)
    if os.path.isfile(prefix + ".json"):
        try:
            enc = EncodedCorpus.load(prefix)
            log(f"data {split}: loaded encoded corpus from {prefix}.*.npy")
            return enc
        except (OSError, ValueError, KeyError):
            log(f"data {split}: unreadable cache at {prefix}, encoding again")
    src, tgt = read()
    if not src:
        raise UserError(f"the {split} corpus is empty: {_describe(corpus)}")
    enc = encode_corpus(tokenizer, src, tgt)
    keep, counts = filter_pairs(enc.src_lens, enc.tgt_lens, cfg.data.max_len,
                                cfg.data.max_ratio if split == "train" else None)
    enc = enc.subset(keep)
    if len(enc) == 0:
        raise UserError(
            f"the {split} corpus is empty after filtering: {_describe(corpus)} ({counts['pairs']} pairs read: "
            f"{counts['empty']} with an empty side, {counts['too_long']} longer than data.max_len="
            f"{cfg.data.max_len}, {counts['ratio']} with length ratio > data.max_ratio={cfg.data.max_ratio})")
    enc.stats = {**counts, "src_tokens": int(len(enc.src_tokens)), "tgt_tokens": int(len(enc.tgt_tokens))}
    os.makedirs(os.path.dirname(prefix), exist_ok=True)
    for old in glob.glob(os.path.join(glob.escape(os.path.dirname(prefix)), f"{split}-*.json")):
        for path in glob.glob(glob.escape(old[:-len(".json")]) + ".*"):  # stale entries of this split
            os.remove(path)
    enc.save(prefix)
    return enc


def _log_stats(split: str, stats: dict, max_len: int, max_ratio: float | None,
               log: Callable[[str], None]) -> None:
    ratio = f", {stats['ratio']} with length ratio > {max_ratio:g}" if max_ratio is not None else ""
    empty = f"{stats['empty']} with an empty side, " if max_ratio is not None else ""
    log(f"data {split}: {stats['pairs']} pairs read; dropped {empty}{stats['too_long']} longer than "
        f"{max_len} tokens{ratio}; kept {stats['kept']} pairs "
        f"({stats['src_tokens']} source / {stats['tgt_tokens']} target tokens)")


def load_data(cfg: Config, tokenizer: Tokenizer, run_dir: str, log: Callable[[str], None] = print,
              read_train: Callable[[], tuple[list[str], list[str]]] | None = None) -> Data:
    """Encoded train and valid corpora plus the raw valid lines for BLEU.

    train: pairs filtered by every rule of `filter_pairs`. valid: only pairs
    longer than max_len are dropped (for the validation loss); `valid_lines`
    keeps every valid pair, unfiltered, for BLEU. `read_train` may supply the
    training lines already read (e.g. for tokenizer training); it is only
    called on a cache miss. Counts are logged and stored in `corpus.stats`.
    """
    d = cfg.data
    train = _encode_cached(cfg, "train", tokenizer, run_dir,
                           read_train or (lambda: read_corpus(d.train, d.src_lang, d.tgt_lang)), log)
    _log_stats("train", train.stats, d.max_len, d.max_ratio, log)
    valid_lines = read_corpus(d.valid, d.src_lang, d.tgt_lang)
    valid = _encode_cached(cfg, "valid", tokenizer, run_dir, lambda: valid_lines, log)
    _log_stats("valid", valid.stats, d.max_len, None, log)
    return Data(train, valid, valid_lines)


def prepare_data(cfg: Config, run_dir: str, log: Callable[[str], None] = print) -> tuple[Tokenizer, Data]:
    """build_tokenizer + load_data, reading the training corpus at most once."""
    memo: list[tuple[list[str], list[str]]] = []

    def read_train() -> tuple[list[str], list[str]]:
        if not memo:
            memo.append(read_corpus(cfg.data.train, cfg.data.src_lang, cfg.data.tgt_lang))
        return memo[0]
    tokenizer = build_tokenizer(cfg, run_dir, log, read_train=read_train)
    return tokenizer, load_data(cfg, tokenizer, run_dir, log, read_train=read_train)


# --------------------------------------------------------------------------- batching

def batch_indices(src_lens: np.ndarray, tgt_lens: np.ndarray, batch_tokens: int, seed: int, epoch: int,
                  *, max_batch_size: int = 0, pool_size: int = 0) -> list[np.ndarray]:
    """One epoch's batches: arrays of pair indices, deterministic per (seed, epoch).

    Budget (fairseq's --max-tokens): with S = max(src_len)+1 (EOS) and
    T = max(tgt_len)+1 (BOS/EOS) over a batch of B pairs, B * max(S, T) <=
    batch_tokens, so neither padded tensor [B,S] nor [B,T] holds more than
    batch_tokens positions; also B <= max_batch_size when that is > 0. A pair
    that alone exceeds the budget forms its own batch (never dropped; max_len
    filtering is what excludes over-long pairs).

    Bucketing: pairs are shuffled (seed, epoch), cut into pools of pool_size
    pairs (0 = one pool), each pool is stably sorted by m = max(S,T) and then
    by S-T, ascending for even m and descending for odd m (a snake, so the end
    of one m-run meets the start of the next at a similar shape), and cut
    greedily into the largest batches that fit; the batch order is then
    shuffled. Sorting on m first makes each batch's budget a function of its
    last pair only; S-T within m keeps both sides tight. Measured padding
    efficiency (lognormal lengths, 20k-31k pairs, budget 4096): 0.95-0.97,
    vs 0.91-0.96 for sorting by (S, T). Every pair appears in exactly one batch.
    """
    s = np.asarray(src_lens, np.int64) + 1
    t = np.asarray(tgt_lens, np.int64) + 1
    m = np.maximum(s, t)
    shape = np.where(m % 2 == 0, s - t, t - s)
    rng = np.random.default_rng([seed, epoch])
    perm = rng.permutation(len(s))
    pool = pool_size if pool_size > 0 else max(len(s), 1)
    batches: list[np.ndarray] = []
    for start in range(0, len(s), pool):
        idx = perm[start:start + pool]
        order = idx[np.lexsort((shape[idx], m[idx]))]  # last key is the primary one
        batches += _cut(order, m[order], batch_tokens, max_batch_size)
    return [batches[i] for i in rng.permutation(len(batches))]


def _cut(order: np.ndarray, m: np.ndarray, budget: int, cap: int) -> list[np.ndarray]:
    """Greedy cut of `order` (m = max(S,T) per pair, non-decreasing) into batches within budget."""
    out, i, n = [], 0, len(order)
    while i < n:
        k = min(max(1, budget // int(m[i])), n - i)
        if cap > 0:
            k = min(k, cap)
        # c pairs fit iff c * m[i+c-1] <= budget; increasing in c, so the fits form a prefix
        fits = np.arange(1, k + 1) * m[i:i + k] <= budget
        c = max(1, int(fits.sum()))
        out.append(order[i:i + c])
        i += c
    return out


def shard_batches(batches: list[np.ndarray], rank: int, world_size: int) -> list[np.ndarray]:
    """Rank r's share: batches r, r+W, r+2W, ...; every rank gets ceil(n/W) batches.

    To keep ranks in step (no rank waits forever for a collective), the list is
    first extended cyclically with its own first batches up to a multiple of
    W, so up to W-1 batches are seen twice per epoch and none is dropped.
    """
    if world_size <= 1 or not batches:
        return list(batches)
    total = -(-len(batches) // world_size) * world_size
    return [batches[i % len(batches)] for i in range(rank, total, world_size)]


def epoch_batches(corpus: EncodedCorpus, cfg: Config, epoch: int, *, rank: int = 0, world_size: int = 1,
                  offset: int = 0) -> list[np.ndarray]:
    """This rank's batches of `epoch` from batch `offset` on (resume mid-epoch).

    A pure function of (corpus lengths, cfg.seed, cfg.data batching settings, epoch, rank, W, offset).
    """
    d = cfg.data
    batches = batch_indices(corpus.src_lens, corpus.tgt_lens, d.batch_tokens, cfg.seed, epoch,
                            max_batch_size=d.max_batch_size, pool_size=d.pool_size)
    return shard_batches(batches, rank, world_size)[offset:]


def padding_efficiency(src_lens: np.ndarray, tgt_lens: np.ndarray, batches: list[np.ndarray]) -> float:
    """Real positions / padded positions over both sides: sum(s+1 + t+1) / sum(B*(S+T))."""
    s, t = np.asarray(src_lens) + 1, np.asarray(tgt_lens) + 1
    real = sum(int(s[b].sum() + t[b].sum()) for b in batches)
    padded = sum(len(b) * int(s[b].max() + t[b].max()) for b in batches)
    return real / padded if padded else 1.0


# --------------------------------------------------------------------------- Batch

@dataclass
class Batch:
    """A padded batch (int64 ids, PAD = 0 on the right).

    src [B,S] = x + EOS; src_mask [B,S] True = real token; tgt_in [B,T] = BOS + y;
    tgt_out [B,T] = y + EOS; src_lengths [B] = len(x)+1; tgt_lengths [B] = len(y)+1;
    n_src_tokens / n_tgt_tokens = their sums (n_tgt_tokens = positions in the
    loss); indices [B] = positions of the pairs in the corpus.
    """

    src: torch.Tensor
    src_mask: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    src_lengths: torch.Tensor
    tgt_lengths: torch.Tensor
    n_src_tokens: int
    n_tgt_tokens: int
    indices: torch.Tensor

    def __len__(self) -> int:
        return self.src.shape[0]

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "Batch":
        return Batch(**{f.name: fn(v) if isinstance(v := getattr(self, f.name), torch.Tensor) else v
                        for f in fields(self)})

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "Batch":
        return self._map(lambda x: x.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> "Batch":
        """Page-locked copies for fast asynchronous host-to-GPU copies (no-op without CUDA)."""
        return self._map(lambda x: x.pin_memory()) if torch.cuda.is_available() else self


def _pad_rows(tokens: np.ndarray, starts: np.ndarray, lens: np.ndarray, width: int, shift: int) -> np.ndarray:
    """[B, width] int64 array with row b = tokens[starts[b] : starts[b]+lens[b]] placed at column shift."""
    out = np.full((len(lens), width), PAD_ID, np.int64)
    if tokens.size:
        cols = np.arange(width - shift)[None, :]  # [1, width-shift]
        real = cols < lens[:, None]
        gather = np.minimum(starts[:, None] + cols, tokens.size - 1)
        out[:, shift:] = np.where(real, tokens[gather], PAD_ID)
    return out


def collate(corpus: EncodedCorpus, indices: np.ndarray, *, pin_memory: bool = False) -> Batch:
    """The Batch of the given pair indices (see `Batch` for the layout)."""
    idx = np.asarray(indices, np.int64)
    rows = np.arange(len(idx))
    sl, tl = corpus.src_lens[idx], corpus.tgt_lens[idx]
    S, T = int(sl.max()) + 1, int(tl.max()) + 1
    src = _pad_rows(corpus.src_tokens, corpus.src_offsets[idx], sl, S, 0)
    src[rows, sl] = EOS_ID
    tgt_in = _pad_rows(corpus.tgt_tokens, corpus.tgt_offsets[idx], tl, T, 1)
    tgt_in[:, 0] = BOS_ID
    tgt_out = _pad_rows(corpus.tgt_tokens, corpus.tgt_offsets[idx], tl, T, 0)
    tgt_out[rows, tl] = EOS_ID
    src_lengths = torch.from_numpy(sl + 1)
    batch = Batch(src=torch.from_numpy(src), src_mask=padding_mask(src_lengths, S),
                  tgt_in=torch.from_numpy(tgt_in), tgt_out=torch.from_numpy(tgt_out),
                  src_lengths=src_lengths, tgt_lengths=torch.from_numpy(tl + 1),
                  n_src_tokens=int(sl.sum()) + len(idx), n_tgt_tokens=int(tl.sum()) + len(idx),
                  indices=torch.from_numpy(idx.copy()))
    return batch.pin_memory() if pin_memory else batch


def iter_batches(corpus: EncodedCorpus, batches: list[np.ndarray], *, pin_memory: bool = False) -> Iterator[Batch]:
    """Collate the given index batches lazily, in order."""
    for b in batches:
        yield collate(corpus, b, pin_memory=pin_memory)
