"""Optimizer and learning-rate schedules.

The k-th optimizer update (k = 1, 2, ...) uses `lr_at(k)`; `build_scheduler` wraps it in a `LambdaLR`
(`lambda i: lr_at(i + 1) / lr`): `scheduler.step()` follows each optimizer step,
and `rewind` takes back the ones the optimizer skipped (once known: nmt/training/trainer.py). All schedules
warm up linearly from lr/warmup at step 1 to their peak at step `warmup_steps`:

- constant:      lr
- inverse_sqrt:  lr * sqrt(warmup / step)                        (after warmup)
- noam:          lr * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)   (its own warmup)
- cosine:        min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2
- linear:        min_lr + (lr - min_lr) * (1 - p)
  with p = (step - warmup) / (max_steps - warmup) clamped to [0, 1]; with `decay_fraction` f < 1
  the lr stays at its peak until the last f of that span (warmup-stable-decay).

`train.schedule_clock: time` uses the same formulas with "step" the seconds trained and max_steps
train.max_time (not reproducible bit for bit); `train.warmup_fraction` gives the warmup as a share
of the budget. nmt/config.py `_check_schedule` checks the warmup against the budget.

Weight decay (`weight_decay > 0`) applies to matrices (dim >= 2), never to biases and norm gains,
as in nanoGPT; `adamw` decays decoupled, `adam` adds the L2 term to the gradient.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

from nmt.config import TrainConfig


def schedule_span(cfg: TrainConfig) -> tuple[float, float]:
    """(warmup, end) of the schedule in units of its clock: steps, or seconds of train.max_time
    with `schedule_clock: time`. warmup_fraction > 0 makes the warmup that share of the end."""
    end = float(cfg.max_time if cfg.schedule_clock == "time" else cfg.max_steps)
    warmup = cfg.warmup_fraction * end if cfg.warmup_fraction > 0 else float(cfg.warmup_steps)
    return warmup, end


def lr_at(step: float, cfg: TrainConfig, d_model: int) -> float:
    """Learning rate at `step` of the schedule's clock: the step-th optimizer update (1-based), or
    the seconds trained so far with `schedule_clock: time`; a pure function."""
    warmup, end = schedule_span(cfg)
    step = max(step, 1.0 if cfg.schedule_clock == "steps" else 1e-3)
    lr, warmup = cfg.lr, max(warmup, 1.0 if cfg.schedule_clock == "steps" else 1e-3)
    if cfg.schedule == "noam":
        return lr * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)
    if step < warmup:
        return lr * step / warmup
    if cfg.schedule == "constant":
        return lr
    if cfg.schedule == "inverse_sqrt":
        return lr * math.sqrt(warmup / step)
    span = max(end - warmup, 1e-9) * cfg.decay_fraction  # the decay: the last decay_fraction of the budget
    p = min(max((step - (end - span)) / span, 0.0), 1.0)
    if cfg.schedule == "cosine":
        return cfg.min_lr + (lr - cfg.min_lr) * 0.5 * (1.0 + math.cos(math.pi * p))
    if cfg.schedule == "linear":
        return cfg.min_lr + (lr - cfg.min_lr) * (1.0 - p)
    raise ValueError(f"unknown schedule {cfg.schedule!r}")  # the config rejects it first


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: decayed matrices (dim >= 2) and undecayed biases / norm gains (dim < 2)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def build_optimizer(model: nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    """Adam or AdamW over `param_groups`; fused kernels on CUDA and CPU, foreach elsewhere.

    The initial lr is a placeholder: `build_scheduler` sets the real one.
    """
    cls = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    fast = {"fused": True} if device.type in ("cuda", "cpu") else {"foreach": True}
    return cls(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=tuple(cfg.betas),
               eps=cfg.eps, **fast)


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig, d_model: int,
                    clock: Callable[[], float] | None = None) -> torch.optim.lr_scheduler.LambdaLR:
    """LambdaLR giving `lr_at(k)` for the k-th update (sets the lr of update 1 at once); with
    `schedule_clock: time`, `lr_at(clock())` where clock() gives the seconds trained so far (the
    clock train.max_time is measured with), read at each update."""
    base = cfg.lr
    if cfg.schedule_clock == "time":
        if clock is None:
            raise ValueError("schedule_clock 'time' needs a clock")
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: lr_at(clock(), cfg, d_model) / base)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: lr_at(i + 1, cfg, d_model) / base)


def rewind(scheduler: torch.optim.lr_scheduler.LambdaLR, skipped: int) -> None:
    """Take back `skipped` of the scheduler's steps (updates the optimizer skipped: it counts only the
    applied ones) and set the learning rates it then gives."""
    if not skipped:
        return
    scheduler.last_epoch -= skipped
    lrs = [base * f(scheduler.last_epoch) for base, f in zip(scheduler.base_lrs, scheduler.lr_lambdas)]
    for group, lr in zip(scheduler.optimizer.param_groups, lrs):
        group["lr"] = lr
    scheduler._last_lr = lrs
