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

    src [B,S], src_mask [B,S] (True = real token), tgt_in [B,T], tgt_out [B,T];
    n_src_tokens / n_tgt_tokens: real positions (n_tgt_tokens = positions in the loss).
    """

    src: torch.Tensor
    src_mask: torch.Tensor
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


def collate(corpus, indices: np.ndarray, specials: Specials = NMT_SPECIALS, *, pin_memory: bool = False) -> Batch:
    """The Batch of the given pair indices of an `nmt.data.corpus.EncodedCorpus`. pin_memory: page-locked
    tensors (for a CUDA device: `Batch.to` then copies asynchronously)."""
    idx = np.asarray(indices, np.int64)
    rows = np.arange(len(idx))
    sl, tl = corpus.src_lens[idx].astype(np.int64), corpus.tgt_lens[idx].astype(np.int64)  # [B]
    S, T = int(sl.max()) + 1, int(tl.max()) + 1
    src = _pad_rows(corpus.src_tokens, corpus.src_offsets[idx], sl, S, 0, specials.pad)
    src[rows, sl] = specials.eos
    tgt_in = _pad_rows(corpus.tgt_tokens, corpus.tgt_offsets[idx], tl, T, 1, specials.pad)
    tgt_in[:, 0] = specials.start
    tgt_out = _pad_rows(corpus.tgt_tokens, corpus.tgt_offsets[idx], tl, T, 0, specials.pad)
    tgt_out[rows, tl] = specials.eos
    batch = Batch(src=torch.from_numpy(src), src_mask=padding_mask(torch.from_numpy(sl + 1), S),
                  tgt_in=torch.from_numpy(tgt_in), tgt_out=torch.from_numpy(tgt_out),
                  n_src_tokens=int(sl.sum()) + len(idx), n_tgt_tokens=int(tl.sum()) + len(idx))
    return batch.pin_memory() if pin_memory else batch


def iter_batches(corpus, batches: list[np.ndarray], specials: Specials = NMT_SPECIALS, *,
                 pin_memory: bool = False) -> Iterator[Batch]:
    """Collate the given index batches lazily, in order."""
    for b in batches:
        yield collate(corpus, b, specials, pin_memory=pin_memory)
