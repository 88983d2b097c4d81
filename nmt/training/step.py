"""One optimizer update (`train_step`), its precision setup, and the statistics of updates.

Precision: `auto` = bf16 autocast on CUDA GPUs that support it, else fp16 with
a GradScaler (fp16 overflow steps are skipped by the scaler and not counted as
NaN steps); fp32 on CPU. TF32 matmuls on CUDA. The loss is always fp32. With
train.master_weights the model's weights are in bf16/fp16 and the optimizer's fp32
copies are the master weights (`MasterWeights`) instead of autocast.

Host reads: none per step. Whether the update applies (a finite loss and gradient norm) is decided on
the device: the fused optimizer skips a step whose `found_inf` is set, as it does under a GradScaler;
the flag stays on the device (`StepResult.ok`) until the trainer reads the flags of its pending steps
(nmt/training/trainer.py: at log time, validation, checkpoints and the stop checks). Loss and grad-norm
sums stay on the device and are read only by `Meter.report`. Exceptions, one read per step: fp16's
GradScaler path and an optimizer without the fused kernel. Under torchrun the step's token count is
read too (the all-reduce that opens each step).
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
    """Autocast settings for one device: dtype None = fp32; scaler only for fp16. With `master`
    (train.master_weights) the model itself is in `dtype` and nothing is autocast."""

    name: str
    device_type: str
    dtype: torch.dtype | None
    scaler: torch.amp.GradScaler | None
    master: "MasterWeights | None" = None

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.dtype is None or self.master is not None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The model's weights as checkpoints hold them: fp32 (the master weights, where they are kept)."""
        return model.state_dict() if self.master is None else self.master.state_dict(model)


class MasterWeights:
    """train.master_weights: the model's parameters and floating buffers in the compute dtype, new tensors;
    the optimizer keeps the fp32 parameters it was built with as the master weights. Per step: the
    gradients go to the masters (`to_masters`, before clipping and the update) and the updated masters
    come back to the model in one copy (`to_model`). Tied parameters stay tied."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, dtype: torch.dtype):
        masters = {id(p) for g in optimizer.param_groups for p in g["params"]}
        new: dict[int, nn.Parameter] = {}
        self.pairs: list[tuple[nn.Parameter, nn.Parameter]] = []  # (the model's, the master)
        for module in model.modules():
            for name, p in list(module._parameters.items()):
                if p is None:
                    continue
                if id(p) not in new:
                    new[id(p)] = nn.Parameter(p.detach().to(dtype), requires_grad=p.requires_grad)
                    if id(p) in masters:
                        self.pairs.append((new[id(p)], p))
                module._parameters[name] = new[id(p)]
            for name, b in list(module._buffers.items()):
                if b is not None and b.is_floating_point():
                    module._buffers[name] = b.to(dtype)
        self.model_params = [m for m, _ in self.pairs]
        self.masters = [p for _, p in self.pairs]

    def to_masters(self) -> None:
        for m, master in self.pairs:
            master.grad = None if m.grad is None else m.grad.float()
            m.grad = None

    @torch.no_grad()
    def to_model(self) -> None:
        torch._foreach_copy_(self.model_params, self.masters)

    def state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        state, master = model.state_dict(), {id(m): p for m, p in self.pairs}
        for name, p in model.named_parameters(remove_duplicate=False):
            if name in state and id(p) in master:
                state[name] = master[id(p)].detach()
        return {k: v.float() if v.is_floating_point() else v for k, v in state.items()}


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
    """Sums over the step's target tokens (0-dim fp32 tensors) and the outcome (0-dim bool tensors), all
    on the device: nothing is read by the step."""

    loss_sum: torch.Tensor  # label-smoothed loss
    nll_sum: torch.Tensor  # plain negative log-likelihood
    grad_norm: torch.Tensor  # before clipping
    n_tokens: int
    ok: torch.Tensor  # the update was applied (finite loss and gradient)
    loss_ok: torch.Tensor  # the loss was finite (a non-finite one counts towards max_nan_steps)

    @property
    def updated(self) -> bool:
        return bool(self.ok)  # (a host read)

    @property
    def nonfinite_loss(self) -> bool:
        return not bool(self.loss_ok)  # (a host read)


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
    if precision.master is not None:
        precision.master.to_masters()
    if precision.scaler is not None:
        precision.scaler.unscale_(optimizer)
    params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    if clip_norm > 0:
        grad_norm = torch.nn.utils.clip_grad_norm_(params, clip_norm, foreach=True)
    else:
        grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params], foreach=True)
    finite = torch.stack([loss_acc, grad_norm.float()]).isfinite()
    ok, loss_ok = finite.all(), finite[0]
    if precision.scaler is not None:  # (fp16: the scaler lowers its scale after an overflow)
        if bool(ok):  # a host read
            precision.scaler.step(optimizer)
        precision.scaler.update()
    else:
        _apply(optimizer, ok)
    if precision.master is not None:
        precision.master.to_model()
    scheduler.step()  # the trainer rewinds it for the steps its flags show skipped (`optim.rewind`)
    return StepResult(loss_acc, nll_acc, grad_norm.detach(), n_tokens, ok, loss_ok)


def _apply(optimizer: torch.optim.Optimizer, ok: torch.Tensor) -> None:
    """optimizer.step() where `ok` [bool, 0-dim] holds, decided on the device by the fused kernel's
    `found_inf` (the attribute a GradScaler sets; the skipped step's counters are restored); an optimizer
    without it reads `ok`."""
    if not optimizer.defaults.get("fused"):
        if bool(ok):
            optimizer.step()
        return
    optimizer.found_inf = (~ok).float()
    try:
        optimizer.step()
    finally:
        optimizer.found_inf = None


class Meter:
    """Training statistics between two log lines, summed on the device over the steps that applied
    (nothing read until `report`)."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.sums = None  # [loss, nll, grad norm, steps, tokens, real tokens, padded tokens]
        self.t0 = time.perf_counter()

    def add(self, res: StepResult, group: Sequence[Batch], n_tokens: int) -> None:
        """n_tokens: the step's target tokens over all ranks (res.loss_sum is global too)."""
        real = sum(b.n_src_tokens + b.n_tgt_tokens for b in group)
        padded = sum(b.src.numel() + b.tgt_out.numel() for b in group)
        w = res.ok.double()
        values = torch.stack([res.loss_sum, res.nll_sum, res.grad_norm.float()]).double()
        step = torch.cat([torch.where(res.ok, values, 0.0), torch.stack([w, w * n_tokens, w * real, w * padded])])
        self.sums = step if self.sums is None else self.sums + step

    def report(self, log: RunLogger, state, lr: float) -> None:
        if self.sums is None:
            return
        loss, nll, gnorm, steps, tokens, real, padded = self.sums.tolist()
        if not steps:
            return
        seconds = max(time.perf_counter() - self.t0, 1e-9)
        stats = {"loss": loss / tokens, "ppl": math.exp(min(nll / tokens, 50.0)), "lr": lr, "grad_norm": gnorm / steps,
                 "tokens_per_s": tokens / seconds, "padding_efficiency": real / max(padded, 1)}
        log.scalars("train", stats, state.step)
        log.info(f"step {state.step} | epoch {state.epoch} | {format_stats(stats)}")
        log.progress(0, {"loss": f"{stats['loss']:.3f}", "lr": f"{lr:.2e}", "tok/s": f"{stats['tokens_per_s']:.0f}"})
        self.reset()
