"""One optimizer update (`train_step`), its precision setup, and the statistics of updates.

Precision: `auto` = bf16 autocast on CUDA GPUs that support it, else fp16 with
a GradScaler (fp16 overflow steps are skipped by the scaler and not counted as
NaN steps); fp32 on CPU. TF32 matmuls on CUDA. The loss is always fp32.

Host syncs: one per step in a single process (the finiteness check that decides whether to apply
the update, as fairseq does); under torchrun also the read of the step's token count
(nmt/training/trainer.py). Loss/grad-norm sums stay on the device and are read only by `Meter.report`.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import nn

from nmt.device import avoid_cudnn_attention
from nmt.layout import PAD_ID, Batch
from nmt.training.logging_utils import RunLogger, format_stats
from nmt.training.loss import label_smoothed_nll


# --------------------------------------------------------------------------- precision

@dataclass
class Precision:
    """Autocast settings for one device: dtype None = fp32; scaler only for fp16."""

    name: str
    device_type: str
    dtype: torch.dtype | None
    scaler: torch.amp.GradScaler | None

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)


def setup_precision(name: str, device: torch.device) -> Precision:
    """auto: bf16 on CUDA GPUs that support it, else fp16 (+ GradScaler); fp32 on CPU."""
    if name == "auto":
        if device.type == "cuda":
            name = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        else:
            name = "fp32"
    if device.type == "cuda":  # TF32 matmuls/convolutions for whatever still runs in fp32
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        avoid_cudnn_attention()  # a new batch length would cost a new cuDNN plan (nmt/device.py)
    dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[name]
    scaler = torch.amp.GradScaler(device.type) if name == "fp16" else None
    return Precision(name, device.type, dtype, scaler)


# --------------------------------------------------------------------------- one step

@dataclass
class StepResult:
    """Sums over the step's target tokens (0-dim fp32 tensors, no sync) and the outcome."""

    loss_sum: torch.Tensor  # label-smoothed loss
    nll_sum: torch.Tensor  # plain negative log-likelihood
    grad_norm: torch.Tensor  # before clipping
    n_tokens: int
    updated: bool  # False: skipped (non-finite loss or gradient)
    nonfinite_loss: bool  # the loss itself was NaN/inf (counts towards max_nan_steps)


def train_step(model: nn.Module, batches: Sequence[Batch], optimizer: torch.optim.Optimizer,
               scheduler: Any, precision: Precision, *, label_smoothing: float, clip_norm: float,
               grad_denominator: float | None = None,
               reduce: Callable[[torch.Tensor], torch.Tensor] | None = None, pad_id: int = PAD_ID,
               loss_fn: Callable | None = None) -> StepResult:
    """One optimizer update over `batches` (micro-batches already on the device).

    Each micro-batch's loss sum is divided by `grad_denominator` (default: the total target tokens of
    `batches`), so the gradients equal those of one batch. DDP: pass the global token count / world size;
    gradients are all-reduced on the last micro-batch only, and `reduce` (an in-place sum over ranks) makes
    the loss sums global, so every rank skips or applies the update together. One host sync per step: the
    finiteness check. `loss_fn`: (loss_sum, nll_sum) of nmt/training/loss.py (None: `label_smoothed_nll`)."""
    optimizer.zero_grad(set_to_none=True)
    loss_fn = loss_fn or label_smoothed_nll  # (looked up at call time: tests replace it)
    n_tokens = sum(b.n_tgt_tokens for b in batches)
    denom = float(grad_denominator if grad_denominator is not None else n_tokens)
    loss_acc = nll_acc = None
    no_sync = getattr(model, "no_sync", None)  # DDP: skip the all-reduce until the last micro-batch
    for i, batch in enumerate(batches):
        sync_ctx = no_sync() if (no_sync is not None and i < len(batches) - 1) else contextlib.nullcontext()
        with sync_ctx:
            with precision.autocast():
                logits = model(batch.src, batch.src_mask, batch.tgt_in)  # [B,T,V]
            loss, nll = loss_fn(logits, batch.tgt_out, label_smoothing, pad_id)
            scaled = loss / denom
            (precision.scaler.scale(scaled) if precision.scaler is not None else scaled).backward()
        loss_acc = loss.detach() if loss_acc is None else loss_acc + loss.detach()
        nll_acc = nll.detach() if nll_acc is None else nll_acc + nll.detach()
    if reduce is not None:
        loss_acc, nll_acc = reduce(torch.stack([loss_acc, nll_acc])).unbind()
    if precision.scaler is not None:
        precision.scaler.unscale_(optimizer)
    params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    if clip_norm > 0:
        grad_norm = torch.nn.utils.clip_grad_norm_(params, clip_norm, foreach=True)
    else:
        grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params], foreach=True)
    loss_ok, grad_ok = torch.stack([loss_acc, grad_norm.float()]).isfinite().tolist()  # the one sync
    updated = loss_ok and grad_ok
    if precision.scaler is not None:
        if updated:
            precision.scaler.step(optimizer)
        precision.scaler.update()  # lowers the scale after an overflow
    elif updated:
        optimizer.step()
    if updated:
        scheduler.step()
    return StepResult(loss_acc, nll_acc, grad_norm.detach(), n_tokens, updated, not loss_ok)


class Meter:
    """Training statistics between two log lines; tensors summed on the device (no sync)."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.loss = self.nll = self.gnorm = None
        self.tokens = self.real = self.padded = self.steps = 0
        self.t0 = time.perf_counter()

    def add(self, res: StepResult, group: Sequence[Batch], n_tokens: int) -> None:
        """n_tokens: the step's target tokens over all ranks (res.loss_sum is global too)."""
        if not res.updated:
            return
        acc = lambda a, b: b if a is None else a + b
        self.loss, self.nll = acc(self.loss, res.loss_sum), acc(self.nll, res.nll_sum)
        self.gnorm = acc(self.gnorm, res.grad_norm.float())
        self.tokens += n_tokens
        self.steps += 1
        for b in group:
            self.real += b.n_src_tokens + b.n_tgt_tokens
            self.padded += b.src.numel() + b.tgt_out.numel()

    def report(self, log: RunLogger, state, lr: float) -> None:
        if not self.steps:
            return
        loss, nll, gnorm = (torch.stack([self.loss, self.nll, self.gnorm]).cpu() / torch.tensor(
            [self.tokens, self.tokens, self.steps])).tolist()
        seconds = max(time.perf_counter() - self.t0, 1e-9)
        stats = {"loss": loss, "ppl": math.exp(min(nll, 50.0)), "lr": lr, "grad_norm": gnorm,
                 "tokens_per_s": self.tokens / seconds, "padding_efficiency": self.real / max(self.padded, 1)}
        log.scalars("train", stats, state.step)
        log.info(f"step {state.step} | epoch {state.epoch} | {format_stats(stats)}")
        log.progress(0, {"loss": f"{loss:.3f}", "lr": f"{lr:.2e}", "tok/s": f"{stats['tokens_per_s']:.0f}"})
        self.reset()
