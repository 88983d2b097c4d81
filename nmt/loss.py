"""Label-smoothed cross-entropy as a pure function of logits and targets.

Label smoothing follows PyTorch's formula (`F.cross_entropy(label_smoothing=eps)`):
the target distribution puts `1 - eps` on the reference token and spreads
`eps` uniformly over **all V classes** (the reference and PAD included), so the
reference token gets `1 - eps + eps/V`. Per real target token:

    loss = (1 - eps) * nll + (eps / V) * sum_v(-log p_v)

fairseq's `label_smoothed_cross_entropy` spreads `eps` over the other V-1 classes
instead (`eps_i = eps/(V-1)`, reference weight `1 - eps`); for V in the thousands
the two differ by O(eps/V) and are interchangeable in practice.

Both functions return **sums** over the real (non-PAD) target tokens; the caller
divides by the token count (summed over accumulated micro-batches and, with DDP,
over ranks), so the gradient scale does not depend on how a step is split into
batches. The log-softmax is computed once, in fp32 (logits may come from autocast).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

PAD_ID = 0  # == nmt.tokenizer.PAD_ID (fixed in every SentencePiece model we train)


def label_smoothed_nll(
    logits: torch.Tensor, target: torch.Tensor, epsilon: float, ignore_index: int = PAD_ID
) -> tuple[torch.Tensor, torch.Tensor]:
    """Smoothed loss sum and plain NLL sum over the non-ignored target tokens.

    logits [B,T,V] (any float dtype), target [B,T] (ignore_index = padding).
    Returns (loss_sum, nll_sum): fp32 scalars. `loss_sum` equals
    `F.cross_entropy(logits, target, label_smoothing=epsilon, ignore_index=..., reduction="sum")`;
    `nll_sum` is the same with epsilon = 0 (for perplexity). Only `loss_sum` needs a
    backward; `nll_sum` shares its graph, so call `.detach()` on it when accumulating.
    """
    lprobs = F.log_softmax(logits.float(), dim=-1)  # [B,T,V] fp32
    lprobs = lprobs.view(-1, lprobs.size(-1))  # [N,V]
    target = target.reshape(-1)  # [N]
    keep = target != ignore_index  # [N] True = real token
    nll = -lprobs.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)  # [N]
    nll_sum = nll.masked_fill(~keep, 0.0).sum()
    if epsilon == 0.0:
        return nll_sum, nll_sum
    smooth = -lprobs.sum(-1)  # [N] sum over all V classes of -log p
    smooth_sum = smooth.masked_fill(~keep, 0.0).sum()
    vocab = lprobs.size(-1)
    loss_sum = (1.0 - epsilon) * nll_sum + (epsilon / vocab) * smooth_sum
    return loss_sum, nll_sum


def cross_entropy_sum(logits: torch.Tensor, target: torch.Tensor, epsilon: float,
                      ignore_index: int = PAD_ID) -> torch.Tensor:
    """Reference: the smoothed loss sum via `F.cross_entropy` (logits [B,T,V], target [B,T])."""
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), target.reshape(-1),
                           ignore_index=ignore_index, label_smoothing=epsilon, reduction="sum")
