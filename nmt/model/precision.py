"""Reduced-precision inference for the PyTorch engine: `decode.precision` / `--precision`.

- `fp32`: the model as trained (the reference).
- `bf16`, `fp16`: the forward passes run under `torch.autocast` with that dtype (LayerNorm and
  log-softmax in fp32; the search ranks fp32 log-probabilities). GPU: fp16, and bf16 where
  supported. CPU: bf16 only with native oneDNN bf16 kernels (AVX-512 BF16 / AMX); fp16 is refused.
- `int8`: CPU only. Every `nn.Linear` is replaced at load by an `Int8Linear`: weights quantized per
  output channel, activations per row (so a sentence's output does not depend on its batch), the
  product by `torch._int_mm` (int8 x int8 -> int32), rescaled to fp32; embeddings, LayerNorm,
  attention and log-softmax stay fp32. A torch without `_int_mm` (`int8_available`), or a CPU whose
  int8 products are slower than fp32 (`int8_speedup`, measured at load), gets a one-line error
  pointing to CTranslate2's int8.
- `auto` (the default): fp32 for the PyTorch engine; with CTranslate2, the exported weights' type.

CTranslate2 (nmt/translation/ct2.py) maps the same names onto its `compute_type`, so one flag chooses
the precision for either engine.
"""

from __future__ import annotations

import functools
import time

import torch
from torch import Tensor, nn

from nmt.errors import UserError

AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}
CT2_COMPUTE_TYPES = {"auto": "default", "fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "int8": "int8"}


def resolve(precision: str) -> str:
    """The precision the PyTorch engine runs: "auto" -> "fp32"."""
    return "fp32" if precision == "auto" else precision


def cpu_bf16_native() -> bool:
    """Whether oneDNN runs bf16 natively on this CPU (AVX-512 BF16 or AMX), not emulated."""
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(torch.backends.mkldnn.is_available() and check is not None and check())


def int8_available() -> bool:
    """Whether this torch multiplies int8 matrices on CPU (`torch._int_mm`)."""
    try:
        return torch._int_mm(torch.ones(1, 8, dtype=torch.int8), torch.ones(8, 8, dtype=torch.int8)).dtype == torch.int32
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


@functools.cache
def int8_speedup() -> float:
    """How many times faster this CPU multiplies int8 matrices (`torch._int_mm`) than fp32 ones (`torch.mm`),
    measured once per process on a [256, 512] x [512, 512] product (the best of interleaved runs). Above 1
    where oneDNN has int8 kernels (AVX-512 VNNI, AVX-VNNI, AMX); below 1 on AVX2 alone."""
    g = torch.Generator().manual_seed(0)
    a = torch.randint(-127, 128, (256, 512), dtype=torch.int8, generator=g)
    b = torch.randint(-127, 128, (512, 512), dtype=torch.int8, generator=g)
    af, bf = a.float(), b.float()
    runs = {"fp32": lambda: torch.mm(af, bf), "int8": lambda: torch._int_mm(a, b)}
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(6):  # (the first of each warms up)
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - start)
    return best["fp32"] / max(best["int8"], 1e-9)


def check(precision: str, device: torch.device) -> None:
    """One-line UserError for a precision this device cannot run (or runs slower than fp32)."""
    precision, kind = resolve(precision), device.type
    if precision == "int8" and kind != "cpu":
        raise UserError(f"--precision int8 runs on CPU only (PyTorch's int8 linear kernels are CPU kernels); "
                        f"on {kind} use bf16 or fp16")
    if precision == "int8" and not int8_available():
        raise UserError("--precision int8 needs torch._int_mm on CPU, which this torch build lacks")
    if precision == "int8" and int8_speedup() < 1:
        raise UserError("--precision int8 on this CPU would be slower than fp32 (its int8 matrix products, measured "
                        "at load, are slower than fp32 ones: no AVX-512 VNNI, AVX-VNNI or AMX); use fp32, or export the "
                        "model (nmt export) and translate with --engine ctranslate2 --precision int8")
    if precision == "fp16" and kind == "cpu":
        raise UserError("--precision fp16 is for GPUs (CPUs have no fast fp16 matmul in PyTorch); on CPU use int8 "
                        "or, on a CPU with AVX-512 BF16/AMX, bf16")
    if precision == "bf16" and kind == "cpu" and not cpu_bf16_native():
        raise UserError("--precision bf16 on this CPU would be emulated (no AVX-512 BF16/AMX) and slower than fp32; "
                        "use int8 or fp32")
    if precision == "bf16" and kind == "cuda" and not torch.cuda.is_bf16_supported():
        raise UserError("--precision bf16: this GPU has no bf16 support; use fp16")


class Int8Linear(nn.Module):
    """y = x W^T + b with W quantized per output channel to int8 once (`from_linear`) and x per row at each
    call (s_i = max|x_i| / 127); the product runs in int8 with int32 accumulation (`torch._int_mm`) and
    is rescaled. Per-row scales keep each sentence's result independent of its batch. Inference only."""

    def __init__(self, weight_t: Tensor, scale: Tensor, bias: Tensor | None):
        super().__init__()
        self.register_buffer("weight_t", weight_t)  # [in, out] int8
        self.register_buffer("scale", scale)  # [out] fp32
        self.register_buffer("bias", bias)  # [out] fp32 or None
        self.in_features, self.out_features = weight_t.shape

    @classmethod
    @torch.no_grad()
    def from_linear(cls, linear: nn.Linear) -> "Int8Linear":
        w = linear.weight.detach().float()  # [out, in]
        scale = w.abs().amax(dim=1).clamp_min(1e-12) / 127  # [out], symmetric
        q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
        bias = linear.bias.detach().float().clone() if linear.bias is not None else None
        return cls(q.t().contiguous(), scale, bias)

    def forward(self, x: Tensor) -> Tensor:
        """x [..., in] -> [..., out] (fp32)."""
        shape = x.shape
        x = x.reshape(-1, shape[-1]).float()  # [M, in]
        s = torch.linalg.vector_norm(x, float("inf"), dim=1, keepdim=True).clamp_min_(1e-30).div_(127)  # [M, 1]
        q = torch.div(x, s).round_().to(torch.int8)  # |x / s| <= 127
        y = torch._int_mm(q, self.weight_t).float().mul_(s)  # [M, out]
        y = torch.addcmul(self.bias, y, self.scale) if self.bias is not None else y.mul_(self.scale)
        return y.view(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weights"


def quantize_int8(model: nn.Module) -> int:
    """Replace every `nn.Linear` of `model` (in place) by an `Int8Linear`; returns how many. Parameters
    shared with other modules (a tied output projection's embedding) stay as they are."""
    n = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, Int8Linear.from_linear(child))
                n += 1
    return n


def prepare(model: nn.Module, precision: str) -> torch.dtype | None:
    """Apply `precision` to a loaded inference model (int8: quantize its linear layers, in place);
    returns the autocast dtype its forward passes need (None: fp32 or int8). Call `check` first."""
    precision = resolve(precision)
    if precision == "int8":
        quantize_int8(model)
    return AUTOCAST.get(precision)
