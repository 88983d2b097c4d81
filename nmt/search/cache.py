"""DecoderCache: what step-by-step decoding keeps between steps.

Shapes: B rows (sentences x beams), N distinct source sentences, H heads, Tmax = max_len,
S source length, Dh head dim.

- Self-attention K/V, per layer `[B,H,C,Dh]`, one position filled per step; the capacity C grows by
  `chunk` positions (`GROW_CHUNK`) up to Tmax as steps need it (`chunk=0`: all at once).
- Cross-attention K/V, per layer `[N,H,S,Dh]`, computed once from the encoder output and stored once
  per source sentence: its `group` beam rows attend together to one copy, so beam reordering never
  copies them.
- `src_mask [N,S]` (True = token) and its attention form `cross_mask [N,1,1,S]`.

The cache owns its buffers: a step calls `append(layer, k, v)` (which returns the filled views),
`cross(layer)` and, after the last layer, `advance()`; the search calls `reorder(indices)`. The model's
attention goes through `parts()`: one part, the whole cache; a `JoinedCache` (the steps of several searches
run as one batch: nmt/search/joining.py) has one part per search.
nmt/search/fast.py's `ReusingDecoderCache` reorders without allocating; same contents.

`StaticDecoderCache` is the form a CUDA graph can replay (nmt/search/cuda_graphs.py): buffers of full
size that never move, a device-side position the step advances, attention over all Tmax positions
under `self_mask`; rows that leave are compacted into the first rows in place.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch
from torch import Tensor

from nmt.masks import attention_mask

GROW_CHUNK = 16  # positions a cache's self-attention buffers grow by


@dataclass
class DecoderCache:
    self_k: list[Tensor]  # per layer [B,H,C,Dh], C = capacity <= max_len
    self_v: list[Tensor]  # per layer [B,H,C,Dh]
    cross_k: list[Tensor]  # per layer [N,H,S,Dh]
    cross_v: list[Tensor]  # per layer [N,H,S,Dh]
    src_mask: Tensor  # [N,S] True = token
    length: int = 0  # positions filled so far
    group: int = 1  # rows per source sentence: B = N * group
    limit: int | None = None  # Tmax, the most positions it may hold; None = its capacity
    chunk: int = GROW_CHUNK  # positions added when full (0: never grows)
    cross_mask: Tensor = field(init=False, repr=False)  # [N,1,1,S], for SDPA

    def __post_init__(self) -> None:
        self.cross_mask = attention_mask(self.src_mask)
        n_src = self.src_mask.shape[0]
        if self.batch_size != n_src * self.group:
            raise ValueError(f"cache has {self.batch_size} rows but {n_src} sources x group {self.group}")

    @classmethod
    def create(cls, cross_k: list[Tensor], cross_v: list[Tensor], src_mask: Tensor, max_len: int,
               chunk: int = GROW_CHUNK) -> DecoderCache:
        """An empty cache for B = N rows and up to max_len positions; self K/V buffers like cross_k[0],
        allocated `chunk` positions at a time (chunk 0: all max_len now)."""
        N, H, _, Dh = cross_k[0].shape
        capacity = min(max_len, chunk) if chunk > 0 else max_len
        new = lambda: cross_k[0].new_empty((N, H, capacity, Dh))
        return cls([new() for _ in cross_k], [new() for _ in cross_k], cross_k, cross_v, src_mask,
                   limit=max_len, chunk=chunk)

    @property
    def batch_size(self) -> int:
        """B, the number of rows being decoded."""
        return self.self_k[0].shape[0]

    @property
    def max_len(self) -> int:
        """Tmax, the number of positions the cache can hold."""
        return self.limit if self.limit is not None else self.capacity

    @property
    def capacity(self) -> int:
        """C, the positions its buffers hold now (grows up to max_len)."""
        return self.self_k[0].shape[2]

    def parts(self) -> tuple[tuple[slice, DecoderCache], ...]:
        """(rows of the step, the cache they attend with): this cache for all of them (`JoinedCache`: one part
        per search)."""
        return ((slice(None), self),)

    def next_position(self) -> int:
        """The position the next decode step writes; raises if the cache is full."""
        if self.length >= self.max_len:
            raise ValueError(f"decoder cache is full: it holds max_len={self.max_len} positions "
                             f"(pass a larger max_len to init_cache)")
        return self.length

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write this step's self-attention keys/values k, v [B,H,Dh] of `layer` at position
        `length`; returns that layer's filled keys and values [B,H,length+1,Dh] (views)."""
        pos = self.length
        if pos >= self.capacity:
            self.grow()
        k_buf, v_buf = self.self_k[layer], self.self_v[layer]
        k_buf[:, :, pos] = k
        v_buf[:, :, pos] = v
        return k_buf[:, :, : pos + 1], v_buf[:, :, : pos + 1]

    def grow(self) -> None:
        """Add `chunk` positions (at most up to max_len) to every self-attention buffer, keeping the
        filled ones; one buffer at a time, so the old one is freed before the next is allocated."""
        capacity = min(self.capacity + max(self.chunk, 1), self.max_len)
        if capacity <= self.capacity:
            raise ValueError(f"decoder cache is full: it holds max_len={self.max_len} positions")
        L = self.length
        for bufs in (self.self_k, self.self_v):
            for i, old in enumerate(bufs):
                new = old.new_empty(old.shape[:2] + (capacity,) + old.shape[3:])
                new[:, :, :L] = old[:, :, :L]
                bufs[i] = new

    def advance(self) -> None:
        """The step is complete in every layer: the next one writes the following position."""
        self.length += 1

    def self_mask(self) -> Tensor | None:
        """The mask of the keys `append` returns (None: all of them are filled positions)."""
        return None

    def position_vectors(self, table: Tensor) -> Tensor:
        """The rows [1,D] of a position table for the position the next step writes."""
        return table[self.length : self.length + 1]

    def cross(self, layer: int) -> tuple[Tensor, Tensor, Tensor]:
        """Cross-attention keys, values [N,H,S,Dh] of `layer` and their mask [N,1,1,S]; the
        `group` rows of a source sentence share its entry."""
        return self.cross_k[layer], self.cross_v[layer], self.cross_mask

    def reorder(self, indices: Tensor, sources: Tensor | None = None, group: int | None = None) -> None:
        """Row i becomes row indices[i] of the old rows. indices [B'] (long, any B').

        Self-attention K/V are gathered into new buffers. Cross-attention K/V: the searches give their
        layout (no host read): runs of `group` rows of one source, `sources` [N'] the old sources kept (None:
        the same, no copy). group None: found from `indices` (a host read): one copy per run of equal
        length, else one per row."""
        indices = indices.to(device=self.src_mask.device, dtype=torch.long)
        if group is None:
            found, group = source_groups((indices // self.group).tolist())
            if found != list(range(self.src_mask.shape[0])):
                sources = torch.tensor(found, dtype=torch.long, device=indices.device)
        self._reorder_self(indices)
        if sources is not None:
            self.cross_k = [t.index_select(0, sources) for t in self.cross_k]
            self.cross_v = [t.index_select(0, sources) for t in self.cross_v]
            self.src_mask = self.src_mask.index_select(0, sources)
            self.cross_mask = attention_mask(self.src_mask)
        self.group = group

    def _reorder_self(self, indices: Tensor) -> None:
        """Self-attention K/V rows <- rows `indices` (filled positions only)."""
        L = self.length

        def select(buf: Tensor) -> Tensor:
            out = buf.new_empty((indices.shape[0],) + buf.shape[1:])
            if L:
                torch.index_select(buf[:, :, :L], 0, indices, out=out[:, :, :L])
            return out
        self.self_k = [select(t) for t in self.self_k]
        self.self_v = [select(t) for t in self.self_v]


def source_groups(row_sources: list[int]) -> tuple[list[int], int]:
    """Per-row source ids -> (one source id per run, run length) when the rows form
    consecutive runs of one equal length; else (row_sources, 1).

    [0,0,1,1,4,4] -> ([0,1,4], 2); [0,0,1] -> ([0,0,1], 1).
    """
    starts = [i for i, s in enumerate(row_sources) if i == 0 or row_sources[i - 1] != s]
    if not starts:
        return [], 1
    group = len(row_sources) // len(starts)
    if all(start == i * group for i, start in enumerate(starts)) and group * len(starts) == len(row_sources):
        return [row_sources[i] for i in starts], group
    return row_sources, 1


class StaticDecoderCache(DecoderCache):
    """A DecoderCache whose buffers never move, for CUDA graphs (module docstring): self-attention K/V in
    one buffer `kv` [2,layers,Bcap,H,Tmax,Dh], cross-attention K/V in `ckv` [2,layers,Ncap,H,S,Dh], and
    `pos` [1] (on the device) the position the next step writes. A step runs on all Bcap rows, `rows` of
    them the batch. `reorder` compacts the kept rows in place while the group stays and more than half
    of the rows stay; else it allocates buffers of the new size and `generation` changes (old graphs are
    stale). For nmt/search/cuda_graphs.py's GraphedDecoder, which pads its tokens, not for `SearchOps.cache_cls`."""

    kv: Tensor
    ckv: Tensor
    pos: Tensor
    rows: int
    generation: int = 0

    @classmethod
    def create(cls, cross_k: list[Tensor], cross_v: list[Tensor], src_mask: Tensor, max_len: int,
               chunk: int = 0) -> StaticDecoderCache:
        """An empty cache of B = N rows holding max_len positions (`chunk` is ignored: it never grows)."""
        ckv = torch.stack([torch.stack(cross_k), torch.stack(cross_v)])  # [2,layers,N,H,S,Dh]
        N, H, _, Dh = cross_k[0].shape
        kv = ckv.new_zeros((2, len(cross_k), N, H, max_len, Dh))
        return cls._over(kv, ckv, src_mask.clone(), group=1, length=0, pos=None, generation=0)  # (compacted in place)

    @classmethod
    def _over(cls, kv: Tensor, ckv: Tensor, src_mask: Tensor, *, group: int, length: int, pos: Tensor | None,
              generation: int) -> StaticDecoderCache:
        layers = range(kv.shape[1])
        cache = cls([kv[0, i] for i in layers], [kv[1, i] for i in layers], [ckv[0, i] for i in layers],
                    [ckv[1, i] for i in layers], src_mask, length=length, group=group, limit=kv.shape[4], chunk=0)
        cache.kv, cache.ckv, cache.rows, cache.generation = kv, ckv, kv.shape[2], generation
        cache.pos = pos if pos is not None else torch.full((1,), length, dtype=torch.long, device=kv.device)
        cache.key_positions = torch.arange(kv.shape[4], device=kv.device)  # [Tmax]
        return cache

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write k, v [Bcap,H,Dh] at position `pos`; returns all Tmax positions (mask: `self_mask`)."""
        self.self_k[layer].index_copy_(2, self.pos, k[:, :, None])
        self.self_v[layer].index_copy_(2, self.pos, v[:, :, None])
        return self.self_k[layer], self.self_v[layer]

    def self_mask(self) -> Tensor:
        """[1,1,1,Tmax] True at the filled positions 0 .. pos."""
        return (self.key_positions <= self.pos).view(1, 1, 1, -1)

    def position_vectors(self, table: Tensor) -> Tensor:
        return table.index_select(0, self.pos)

    def advance(self) -> None:
        self.pos.add_(1)
        self.length += 1

    def reorder(self, indices: Tensor, sources: Tensor | None = None, group: int | None = None) -> None:
        """Row i becomes row indices[i] of the batch's rows (see the class docstring for where;
        sources and group as for `DecoderCache.reorder`)."""
        indices = indices.to(device=self.src_mask.device, dtype=torch.long)
        if group is None:
            found, group = source_groups((indices // self.group).tolist())
            if found != list(range(self.rows // self.group)):
                sources = torch.tensor(found, dtype=torch.long, device=indices.device)
        rows, capacity, L = indices.shape[0], self.kv.shape[2], self.length
        n_src = rows // group
        if group == self.group and rows <= capacity and 2 * rows > capacity:  # in place
            if L:
                self.kv[:, :, :rows, :, :L] = self.kv[:, :, :, :, :L].index_select(2, indices)
            if sources is not None:
                self.ckv[:, :, :n_src] = self.ckv.index_select(2, sources)
                self.src_mask[:n_src] = self.src_mask.index_select(0, sources)  # (cross_mask is a view of it)
            self.rows = rows
            return
        kv = self.kv.new_zeros(self.kv.shape[:2] + (rows,) + self.kv.shape[3:])
        if L:
            kv[:, :, :, :, :L] = self.kv[:, :, :, :, :L].index_select(2, indices)
        if sources is None:
            sources = torch.arange(n_src, device=indices.device)
        new = type(self)._over(kv, self.ckv.index_select(2, sources), self.src_mask.index_select(0, sources),
                               group=group, length=L, pos=self.pos, generation=self.generation + 1)
        self.__dict__.update(new.__dict__)


class JoinedCache:
    """The caches of several searches whose decoding step runs as one batch (nmt/search/joining.py): the
    step's rows are theirs one search after the other, `sizes` rows each. The model runs its projections,
    feed-forward layers and output layer over all the rows at once, and the attention part by part, each
    search's rows with its own cache (its positions, sources and group): each search's rows see what they
    would alone."""

    def __init__(self, caches: list[DecoderCache], sizes: list[int]):
        self.caches = caches
        ends = list(itertools.accumulate(sizes))
        self._parts = tuple((slice(end - n, end), c) for end, n, c in zip(ends, sizes, caches))

    def parts(self) -> tuple[tuple[slice, DecoderCache], ...]:
        return self._parts

    def next_position(self) -> int:
        """The furthest position the step writes (each cache raises if it is full)."""
        return max(c.next_position() for c in self.caches)

    def position_vectors(self, table: Tensor) -> Tensor:
        """[B,D]: each part's rows get its cache's position."""
        return torch.cat([c.position_vectors(table).expand(rows.stop - rows.start, -1) for rows, c in self._parts])

    def advance(self) -> None:
        for c in self.caches:
            c.advance()
