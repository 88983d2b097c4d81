"""The sequence layout: special ids and the padded tensors every model call takes.

With x = source ids and y = target ids (subwords, no specials), as fairseq does:

    src     = x + [EOS]             (no BOS on the source)
    tgt_in  = [START] + y           (decoder input, teacher forcing; START = BOS for nmt's own models)
    tgt_out = y + [EOS]             (labels)

padded on the right with PAD, so a pair occupies len(x)+1 source and len(y)+1 target
positions; "tokens" in budgets and counts mean these positions. Masks follow nmt/masks.py
(True = real token).

This module is the one place the layout is built: `collate` (training and validation
batches from an encoded corpus), `source_tensors` and `target_tensors` (from lists of ids:
both engines, scoring, alignment, the scripts). The special ids of nmt's own SentencePiece
models are fixed (`PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3`); a vocabulary from elsewhere
describes its own with a `Specials` (the tokenizer owns it: `Tokenizer.specials`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable, Iterator, Sequence

import numpy as np
import torch

from nmt.masks import padding_mask

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3


@dataclass(frozen=True)
class Specials:
    """The special ids of one vocabulary: padding, unknown, the decoder's first input (`start`) and
    the end of a sequence. nmt's own models use `NMT_SPECIALS` (0, 1, 2, 3)."""

    pad: int = PAD_ID
    unk: int = UNK_ID
    start: int = BOS_ID
    eos: int = EOS_ID

    @property
    def never_generated(self) -> tuple[int, ...]:
        """Ids a search never outputs: PAD and the decoder start (unless the start is EOS itself)."""
        return tuple(dict.fromkeys(i for i in (self.pad, self.start) if i != self.eos))


NMT_SPECIALS = Specials()


# --------------------------------------------------------------------------- from lists of ids

def source_tensors(src_ids: Sequence[Sequence[int]], specials: Specials = NMT_SPECIALS,
                   device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """src [B,S] = each x + EOS, padded; src_mask [B,S] (True = token). Each x may be empty."""
    width = max(len(ids) for ids in src_ids) + 1
    src = torch.tensor([[*ids, specials.eos] + [specials.pad] * (width - len(ids) - 1) for ids in src_ids],
                       dtype=torch.long, device=device)  # [B,S]
    lengths = torch.tensor([len(ids) + 1 for ids in src_ids], device=device)  # [B]
    return src, padding_mask(lengths, width)


def target_tensors(tgt_ids: Sequence[Sequence[int]], specials: Specials = NMT_SPECIALS,
                   device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """tgt_in [B,T] = START + y, tgt_out [B,T] = y + EOS, both padded with PAD (T = longest y + 1)."""
    T = max(len(y) for y in tgt_ids) + 1
    tgt_in = torch.tensor([[specials.start, *y] + [specials.pad] * (T - 1 - len(y)) for y in tgt_ids],
                          dtype=torch.long, device=device)
    tgt_out = torch.tensor([[*y, specials.eos] + [specials.pad] * (T - 1 - len(y)) for y in tgt_ids],
                           dtype=torch.long, device=device)
    return tgt_in, tgt_out


# --------------------------------------------------------------------------- batches of a corpus

@dataclass(frozen=True)
class Batch:
    """A padded training/validation batch (int64 ids, PAD on the right; layout: module docstring).

    src [B,S], src_mask [B,S] (True = real token; None when no source is padded), tgt_in [B,T],
    tgt_out [B,T]; n_src_tokens / n_tgt_tokens: real positions (n_tgt_tokens = positions in the loss).
    Rows added to reach a bucket's shape (data.length_buckets) hold a source of EOS alone and no target
    position in the loss.
    """

    src: torch.Tensor
    src_mask: torch.Tensor | None  # None: no source padding (data.same_source_length)
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    n_src_tokens: int
    n_tgt_tokens: int

    def __len__(self) -> int:
        return self.src.shape[0]

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "Batch":
        return Batch(**{f.name: fn(v) if isinstance(v := getattr(self, f.name), torch.Tensor) else v
                        for f in fields(self)})

    def to(self, device: torch.device | str) -> "Batch":
        """On `device`. To a GPU the copies are asynchronous (collate pins the host memory there)."""
        device = torch.device(device)
        return self._map(lambda x: x.to(device, non_blocking=x.is_pinned()))

    def pin_memory(self) -> "Batch":
        """Page-locked copies, for asynchronous host-to-GPU copies (no-op without CUDA)."""
        return self._map(lambda x: x.pin_memory()) if torch.cuda.is_available() else self


def _pad_rows(tokens: np.ndarray, starts: np.ndarray, lens: np.ndarray, width: int, shift: int,
              pad: int) -> np.ndarray:
    """[B, width] int64 array with row b = tokens[starts[b] : starts[b]+lens[b]] placed at column shift."""
    out = np.full((len(lens), width), pad, np.int64)
    if tokens.size:
        cols = np.arange(width - shift)[None, :]  # [1, width-shift]
        real = cols < lens[:, None]
        gather = np.minimum(starts[:, None] + cols, tokens.size - 1)
        out[:, shift:] = np.where(real, tokens[gather], pad)
    return out


def _sizes(corpus, idx: np.ndarray, shape: tuple[int, int] | None,
           masks: bool) -> tuple[np.ndarray, np.ndarray, int, int, int]:
    """Source and target lengths [B] of the pairs (no specials), and the padded rows, S and T: the
    batch's own, or `shape` = (rows, length) for both sides (data.length_buckets). masks False: a
    ValueError unless every source has one length (a batch without a source mask)."""
    sl, tl = corpus.src_lens[idx].astype(np.int64), corpus.tgt_lens[idx].astype(np.int64)  # [B]
    if not masks and (sl != sl[0]).any():
        raise ValueError("a batch without a source mask needs sources of one length")
    if shape is None:
        return sl, tl, len(idx), int(sl.max()) + 1, int(tl.max()) + 1
    rows, length = shape
    if rows < len(idx) or length <= max(int(sl.max()), int(tl.max())):
        raise ValueError(f"a batch of {len(idx)} pairs up to {max(int(sl.max()), int(tl.max())) + 1} positions "
                         f"does not fit the shape {shape}")
    return sl, tl, rows, length, length


def collate(corpus, indices: np.ndarray, specials: Specials = NMT_SPECIALS, *, pin_memory: bool = False,
            shape: tuple[int, int] | None = None, masks: bool = True) -> Batch:
    """The Batch of the given pair indices of an `nmt.data.corpus.EncodedCorpus`. pin_memory: page-locked
    tensors (for a CUDA device: `Batch.to` then copies asynchronously). shape: (rows, length) to pad to
    (`nmt.data.batches.bucket_shape`). masks False: src_mask None, for a batch whose sources all have one
    length (data.same_source_length; a ValueError otherwise)."""
    idx = np.asarray(indices, np.int64)
    rows = np.arange(len(idx))
    sl, tl, B, S, T = _sizes(corpus, idx, shape, masks)
    src = _pad_rows(corpus.src_tokens, corpus.src_offsets[idx], sl, S, 0, specials.pad)
    src[rows, sl] = specials.eos
    tgt_in = _pad_rows(corpus.tgt_tokens, corpus.tgt_offsets[idx], tl, T, 1, specials.pad)
    tgt_in[:, 0] = specials.start
    tgt_out = _pad_rows(corpus.tgt_tokens, corpus.tgt_offsets[idx], tl, T, 0, specials.pad)
    tgt_out[rows, tl] = specials.eos
    src_lengths = np.ones(B, np.int64)  # [B] rows beyond the pairs: EOS alone, no target position
    src_lengths[:len(idx)] = sl + 1
    if B > len(idx):
        src = np.concatenate([src, np.full((B - len(idx), S), specials.pad, np.int64)])
        src[len(idx):, 0] = specials.eos
        tgt_in = np.concatenate([tgt_in, np.full((B - len(idx), T), specials.pad, np.int64)])
        tgt_in[len(idx):, 0] = specials.start
        tgt_out = np.concatenate([tgt_out, np.full((B - len(idx), T), specials.pad, np.int64)])
    src_mask = padding_mask(torch.from_numpy(src_lengths), S) if masks else None
    batch = Batch(src=torch.from_numpy(src), src_mask=src_mask,
                  tgt_in=torch.from_numpy(tgt_in), tgt_out=torch.from_numpy(tgt_out),
                  n_src_tokens=int(sl.sum()) + len(idx), n_tgt_tokens=int(tl.sum()) + len(idx))
    return batch.pin_memory() if pin_memory else batch


@dataclass(frozen=True)
class PackedBatch:
    """A batch as its flat tokens (data.collate: device): `to(device)` copies one int64 buffer and pads
    there, giving the `Batch` that `collate` gives for the same arguments (`pack`). buffer: the pairs'
    source tokens (n_src of them), their target tokens (n_tgt), then the source and target lengths
    [n_pairs] each."""

    buffer: torch.Tensor
    n_src: int
    n_tgt: int
    n_pairs: int
    rows: int
    S: int
    T: int
    masks: bool
    specials: Specials

    def pin_memory(self) -> "PackedBatch":
        """Page-locked (no-op without CUDA)."""
        if not torch.cuda.is_available():
            return self
        return PackedBatch(self.buffer.pin_memory(), *(getattr(self, f.name) for f in fields(self)[1:]))

    def to(self, device: torch.device | str) -> Batch:
        """The padded Batch on `device`: one copy, then a scatter per tensor there (no host read)."""
        device = torch.device(device)
        buf = self.buffer.to(device, non_blocking=self.buffer.is_pinned())
        n, sp = self.n_pairs, self.specials
        src_tok, tgt_tok, sl, tl = buf.split([self.n_src, self.n_tgt, n, n])
        rows = torch.arange(self.rows, device=device)  # [R]
        sl_all = torch.cat([sl, sl.new_zeros(self.rows - n)])  # [R] rows beyond the pairs: EOS alone
        src = self._place(src_tok, sl, self.S, 0, device)
        src[rows, sl_all] = sp.eos
        tgt_in = self._place(tgt_tok, tl, self.T, 1, device)
        tgt_in[:, 0] = sp.start
        tgt_out = self._place(tgt_tok, tl, self.T, 0, device)
        tgt_out[rows[:n], tl] = sp.eos
        return Batch(src=src, src_mask=padding_mask(sl_all + 1, self.S) if self.masks else None, tgt_in=tgt_in,
                     tgt_out=tgt_out, n_src_tokens=self.n_src + n, n_tgt_tokens=self.n_tgt + n)

    def _place(self, tokens: torch.Tensor, lengths: torch.Tensor, width: int, shift: int,
               device: torch.device) -> torch.Tensor:
        """[rows, width] of PAD with row b's tokens (the next lengths[b] of the flat `tokens`) from column
        `shift` on."""
        out = torch.full((self.rows, width), self.specials.pad, dtype=torch.long, device=device)
        total = tokens.numel()
        if total:
            row = torch.repeat_interleave(torch.arange(len(lengths), device=device), lengths, output_size=total)
            start = torch.cumsum(lengths, 0) - lengths  # [B] each row's first flat index
            out[row, torch.arange(total, device=device) - start[row] + shift] = tokens
        return out


def _flat(tokens: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """tokens[starts[b] : starts[b]+lens[b]] for every b, one after another [sum(lens)] int64."""
    if not lens.sum():
        return np.zeros(0, np.int64)
    first = np.repeat(starts.astype(np.int64) - np.concatenate([[0], np.cumsum(lens)[:-1]]), lens)
    return tokens[first + np.arange(int(lens.sum()))].astype(np.int64)


def pack(corpus, indices: np.ndarray, specials: Specials = NMT_SPECIALS, *, pin_memory: bool = False,
         shape: tuple[int, int] | None = None, masks: bool = True) -> PackedBatch:
    """`collate`'s batch as a `PackedBatch` (padded on the device by its `to`); the same arguments."""
    idx = np.asarray(indices, np.int64)
    sl, tl, B, S, T = _sizes(corpus, idx, shape, masks)
    src = _flat(corpus.src_tokens, corpus.src_offsets[idx], sl)
    tgt = _flat(corpus.tgt_tokens, corpus.tgt_offsets[idx], tl)
    buffer = torch.from_numpy(np.concatenate([src, tgt, sl, tl]))
    packed = PackedBatch(buffer, len(src), len(tgt), len(idx), B, S, T, masks, specials)
    return packed.pin_memory() if pin_memory else packed


def iter_batches(corpus, batches: list[np.ndarray], specials: Specials = NMT_SPECIALS, *,
                 pin_memory: bool = False) -> Iterator[Batch]:
    """Collate the given index batches lazily, in order."""
    for b in batches:
        yield collate(corpus, b, specials, pin_memory=pin_memory)
