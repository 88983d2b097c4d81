"""The only place masks are built.

Convention (the one of `F.scaled_dot_product_attention`): a boolean mask,
True = may attend / is a real token, False = padding / masked out. Never a
float mask, never True = pad. Every row keeps at least one True, so softmax
never sees a row of -inf (no NaN).

Shapes: B batch, S source length, T target length, H heads.
"""

from __future__ import annotations

import torch


def padding_mask(lengths: torch.Tensor, max_len: int | None = None) -> torch.Tensor:
    """lengths [B] -> mask [B, L], True where position < length (a real token)."""
    max_len = int(lengths.max()) if max_len is None else max_len
    positions = torch.arange(max_len, device=lengths.device)
    return positions[None, :] < lengths[:, None]  # [B, L]


def attention_mask(key_mask: torch.Tensor | None) -> torch.Tensor | None:
    """key mask [B, S] -> [B, 1, 1, S], broadcastable over heads and query positions for SDPA. None (no
    key is padding: a batch of data.same_source_length) stays None, so SDPA may pick a kernel that takes
    no mask (flash attention on a GPU)."""
    return None if key_mask is None else key_mask[:, None, None, :]
