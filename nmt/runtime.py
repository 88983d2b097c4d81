"""CPU runtime tuning: the C allocator, and oneDNN-packed weights for inference.

Both are measured wins on CPU (BENCHMARKS.md, "CPU runtime tuning") and both
are no-ops where they do not apply (not glibc, not CPU, no oneDNN):

- `tune_malloc()`: glibc serves every allocation above a dynamic threshold
  (at most 32 MB) with a fresh mmap and returns freed memory to the OS, so a
  training step that allocates a 130 MB logits tensor page-faults and zeroes
  it again every step, and decoding pays the same on its per-step buffers.
  Raising the mmap and trim thresholds keeps freed memory in the heap for
  reuse (what jemalloc/tcmalloc, which PyTorch's CPU guides recommend, do by
  default). Cost: the process keeps its peak heap instead of shrinking.
- `pack_linear_weights(model)`: on CPU, `nn.Linear` calls MKL's sgemm, which
  is slow for the few-row matmuls of step-by-step decoding on this AMD CPU
  (32-160 rows; the 8k-vocabulary output projection runs about 2x faster
  through oneDNN with a pre-packed weight). The packed weight is an extra,
  unsaved copy; the module's parameters and state_dict are unchanged. Layers
  fall back to `F.linear` for large inputs (encoder batches, > `max_rows`
  rows, where MKL is as fast or faster), in training mode, and off CPU/fp32.

Set the environment variable NMT_CPU_TUNING=0 to turn both off (for A/B benchmarks).
"""

from __future__ import annotations

import ctypes
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

M_TRIM_THRESHOLD = -1  # glibc <malloc.h>
M_MMAP_THRESHOLD = -3
_THRESHOLD = 2**31 - 1  # mallopt takes an int: blocks of up to 2 GiB come from the heap

_malloc_tuned = False


def enabled() -> bool:
    """False when the environment variable NMT_CPU_TUNING is 0."""
    return os.environ.get("NMT_CPU_TUNING", "1") != "0"


def tune_malloc() -> bool:
    """Raise glibc's mmap and trim thresholds for this process; True if applied (Linux/glibc only)."""
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
    _malloc_tuned = bool(mallopt(M_MMAP_THRESHOLD, _THRESHOLD)) & bool(mallopt(M_TRIM_THRESHOLD, _THRESHOLD))
    return _malloc_tuned


_linear_pointwise = getattr(torch.ops.mkldnn, "_linear_pointwise", None) if torch.backends.mkldnn.is_available() else None


class PackedLinear(nn.Linear):
    """An `nn.Linear` that also holds a oneDNN-packed copy of its weight (`_packed_weight`) and uses it
    for eval-mode fp32 CPU inputs of 1.._max_rows rows; otherwise it is `nn.Linear`. Made by
    `pack_linear_weights`, which switches existing layers to this class (parameters untouched)."""

    _packed_weight: torch.Tensor
    _max_rows: int

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        rows = x.numel() // shape[-1] if shape else 0
        if not (0 < rows <= self._max_rows and not self.training and x.is_cpu and x.dtype == torch.float32
                and not (torch.is_grad_enabled() and self.weight.requires_grad)):
            return F.linear(x, self.weight, self.bias)
        if len(shape) == 2:  # a decoding step's [rows, D]
            return _linear_pointwise(x, self._packed_weight, self.bias, "none", [], "")
        y = _linear_pointwise(x.reshape(rows, shape[-1]), self._packed_weight, self.bias, "none", [], "")
        return y.view(*shape[:-1], y.shape[-1])


def pack_linear_weights(model: nn.Module, max_rows: int = 256, rows_hint: int = 32, min_weight: int = 100_000) -> int:
    """Turn every fp32 `nn.Linear` of `model` (on CPU) with at least `min_weight` weights into a
    `PackedLinear`, used for inputs of at most `max_rows` rows in eval mode. Returns how many layers
    were packed (0 when oneDNN is unavailable). Smaller layers keep `F.linear`: a oneDNN call costs
    about 30 us more than MKL's, which a 256x256 matmul of 32 rows does not win back (measured).
    Call again after changing the weights (the packed copies are snapshots)."""
    if not enabled() or _linear_pointwise is None:
        return 0
    n = 0
    with torch.no_grad():
        for module in model.modules():
            if not isinstance(module, nn.Linear) or module.weight.device.type != "cpu" \
                    or module.weight.dtype != torch.float32 or module.weight.numel() < min_weight:
                continue
            try:
                packed = torch.ops.mkldnn._reorder_linear_weight(module.weight.detach(), rows_hint)
            except RuntimeError:
                return n
            module.__class__ = PackedLinear
            module._packed_weight, module._max_rows = packed, max_rows
            n += 1
    return n
