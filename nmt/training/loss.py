"""Label-smoothed cross-entropy as a pure function of logits and targets.

Label smoothing follows PyTorch's formula (`F.cross_entropy(label_smoothing=eps)`): `eps` is spread
uniformly over **all V classes** (the reference and PAD included), so the reference gets
`1 - eps + eps/V`. Per real target token:

    loss = (1 - eps) * nll + (eps / V) * sum_v(-log p_v)

(fairseq spreads `eps` over the other V-1 classes; the two differ by O(eps/V).)
`label_smoothed_nll` returns **sums** over the real target tokens, in fp32; the caller divides by the
token count of the whole step (micro-batches and ranks), so the gradient scale does not depend on how
a step is split. With `chunk` (train.loss_chunk) the log-probabilities are computed
`chunk` rows at a time, in the forward pass and again in the backward one: the same gradient, row for row,
and no [tokens, V] fp32 tensor outlives a chunk.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from nmt.layout import PAD_ID


def label_smoothed_nll(
    logits: torch.Tensor, target: torch.Tensor, epsilon: float, ignore_index: int = PAD_ID, chunk: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Smoothed loss sum and plain NLL sum over the non-ignored target tokens.

    logits [B,T,V] (any float dtype), target [B,T] (ignore_index = padding) -> (loss_sum, nll_sum), fp32
    scalars; `loss_sum` equals `F.cross_entropy(..., label_smoothing=epsilon, reduction="sum")`
    (tests/test_loss.py), `nll_sum` the same with epsilon 0. A fused autograd function (one backward):
    its backward writes softmax - q in place into the saved log-probabilities (BENCHMARKS.md)."""
    V = logits.size(-1)
    flat, target = logits.reshape(-1, V), target.reshape(-1)
    if chunk and flat.shape[0] > chunk:
        return _ChunkedCrossEntropy.apply(flat, target, float(epsilon), ignore_index, chunk)
    return _SmoothedCrossEntropy.apply(flat, target, float(epsilon), ignore_index)


class _SmoothedCrossEntropy(torch.autograd.Function):
    """(loss_sum, nll_sum) of logits [N,V] vs target [N]; gradient softmax - q per real token.

    Saves only the [N,V] log-probabilities and turns them into the gradient in place
    (exp_): no extra [N,V] buffer. Hence one backward per forward (a second one, e.g.
    with retain_graph=True, fails autograd's in-place check instead of going wrong).
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, epsilon: float, ignore_index: int):
        lprobs, safe, keep = _log_probs(logits, target, ignore_index)
        loss_sum, nll_sum = _sums(lprobs, safe, keep, epsilon)
        ctx.save_for_backward(lprobs, safe, keep)
        ctx.epsilon, ctx.in_dtype = epsilon, logits.dtype
        return loss_sum, nll_sum

    @staticmethod
    def backward(ctx, g_loss: torch.Tensor, g_nll: torch.Tensor):
        lprobs, safe, keep = ctx.saved_tensors
        return _grad(lprobs, safe, keep, ctx.epsilon, g_loss, g_nll).to(ctx.in_dtype), None, None, None


class _ChunkedCrossEntropy(torch.autograd.Function):
    """`_SmoothedCrossEntropy` over `chunk` rows at a time: saves the logits (no copy) and computes each
    chunk's log-probabilities again in the backward pass, writing its gradient rows in the logits' dtype."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, epsilon: float, ignore_index: int, chunk: int):
        sums = [_sums(*_log_probs(logits[i:i + chunk], target[i:i + chunk], ignore_index), epsilon)
                for i in range(0, logits.shape[0], chunk)]
        ctx.save_for_backward(logits, target)
        ctx.epsilon, ctx.ignore_index, ctx.chunk = epsilon, ignore_index, chunk
        return torch.stack([s[0] for s in sums]).sum(), torch.stack([s[1] for s in sums]).sum()

    @staticmethod
    def backward(ctx, g_loss: torch.Tensor, g_nll: torch.Tensor):
        logits, target = ctx.saved_tensors
        grad, c = torch.empty_like(logits), ctx.chunk
        for i in range(0, logits.shape[0], c):
            grad[i:i + c] = _grad(*_log_probs(logits[i:i + c], target[i:i + c], ctx.ignore_index), ctx.epsilon,
                                  g_loss, g_nll)
        return grad, None, None, None, None


def _log_probs(logits: torch.Tensor, target: torch.Tensor, ignore_index: int):
    """(log-probabilities [N,V] in fp32, or fp64 for fp64 logits: bf16/fp16 logits are cast inside the
    kernel, with no fp32 copy of them; target ids [N,1] with padding at 0; keep [N]: True = real token)."""
    keep = target != ignore_index
    safe = target.masked_fill(~keep, 0).unsqueeze(-1)
    dtype = logits.dtype if logits.dtype == torch.float64 else torch.float32
    return F.log_softmax(logits, dim=-1, dtype=dtype), safe, keep


def _sums(lprobs: torch.Tensor, safe: torch.Tensor, keep: torch.Tensor, epsilon: float):
    """(smoothed loss sum, nll sum) over the real tokens."""
    nll_sum = lprobs.gather(-1, safe).squeeze(-1).masked_fill(~keep, 0.0).sum().neg()
    if not epsilon:
        return nll_sum.clone(), nll_sum
    smooth_sum = lprobs.sum(-1).masked_fill(~keep, 0.0).sum().neg()  # sum over tokens, classes of -log p
    return (1.0 - epsilon) * nll_sum + (epsilon / lprobs.size(-1)) * smooth_sum, nll_sum


def _grad(lprobs, safe, keep, eps: float, g_loss: torch.Tensor, g_nll: torch.Tensor) -> torch.Tensor:
    """The gradient [N,V] written over `lprobs` (in place): d loss/dx = p - (1-eps) onehot - eps/V,
    d nll/dx = p - onehot (real tokens only)."""
    V = lprobs.size(-1)
    w = keep.to(lprobs.dtype).unsqueeze(-1)  # [N,1]
    grad = lprobs.exp_()  # [N,V] softmax, in place
    grad.mul_(w * (g_loss + g_nll))
    grad.scatter_add_(-1, safe, -w * (g_loss * (1.0 - eps) + g_nll))
    if eps:
        grad.sub_(w * (g_loss * (eps / V)))
    return grad


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
def compiled_smoothed_nll(shapes: int = 0):
    """`smoothed_nll_formula` through torch.compile (dynamic shapes: one compilation for every batch
    shape; shapes > 0: one per shape, for data.length_buckets, within a recompile limit raised to hold
    them, as `Transformer.compile_layers` does), made once per process; what `train.compile: true` trains
    with."""
    if shapes:
        from nmt.device import allow_recompiles

        allow_recompiles(shapes)
    return torch.compile(smoothed_nll_formula, dynamic=not shapes)
