"""CPU fast paths, all in one place (on by default; `NMT_CPU_TUNING=0` turns them off); the
reference modules stay plain.

model.py, cache.py and search.py are written like the paper and the search contract
(`nn.Dropout`, `torch.topk`, a cache that gathers into new buffers at every reorder). Each function
here installs a faster version of one of those pieces, computing the same thing
(tests/test_fast.py checks each against the plain path), for CPU runs:

- `tune_malloc(inference)`: raises glibc's mmap and trim thresholds, so freed tensors stay in
  the heap for reuse instead of being unmapped and page-faulted in again every step
  (what jemalloc/tcmalloc, which PyTorch's CPU guides recommend, do by default). Training keeps
  its peak heap; inference keeps only blocks up to 16 MiB (a step's temporaries) and returns the
  rest, so that a translation's peak RSS is what its batches need.
- `install_for_training(model)`: `nn.Dropout` layers become `NumpyDropout`, which
  draws its masks with numpy's PCG64 (seeded by one draw from torch's generator per
  call, so `torch.manual_seed` and checkpointed RNG states still fix every mask)
  instead of torch's per-element `bernoulli_`; same distribution, different stream.
- `install_for_inference(model) -> SearchOps`: the larger `nn.Linear` layers become
  `PackedLinear` (a oneDNN-packed copy of the weight for the few-row matmuls of
  decoding steps; parameters and state_dict unchanged), and the returned SearchOps
  give search a blocked top-k (exact; torch's topk/max scan wide rows slowly on CPU)
  and `ReusingDecoderCache` (beam reordering copies only the rows whose parent
  changed, and gathers into spare buffers instead of allocating new ones).

`nmt train|translate|evaluate|score|tune|serve` call `tune_malloc` at start (nmt/cli.py; on any device:
it is the process's allocator); training and `TorchEngine.load` install the others on CPU; NMT_CPU_TUNING=0 turns all of them off
(A/B benchmarks: BENCHMARKS.md). What changes process-wide: glibc's malloc thresholds (never
restored); the class swaps change only the model objects they are applied to.
"""

from __future__ import annotations

import ctypes
import math
import os
import sys
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.cache import DecoderCache
from nmt.search_options import PLAIN_OPS, SearchOps

M_TRIM_THRESHOLD = -1  # glibc <malloc.h>
M_MMAP_THRESHOLD = -3
_THRESHOLD = 2**31 - 1  # mallopt takes an int: blocks of up to 2 GiB come from the heap
INFERENCE_MMAP = 16 << 20  # inference: blocks above 16 MiB are mapped (and returned when freed)
INFERENCE_TRIM = 64 << 20  # inference: free memory above 64 MiB at the heap's top is returned

_malloc_tuned = False


def enabled() -> bool:
    """False when the environment variable NMT_CPU_TUNING is 0."""
    return os.environ.get("NMT_CPU_TUNING", "1") != "0"


# --------------------------------------------------------------------------- allocator

def tune_malloc(inference: bool = False) -> bool:
    """Raise glibc's mmap and trim thresholds for this process; True if applied (Linux/glibc only).

    Training (inference False): blocks of up to 2 GiB come from the heap and it is never trimmed
    (a step's activations are reused, not page-faulted in again). Inference: blocks of up to
    `INFERENCE_MMAP` (a decoding step's temporaries) come from the heap, larger ones (decoder-cache
    buffers, a batch's encoder activations) are mapped and unmapped as they come and go, and the
    heap keeps at most `INFERENCE_TRIM` free at its top: long-lived buffers of changing sizes no
    longer fragment a heap that never shrinks (peak RSS of `nmt translate`: BENCHMARKS.md)."""
    global _malloc_tuned
    if _malloc_tuned:
        return True
    if not enabled() or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own symbols: libc's, without a library search
    except (OSError, AttributeError):  # musl and other C libraries have no mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    mmap, trim = (INFERENCE_MMAP, INFERENCE_TRIM) if inference else (_THRESHOLD, _THRESHOLD)
    _malloc_tuned = bool(mallopt(M_MMAP_THRESHOLD, mmap)) & bool(mallopt(M_TRIM_THRESHOLD, trim))
    return _malloc_tuned


# --------------------------------------------------------------------------- training: dropout

def dropout_multiplier(shape: torch.Size, p: float, dtype: torch.dtype) -> Tensor:
    """Tensor of `shape`: 1/(1-p) (kept, probability 1 - p to within 2^-32) or 0 (dropped), entries
    independent; seeded from torch's default generator. Built by numpy in one pass: multiplying by it
    costs one pass forward and one backward (a bool mask costs a conversion each time)."""
    n = math.prod(shape)
    seed = int(torch.randint(0, 2**63 - 1, (), dtype=torch.int64))
    raw = np.random.PCG64(seed).random_raw((n + 1) // 2).view(np.uint32)[:n]  # two 32-bit draws per 64-bit word
    mult = np.multiply(raw >= round(p * 2**32), np.float32(1.0 / (1.0 - p)), dtype=np.float32)
    return torch.from_numpy(mult).view(shape).to(dtype)


class _MultiplyByMask(torch.autograd.Function):
    """x * m with m = 0 or 1/(1-p) per entry (as F.dropout, which also saves a float mask)."""

    @staticmethod
    def forward(ctx, x: Tensor, p: float) -> Tensor:
        mult = dropout_multiplier(x.shape, p, x.dtype)
        ctx.save_for_backward(mult)
        return x * mult

    @staticmethod
    def backward(ctx, grad: Tensor):
        (mult,) = ctx.saved_tensors
        return grad * mult, None


class NumpyDropout(nn.Dropout):
    """`nn.Dropout` whose CPU masks come from numpy (see the module docstring)."""

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.device.type != "cpu" or self.p == 1.0 or self.inplace:
            return super().forward(x)
        return _MultiplyByMask.apply(x, self.p)


def install_for_training(model: nn.Module) -> int:
    """Turn the `nn.Dropout` layers of `model` into `NumpyDropout`; returns how many."""
    if not enabled():
        return 0
    n = 0
    for module in model.modules():
        if type(module) is nn.Dropout:
            module.__class__ = NumpyDropout
            n += 1
    return n


# --------------------------------------------------------------------------- inference: packed weights

# Private oneDNN ops (torch.ops.mkldnn): they can vanish or change in a torch upgrade, so they are
# looked up once here; without both, `pack_linear_weights` packs nothing and inference runs the
# plain F.linear path (tests/test_fast.py checks both the ops on the installed torch and the fallback).
PRIVATE_OPS = ("_linear_pointwise", "_reorder_linear_weight")


def _mkldnn_ops() -> tuple | None:
    """(linear_pointwise, reorder_linear_weight), or None when this torch lacks oneDNN or either op."""
    if not torch.backends.mkldnn.is_available():
        return None
    ops = tuple(getattr(torch.ops.mkldnn, name, None) for name in PRIVATE_OPS)
    return ops if all(op is not None for op in ops) else None


_MKLDNN = _mkldnn_ops()


class PackedLinear(nn.Linear):
    """An `nn.Linear` that also holds a oneDNN-packed copy of its weight (`_packed_weight`) and uses it
    for eval-mode fp32 CPU inputs of MIN_PACKED_ROWS.._max_rows rows; otherwise it is `nn.Linear`."""

    _packed_weight: Tensor
    _max_rows: int

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        rows = x.numel() // shape[-1] if shape else 0
        if not (MIN_PACKED_ROWS <= rows <= self._max_rows and not self.training and x.is_cpu and x.dtype == torch.float32
                and not (torch.is_grad_enabled() and self.weight.requires_grad)):
            return F.linear(x, self.weight, self.bias)
        linear_pointwise = _MKLDNN[0]
        if len(shape) == 2:  # a decoding step's [rows, D]
            return linear_pointwise(x, self._packed_weight, self.bias, "none", [], "")
        y = linear_pointwise(x.reshape(rows, shape[-1]), self._packed_weight, self.bias, "none", [], "")
        return y.view(*shape[:-1], y.shape[-1])


ROWS_HINT = 32  # the batch rows oneDNN packs the weights for (decoding steps run tens to hundreds of rows)
MIN_PACKED_ROWS = 4  # below, MKL's F.linear is faster (one sentence's greedy steps: 1 row; BENCHMARKS.md)


def pack_linear_weights(model: nn.Module, max_rows: int = 256, min_weight: int = 100_000) -> int:
    """Turn every fp32 CPU `nn.Linear` of `model` with at least `min_weight` weights into a `PackedLinear`,
    used for inputs of at most `max_rows` rows in eval mode. Returns how many layers were packed (0 without
    oneDNN). Smaller layers keep `F.linear`: a oneDNN call costs more per call than MKL's, which a small
    matmul does not win back. Call again after changing the weights (the packed copies are snapshots)."""
    if not enabled() or _MKLDNN is None:
        return 0
    reorder_linear_weight = _MKLDNN[1]
    n = 0
    with torch.no_grad():
        for module in model.modules():
            if not isinstance(module, nn.Linear) or module.weight.device.type != "cpu" \
                    or module.weight.dtype != torch.float32 or module.weight.numel() < min_weight:
                continue
            try:
                packed = reorder_linear_weight(module.weight.detach(), ROWS_HINT)
            except RuntimeError:
                return n
            module.__class__ = PackedLinear
            module._packed_weight, module._max_rows = packed, max_rows
            n += 1
    return n


# --------------------------------------------------------------------------- inference: search

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
    """DecoderCache whose `reorder` avoids allocations and most copies.

    When at most half of the rows change (beam search: most beams keep their own parent
    row), only the changed rows are copied, in place (their parents' filled positions are
    gathered first, then written). Otherwise each buffer's rows are gathered into one spare
    buffer, which takes that buffer's place, and the buffer it replaces becomes the spare for
    the next one: one buffer of extra memory, none allocated after the first. Fewer rows
    (finished sentences leaving) are gathered into the first rows of the spare (a view), so
    a shrinking batch reuses its memory; more rows (expanding sentences to beams) allocate.
    Growing (`grow`) drops the spare.
    """

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
    return FAST_OPS if enabled() and device.type == "cpu" else PLAIN_OPS


def install_for_inference(model: nn.Module) -> SearchOps:
    """Pack the model's larger linear layers (CPU) and return the fast SearchOps (plain ones when
    NMT_CPU_TUNING=0)."""
    if not enabled():
        return PLAIN_OPS
    pack_linear_weights(model)
    return FAST_OPS
