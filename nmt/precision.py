"""Reduced-precision inference for the PyTorch engine: `decode.precision` / `--precision`.

- `fp32`: the model as trained (the reference every other precision is measured against).
- `bf16`, `fp16`: the forward passes run under `torch.autocast` with that dtype (matmuls and
  attention in 16 bits, LayerNorm and log-softmax in fp32; the search still ranks fp32
  log-probabilities). On a GPU: fp16 everywhere, bf16 where the GPU supports it. On a CPU: bf16
  only where oneDNN has native bf16 kernels (AVX-512 BF16 / AMX; elsewhere it is emulated and
  slower than fp32); fp16 is refused on CPU.
- `int8`: CPU only. Every `nn.Linear` of the model (encoder, decoder, output projection) is
  replaced once, when the model loads, by an `Int8Linear`: its weight quantized per output channel
  to int8 (symmetric) and packed for PyTorch's own dynamic-quantization kernel,
  `torch.ops.quantized.linear_dynamic` (FBGEMM on x86, the `x86`/`fbgemm` quantized engine; QNNPACK
  on ARM), which quantizes each call's activations to uint8 with a per-call scale, multiplies in
  int8 with int32 accumulation and returns fp32. Embeddings, LayerNorm, attention and the
  log-softmax stay fp32. This is the kernel behind `torch.ao.nn.quantized.dynamic.Linear`; the
  `torch.ao.quantization` eager flows (`quantize_dynamic`) that used to apply it are deprecated
  ("please migrate to torchao", PyTorch 2.13 docs, Quantization page; torchao is not a
  dependency here), so nmt calls the kernel directly. Creating the packed weight still goes
  through a per-channel quantized tensor, whose creation functions torch 2.13 marks deprecated
  (pytorch/pytorch#184982): the warning is silenced at that one call, and a torch without the ops
  gets a one-line error (`int8_available`).
- `auto` (the default): fp32 for the PyTorch engine; with CTranslate2, the exported weights' type.

CTranslate2 (nmt/ct2.py) maps the same names onto its `compute_type` (`float32`, `bfloat16`,
`float16`, `int8`), so one flag chooses the precision for either engine.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor, nn

from nmt.errors import UserError

PRECISIONS = ("auto", "fp32", "bf16", "fp16", "int8")
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
    """Whether this torch has the dynamic int8 linear kernel and a quantized engine for this CPU."""
    ops = getattr(torch.ops, "quantized", None)
    return (ops is not None and hasattr(ops, "linear_dynamic") and hasattr(ops, "linear_prepack")
            and any(e != "none" for e in torch.backends.quantized.supported_engines))


def check(precision: str, device: torch.device) -> None:
    """One-line UserError for a precision this device cannot run (or runs slower than fp32)."""
    precision, kind = resolve(precision), device.type
    if precision == "int8" and kind != "cpu":
        raise UserError(f"--precision int8 runs on CPU only (PyTorch's int8 linear kernels are CPU kernels); "
                        f"on {kind} use bf16 or fp16")
    if precision == "int8" and not int8_available():
        raise UserError("--precision int8 needs torch.ops.quantized.linear_dynamic, which this torch build lacks")
    if precision == "fp16" and kind == "cpu":
        raise UserError("--precision fp16 is for GPUs (CPUs have no fast fp16 matmul in PyTorch); on CPU use int8 "
                        "or, on a CPU with AVX-512 BF16/AMX, bf16")
    if precision == "bf16" and kind == "cpu" and not cpu_bf16_native():
        raise UserError("--precision bf16 on this CPU would be emulated (no AVX-512 BF16/AMX) and slower than fp32; "
                        "use int8 or fp32")
    if precision == "bf16" and kind == "cuda" and not torch.cuda.is_bf16_supported():
        raise UserError("--precision bf16: this GPU has no bf16 support; use fp16")


class Int8Linear(nn.Module):
    """y = x W^T + b with W quantized per output channel to int8 once (`from_linear`) and x quantized
    per call (torch.ops.quantized.linear_dynamic); fp32 in, fp32 out. Inference only."""

    def __init__(self, packed, in_features: int, out_features: int, reduce_range: bool):
        super().__init__()
        self._packed, self.reduce_range = packed, reduce_range
        self.in_features, self.out_features = in_features, out_features

    @classmethod
    @torch.no_grad()
    def from_linear(cls, linear: nn.Linear, reduce_range: bool) -> Int8Linear:
        w = linear.weight.detach().float()
        scale = (w.abs().amax(dim=1) / 127).clamp_min(1e-12).double()  # [out], symmetric: zero point 0
        zero = torch.zeros(w.shape[0], dtype=torch.long)
        with warnings.catch_warnings():  # quantized tensor creation is deprecated (module docstring)
            warnings.simplefilter("ignore")
            qw = torch.quantize_per_channel(w, scale, zero, 0, torch.qint8)
            bias = linear.bias.detach().float() if linear.bias is not None else None
            packed = torch.ops.quantized.linear_prepack(qw, bias)
        return cls(packed, linear.in_features, linear.out_features, reduce_range)

    def forward(self, x: Tensor) -> Tensor:
        """x [..., in] -> [..., out] (fp32)."""
        shape = x.shape
        y = torch.ops.quantized.linear_dynamic(x.reshape(-1, shape[-1]).float(), self._packed, self.reduce_range)
        return y.view(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weights"


def _vnni() -> bool:
    """Whether the CPU multiplies u8 x s8 without int16 saturation (AVX-512 VNNI / AVX-VNNI): then the
    activations may use the full 8 bits (reduce_range False); FBGEMM's AVX2 path needs 7."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = line.split()
                    return "avx512_vnni" in flags or "avx_vnni" in flags
    except OSError:
        pass
    return False


def quantize_int8(model: nn.Module) -> int:
    """Replace every `nn.Linear` of `model` (in place) by an `Int8Linear`; returns how many. Parameters
    shared with other modules (a tied output projection's embedding) stay as they are."""
    reduce_range = not _vnni()
    n = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, Int8Linear.from_linear(child, reduce_range))
                n += 1
    return n


def prepare(model: nn.Module, precision: str) -> torch.dtype | None:
    """Apply `precision` to a loaded inference model (int8: quantize its linear layers, in place);
    returns the autocast dtype its forward passes need (None: fp32 or int8). Call `check` first."""
    precision = resolve(precision)
    if precision == "int8":
        quantize_int8(model)
    return AUTOCAST.get(precision)
