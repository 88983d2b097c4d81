"""Label-smoothed cross-entropy as a pure function of logits and targets.

Label smoothing follows PyTorch's formula (`F.cross_entropy(label_smoothing=eps)`): `eps` is spread
uniformly over **all V classes** (the reference and PAD included), so the reference gets
`1 - eps + eps/V`. Per real target token:

    loss = (1 - eps) * nll + (eps / V) * sum_v(-log p_v)

(fairseq spreads `eps` over the other V-1 classes; the two differ by O(eps/V).)
`label_smoothed_nll` returns **sums** over the real target tokens, in fp32; the caller divides by the
token count of the whole step (micro-batches and ranks), so the gradient scale does not depend on how
a step is split.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from nmt.layout import PAD_ID


def label_smoothed_nll(
    logits: torch.Tensor, target: torch.Tensor, epsilon: float, ignore_index: int = PAD_ID
) -> tuple[torch.Tensor, torch.Tensor]:
    """Smoothed loss sum and plain NLL sum over the non-ignored target tokens.

    logits [B,T,V] (any float dtype), target [B,T] (ignore_index = padding) -> (loss_sum, nll_sum), fp32
    scalars; `loss_sum` equals `F.cross_entropy(..., label_smoothing=epsilon, reduction="sum")`
    (tests/test_loss.py), `nll_sum` the same with epsilon 0. A fused autograd function (one backward):
    its backward writes softmax - q in place into the saved log-probabilities (BENCHMARKS.md)."""
    V = logits.size(-1)
    return _SmoothedCrossEntropy.apply(logits.reshape(-1, V), target.reshape(-1), float(epsilon), ignore_index)


class _SmoothedCrossEntropy(torch.autograd.Function):
    """(loss_sum, nll_sum) of logits [N,V] vs target [N]; gradient softmax - q per real token.

    Saves only the [N,V] log-probabilities and turns them into the gradient in place
    (exp_): no extra [N,V] buffer. Hence one backward per forward (a second one, e.g.
    with retain_graph=True, fails autograd's in-place check instead of going wrong).
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, epsilon: float, ignore_index: int):
        V = logits.size(-1)
        keep = target != ignore_index  # [N] True = real token
        safe = target.masked_fill(~keep, 0).unsqueeze(-1)  # [N,1]
        # [N,V] in fp32 (or fp64); bf16/fp16 logits are cast inside the kernel, with no fp32 copy of them
        lprobs = F.log_softmax(logits, dim=-1, dtype=logits.dtype if logits.dtype == torch.float64 else torch.float32)
        nll_sum = lprobs.gather(-1, safe).squeeze(-1).masked_fill(~keep, 0.0).sum().neg()
        if epsilon:
            smooth_sum = lprobs.sum(-1).masked_fill(~keep, 0.0).sum().neg()  # sum over tokens, classes of -log p
            loss_sum = (1.0 - epsilon) * nll_sum + (epsilon / V) * smooth_sum
        else:
            loss_sum = nll_sum.clone()
        ctx.save_for_backward(lprobs, safe, keep)
        ctx.epsilon, ctx.in_dtype = epsilon, logits.dtype
        return loss_sum, nll_sum

    @staticmethod
    def backward(ctx, g_loss: torch.Tensor, g_nll: torch.Tensor):
        lprobs, safe, keep = ctx.saved_tensors
        eps, V = ctx.epsilon, lprobs.size(-1)
        # d loss/dx = p - (1-eps) onehot - eps/V ; d nll/dx = p - onehot  (real tokens only)
        w = keep.to(lprobs.dtype).unsqueeze(-1)  # [N,1]
        grad = lprobs.exp_()  # [N,V] softmax, in place
        grad.mul_(w * (g_loss + g_nll))
        grad.scatter_add_(-1, safe, -w * (g_loss * (1.0 - eps) + g_nll))
        if eps:
            grad.sub_(w * (g_loss * (eps / V)))
        return grad.to(ctx.in_dtype), None, None, None


def smoothed_nll_formula(
    logits: torch.Tensor, target: torch.Tensor, epsilon: float, ignore_index: int = PAD_ID
) -> tuple[torch.Tensor, torch.Tensor]:
    """`label_smoothed_nll` written as plain autograd ops over logsumexp (no [N,V] log-probabilities
    kept): what `compiled_smoothed_nll` compiles, so that Inductor fuses the fp32 casts, the
    reduction and the gradient into a few kernels. Same values (tests/test_loss.py); the NLL sum is
    returned detached (training differentiates only the loss)."""
    V = logits.size(-1)
    flat, target = logits.reshape(-1, V).float(), target.reshape(-1)  # one cast: the gradient is summed in fp32
    keep = target != ignore_index
    lse = torch.logsumexp(flat, dim=-1)  # [N]
    nll = (lse - flat.gather(-1, target.masked_fill(~keep, 0).unsqueeze(-1)).squeeze(-1)).masked_fill(~keep, 0.0)
    nll_sum = nll.sum()
    if not epsilon:
        return nll_sum, nll_sum.detach()
    smooth = (V * lse - flat.sum(-1)).masked_fill(~keep, 0.0)  # sum over classes of -log p
    return (1.0 - epsilon) * nll_sum + (epsilon / V) * smooth.sum(), nll_sum.detach()


@functools.cache
def compiled_smoothed_nll():
    """`smoothed_nll_formula` through torch.compile (dynamic shapes: one compilation for every batch
    shape), made once per process; what `train.compile: true` trains with."""
    return torch.compile(smoothed_nll_formula, dynamic=True)
