"""The search's CPU fast paths (on by default; `NMT_CPU_TUNING=0` turns them off: nmt/device.py
`cpu_tuning`): a blocked top-k (exact; torch's topk and max scan wide rows slowly on CPU) and
`ReusingDecoderCache` (beam reordering copies only the rows whose parent changed, into spare buffers
instead of new ones). `FAST_OPS` hands both to the search; tests/test_fast.py checks each against the
plain path (`PLAIN_OPS`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from nmt.device import cpu_tuning
from nmt.search.cache import DecoderCache
from nmt.search.options import PLAIN_OPS, SearchOps


def _block_size(C: int, K: int) -> int:
    """Block width for `blocked_topk` on C columns: one of 64, 32, 16 dividing C with at least 4K
    blocks, or 0 (small or odd widths: plain topk)."""
    for c in (64, 32, 16):
        if C % c == 0 and C // c >= 4 * K:
            return c
    return 0


def blocked_topk(cand: Tensor, K: int) -> tuple[Tensor, Tensor]:
    """torch.topk(cand [N, C], K, dim=1) through per-block maxima: each of the top K values lies in
    one of the K blocks with the largest maxima (a block outside them has K blocks above it, hence K
    larger values), so only K*c values need ranking. Exact (the same values and indices as topk)."""
    N, C = cand.shape
    c = _block_size(C, K)
    if not c:
        return cand.topk(K, dim=1)
    blocks = cand.view(N, C // c, c)
    _, best_blocks = blocks.amax(dim=2).topk(K, dim=1)  # [N, K]
    sel = blocks.gather(1, best_blocks[:, :, None].expand(-1, -1, c)).view(N, K * c)  # [N, K*c]
    top, j = sel.topk(K, dim=1)
    return top, best_blocks.gather(1, j // c) * c + j % c


def blocked_argmax(x: Tensor) -> tuple[Tensor, Tensor]:
    """x.max(dim=1) of x [N, C] through `blocked_topk`."""
    if not _block_size(x.shape[1], 1):
        return x.max(dim=1)
    top, idx = blocked_topk(x, 1)
    return top.squeeze(1), idx.squeeze(1)


@dataclass
class ReusingDecoderCache(DecoderCache):
    """DecoderCache whose `reorder` avoids allocations and most copies: when at most half of the rows
    change (beam search), only those are copied, in place; otherwise each buffer's rows are gathered into
    one spare buffer, which takes its place and leaves the old one as the next spare. Fewer rows reuse the
    spare's first rows (a view); more rows allocate. Growing (`grow`) drops the spare."""

    spare: Tensor | None = field(default=None, repr=False)  # a free buffer: >= B rows, shaped like self_k[0]

    def grow(self) -> None:
        self.spare = None  # freed before the larger buffers are allocated
        super().grow()

    def _reorder_self(self, indices: Tensor) -> None:
        L, n_layers, rows = self.length, len(self.self_k), indices.shape[0]
        current = self.self_k + self.self_v
        if rows == self.batch_size:
            changed = (indices != torch.arange(rows, device=indices.device)).nonzero().squeeze(1)
            if 2 * changed.shape[0] <= rows:
                if L and changed.shape[0]:
                    parents = indices.index_select(0, changed)
                    for buf in current:
                        filled = buf[:, :, :L]
                        filled.index_copy_(0, changed, filled.index_select(0, parents))
                return
        if rows > self.batch_size:  # more rows: new buffers, the old ones freed
            self.spare = None
            out = [t.new_empty((rows,) + t.shape[1:]) for t in current]
            if L:
                for src, dst in zip(current, out):
                    torch.index_select(src[:, :, :L], 0, indices, out=dst[:, :, :L])
        else:
            spare = self.spare if self.spare is not None else current[0].new_empty((rows,) + current[0].shape[1:])
            out = []
            for src in current:  # only the filled positions are copied
                dst = spare[:rows]
                if L:
                    torch.index_select(src[:, :, :L], 0, indices, out=dst[:, :, :L])
                out.append(dst)
                spare = src
            self.spare = spare
        self.self_k, self.self_v = out[:n_layers], out[n_layers:]


FAST_OPS = SearchOps(topk=blocked_topk, argmax=blocked_argmax, cache_cls=ReusingDecoderCache)


def search_ops(device: torch.device) -> SearchOps:
    """The fast SearchOps on CPU (plain elsewhere, or with NMT_CPU_TUNING=0): for searching a model
    whose weights keep changing (validation during training), without packing them."""
    return FAST_OPS if cpu_tuning() and device.type == "cpu" else PLAIN_OPS
