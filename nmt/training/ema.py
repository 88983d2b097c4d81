"""Exponential moving average of the weights (`train.ema_decay`; fairseq's --ema-decay, Marian's
--exponential-smoothing).

After every optimizer update, each floating-point tensor of the model's state moves toward the
trained value:

    ema = d * ema + (1 - d) * weight,    d = min(ema_decay, (1 + updates) / (10 + updates))

`updates` counts the updates before this one; the second term (Marian's and TensorFlow's warm-up)
lets the average forget fast early on. The average is kept in fp32 on the model's device, one tensor
per storage (tied embeddings stay tied).

With EMA on, validation, `best.pt` and every checkpoint's `model` hold the average; the trained
weights, which training continues from, are saved in `train_state["raw_model"]` and the counter in
`train_state["ema"]`, so `--resume` continues bit for bit.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn


def _identity(t: torch.Tensor) -> tuple:
    """Two state-dict entries with the same identity are one tensor (tied weights)."""
    return t.data_ptr(), tuple(t.shape), t.dtype


class EMA:
    """The moving average of `model`'s floating-point state, starting at its current values."""

    def __init__(self, model: nn.Module, decay: float, updates: int = 0):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"ema decay must be in (0, 1), got {decay}")
        self.decay, self.updates = decay, updates
        self.shadow: dict[str, torch.Tensor] = {}
        self._keys: dict[tuple, str] = {}  # tensor -> the first key that holds it (tied weights share one average)
        for key, value in model.state_dict().items():
            if value.is_floating_point() and _identity(value) not in self._keys:
                self._keys[_identity(value)] = key
                self.shadow[key] = value.detach().float().clone()

    def rate(self) -> float:
        """The decay d of the next update."""
        return min(self.decay, (1 + self.updates) / (10 + self.updates))

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """Move the average toward the model's current weights (call after each optimizer update)."""
        d = self.rate()
        state = model.state_dict()
        averages = list(self.shadow.values())
        torch._foreach_mul_(averages, d)  # one call over all tensors, as torch.optim's foreach paths
        torch._foreach_add_(averages, [state[key].detach().float() for key in self.shadow], alpha=1.0 - d)
        self.updates += 1

    def state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """A full state dict of `model` (every key, its dtypes) holding the averaged weights; tied
        keys share one tensor, as in the model's own state dict."""
        out: dict[str, torch.Tensor] = {}
        done: dict[tuple, torch.Tensor] = {}
        for key, value in model.state_dict().items():
            ptr = _identity(value)
            if value.is_floating_point():
                if ptr not in done:
                    done[ptr] = self.shadow[self._keys[ptr]].to(value.dtype).clone()
                out[key] = done[ptr]
            else:
                out[key] = value.detach().clone()
        return out

    def load(self, averaged: dict[str, torch.Tensor], updates: int) -> None:
        """Restore the average from a checkpoint's `model` (as `state_dict` wrote it) and its counter."""
        for key, avg in self.shadow.items():
            avg.copy_(averaged[key].float())
        self.updates = updates

    @contextlib.contextmanager
    def applied(self, model: nn.Module) -> Iterator[None]:
        """The model holds the averaged weights inside the block (validation), its own afterwards."""
        state = model.state_dict()
        saved = {key: state[key].detach().clone() for key in self.shadow}
        with torch.no_grad():
            for key, avg in self.shadow.items():
                state[key].copy_(avg)
        try:
            yield
        finally:
            with torch.no_grad():
                for key, value in saved.items():
                    state[key].copy_(value)
