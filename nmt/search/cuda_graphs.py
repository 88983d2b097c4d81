"""Decoding steps as CUDA graphs: the GPU fast path of nmt/search/decoding.py's step protocol.

Eager decoding on a GPU is launch-bound: a step launches a few hundred small kernels.
`GraphedDecoder` records one step of `model.decode_step` over a `StaticDecoderCache`
(nmt/search/cache.py) as a CUDA graph and replays it: one launch per step.

- A graph is recorded the second time a step runs on the same cache buffers (the first runs
  eagerly) and replayed until `reorder` replaces them; rows that leave are compacted and the
  padding rows run too, so a batch records a handful of graphs.
- Only the model's step is recorded; the search (scores, top-k, rules) stays eager. A replayed
  step returns bit for bit the eager step's result (tests/test_gpu.py); on CPU the runner runs
  that eager step (tests/test_cuda_graphs.py).
- Under autocast the weight casts are recorded with the step (autocast's cast cache is off while
  recording).
- Recording uses "thread_local" capture mode; a step that cannot be recorded is decoded eagerly,
  with a warning, for the rest of its batch.

`TorchEngine.load` uses it on CUDA devices; `NMT_CUDA_GRAPHS=0` turns it off (scripts/bench_gpu.py).
"""

from __future__ import annotations

import contextlib
import os
import warnings

import torch
from torch import Tensor

from nmt.search.cache import StaticDecoderCache


def enabled() -> bool:
    """False when the environment variable NMT_CUDA_GRAPHS is 0."""
    return os.environ.get("NMT_CUDA_GRAPHS", "1") != "0"


class GraphedDecoder:
    """nmt/search/decoding.py's decoder protocol (`step`, `reorder`) over a StaticDecoderCache, each step
    replayed from a CUDA graph where the device is CUDA and the model is in eval mode."""

    def __init__(self, model, memory: Tensor, src_mask: Tensor, max_len: int, ops=None):
        self.model = model
        self.cache: StaticDecoderCache = model.init_cache(memory, src_mask, max_len, cache_cls=StaticDecoderCache,
                                                          chunk=0)
        self.use_graphs = memory.is_cuda and not model.training
        self.graph: torch.cuda.CUDAGraph | None = None
        self.graph_of = self.seen = -1  # generation of the cache the graph records / that ran once eagerly
        self.tokens: Tensor | None = None  # [Bcap] the graph's input
        self.logits: Tensor | None = None  # [Bcap,V] its output
        self.stream: torch.cuda.Stream | None = None

    def step(self, tokens: Tensor) -> Tensor:
        """tokens [B] (position t-1) -> logits [B,V] for token t. The result is overwritten by the next step."""
        cache, B = self.cache, tokens.shape[0]
        if self.graph is not None and self.graph_of == cache.generation:
            cache.next_position()  # raises if the cache is full (the graph would write past it)
            self.tokens[:B].copy_(tokens)
            self.graph.replay()
            cache.length += 1  # (the graph advanced `pos` on the device)
            return self.logits[:B]
        if not self.use_graphs or self.seen != cache.generation:
            self.seen = cache.generation
            return self._eager(tokens)
        return self._record(tokens)

    def reorder(self, indices: Tensor, sources: Tensor | None, group: int) -> None:
        """Keep rows `indices` [B'] (beam reordering, expansion, dropping sentences; the layout as for
        nmt/search/decoding.py's decoders)."""
        self.cache.reorder(indices, sources, group)

    def _padded(self, tokens: Tensor) -> Tensor:
        """tokens [B] -> [Bcap]: the padding rows repeat the last token (any id will do)."""
        extra = self.cache.kv.shape[2] - tokens.shape[0]
        return tokens if extra == 0 else torch.cat([tokens, tokens[-1:].expand(extra)])

    def _eager(self, tokens: Tensor) -> Tensor:
        return self.model.decode_step(self._padded(tokens), self.cache)[: tokens.shape[0]]

    def _record(self, tokens: Tensor) -> Tensor:
        """Record the step on the cache's current buffers, then replay it for this step."""
        cache, B = self.cache, tokens.shape[0]
        self.graph = self.logits = None  # the old graph's memory goes back first
        self.tokens = self._padded(tokens).clone()
        if self.stream is None:
            self.stream = torch.cuda.Stream(device=tokens.device)
        graph, length = torch.cuda.CUDAGraph(), cache.length
        self.stream.wait_stream(torch.cuda.current_stream(tokens.device))
        try:
            with torch.cuda.stream(self.stream), _uncached_autocast():
                graph.capture_begin(capture_error_mode="thread_local")  # other threads' CUDA calls may go on
                try:
                    logits = self.model.decode_step(self.tokens, cache)
                finally:
                    cache.length = length  # recording ran nothing: `pos` did not move
                    graph.capture_end()
        except torch.cuda.OutOfMemoryError:
            raise
        except RuntimeError as e:  # a step that cannot be recorded still decodes: eagerly, for this batch
            torch.cuda.current_stream(tokens.device).wait_stream(self.stream)
            self.use_graphs = False
            warnings.warn(f"nmt: decoding without CUDA graphs (recording a step failed: {e})", RuntimeWarning)
            return self._eager(tokens)
        torch.cuda.current_stream(tokens.device).wait_stream(self.stream)
        self.graph, self.graph_of, self.logits = graph, cache.generation, logits
        graph.replay()
        cache.length += 1
        return logits[:B]


def _uncached_autocast() -> contextlib.AbstractContextManager:
    """The ambient CUDA autocast with its cast cache off (no-op without autocast)."""
    if not torch.is_autocast_enabled("cuda"):
        return contextlib.nullcontext()
    return torch.autocast("cuda", dtype=torch.get_autocast_dtype("cuda"), cache_enabled=False)
