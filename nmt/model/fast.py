"""The model's CPU fast paths (on by default; `NMT_CPU_TUNING=0` turns them off: nmt/device.py
`cpu_tuning`); nmt/model/transformer.py stays written like the paper. Each computes what the plain
piece computes (tests/test_fast.py):

- `install_for_training(model)`: `nn.Dropout` layers become `NumpyDropout`, drawing masks with numpy's
  PCG64 seeded from torch's generator (so `torch.manual_seed` still fixes every mask); same
  distribution, different stream.
- `pack_linear_weights(model)`: the larger `nn.Linear` layers become `PackedLinear` (a oneDNN-packed
  weight for decoding's few-row matmuls; parameters and state_dict unchanged).
The class swaps change only the model objects they are applied to.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.device import cpu_tuning


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
    if not cpu_tuning():
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
    if not cpu_tuning() or _MKLDNN is None:
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


