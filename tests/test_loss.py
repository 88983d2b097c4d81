"""nmt.training.loss against a hand computation and against F.cross_entropy."""

import math

import pytest
import torch
import torch.nn.functional as F

from nmt.layout import PAD_ID
from nmt.training.loss import label_smoothed_nll


def test_hand_computed_value():
    # V=3, one real token (target 2) and one PAD position (target 0) that must not count.
    logits = torch.tensor([[[1.0, 2.0, 3.0], [5.0, -1.0, 0.5]]])  # [B=1,T=2,V=3]
    target = torch.tensor([[2, 0]])
    eps = 0.1
    lse = math.log(math.exp(1) + math.exp(2) + math.exp(3))
    nll = lse - 3.0  # -log p(target)
    smooth = (lse - 1) + (lse - 2) + (lse - 3)  # sum_v -log p_v
    expected = (1 - eps) * nll + eps / 3 * smooth  # PyTorch: eps spread over all V classes
    loss, nll_sum = label_smoothed_nll(logits, target, eps)
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert nll_sum.item() == pytest.approx(nll, rel=1e-6)
    # fairseq's formula (eps over V-1 classes) gives a different number: we are not using it.
    eps_i = eps / 2
    fairseq = (1 - eps - eps_i) * nll + eps_i * smooth
    assert abs(loss.item() - fairseq) > 1e-3


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_matches_torch_cross_entropy_values_and_grads(eps):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=g, requires_grad=True)
    target = torch.randint(1, 11, (3, 5), generator=g)
    target[0, 3:] = 0  # right padding
    target[2, 1:] = 0
    loss, nll = label_smoothed_nll(logits, target, eps)
    (grad,) = torch.autograd.grad(loss, logits)
    ref = F.cross_entropy(logits.view(-1, 11), target.view(-1), ignore_index=0,
                          label_smoothing=eps, reduction="sum")
    (ref_grad,) = torch.autograd.grad(ref, logits)
    ref_nll = F.cross_entropy(logits.view(-1, 11), target.view(-1), ignore_index=0, reduction="sum")
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(nll, ref_nll, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(cross_entropy_sum(logits, target, eps), ref)
    assert grad[2, 1:].abs().max() == 0  # padded positions get no gradient


def test_low_precision_logits_give_fp32_loss():
    logits = torch.randn(2, 4, 7).bfloat16()
    target = torch.randint(1, 7, (2, 4))
    loss, nll = label_smoothed_nll(logits, target, 0.1)
    assert loss.dtype == nll.dtype == torch.float32
    ref = F.cross_entropy(logits.float().view(-1, 7), target.view(-1), ignore_index=0, label_smoothing=0.1,
                          reduction="sum")
    torch.testing.assert_close(loss, ref)


def test_gradients_of_both_outputs_and_single_backward():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    target = torch.tensor([[1, 4, 0], [2, 0, 0]])
    loss, nll = label_smoothed_nll(logits, target, 0.2)
    (grad,) = torch.autograd.grad(loss + 2 * nll, logits)
    ref = (F.cross_entropy(logits.view(-1, 5), target.view(-1), ignore_index=0, label_smoothing=0.2, reduction="sum")
           + 2 * F.cross_entropy(logits.view(-1, 5), target.view(-1), ignore_index=0, reduction="sum"))
    (ref_grad,) = torch.autograd.grad(ref, logits)
    torch.testing.assert_close(grad, ref_grad)
    # the backward reuses its saved buffer: a second backward is refused, not silently wrong
    loss, _ = label_smoothed_nll(logits, target, 0.2)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="inplace"):
        loss.backward()


def test_bf16_logits_get_bf16_gradients():
    logits = torch.randn(2, 4, 7).bfloat16().requires_grad_()
    loss, _ = label_smoothed_nll(logits, torch.randint(1, 7, (2, 4)), 0.1)
    loss.backward()
    assert logits.grad.dtype == torch.bfloat16


def cross_entropy_sum(logits: torch.Tensor, target: torch.Tensor, epsilon: float,
                      ignore_index: int = PAD_ID) -> torch.Tensor:
    """Reference: the smoothed loss sum via `F.cross_entropy` (logits [B,T,V], target [B,T])."""
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), target.reshape(-1),
                           ignore_index=ignore_index, label_smoothing=epsilon, reduction="sum")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reduced_precision_logits_give_the_loss_of_their_fp32_copy(dtype):
    """Autocast logits (bf16/fp16) are cast to fp32 inside log_softmax (no fp32 copy of the [N,V] logits is
    made first, which saves a pass over them on a GPU): the loss and its gradient are exactly those of the
    logits cast to fp32 beforehand (to fp32 rounding: torch may upcast inside its kernel in another order; a loss
    computed in the reduced precision is off by ~1e-2)."""
    torch.manual_seed(0)
    x = torch.randn(5, 7, 301).to(dtype)
    target = torch.randint(1, 301, (5, 7))
    target[:, -2:] = 0
    a, b = x.clone().requires_grad_(), x.float().requires_grad_()
    got, want = label_smoothed_nll(a, target, 0.1), label_smoothed_nll(b, target, 0.1)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype == torch.float32
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
    sum(got).backward()
    sum(want).backward()
    assert a.grad.dtype == dtype
    # the same fp32 gradient rounded to dtype: equal, or one unit of rounding apart
    torch.testing.assert_close(a.grad.float(), b.grad.to(dtype).float(), rtol=torch.finfo(dtype).eps, atol=1e-6)


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_formula_train_compile_uses_equals_the_fused_loss(eps, dtype):
    """nmt.training.loss.smoothed_nll_formula (what `train.compile` compiles) gives label_smoothed_nll's loss, NLL
    and gradient, also from bf16 logits (both compute in fp32)."""
    from nmt.training.loss import smoothed_nll_formula

    g = torch.Generator().manual_seed(1)
    base = torch.randn(4, 6, 13, generator=g) * 3
    target = torch.randint(1, 13, (4, 6), generator=g)
    target[1, 2:] = 0
    target[3, 4:] = 0
    out = []
    for fn in (label_smoothed_nll, smoothed_nll_formula):
        logits = base.to(dtype).requires_grad_()
        loss, nll = fn(logits, target, eps)
        (grad,) = torch.autograd.grad(loss, logits)
        assert loss.dtype == nll.dtype == torch.float32 and grad.dtype == dtype
        out.append((loss.detach(), nll.detach(), grad.float()))
    (l1, n1, g1), (l2, n2, g2) = out
    torch.testing.assert_close(l2, l1, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(n2, n1, rtol=1e-6, atol=1e-5)
    tol = dict(rtol=1e-6, atol=1e-7) if dtype == torch.float32 else dict(rtol=0.01, atol=1e-3)
    torch.testing.assert_close(g2, g1, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_the_chunked_loss_gives_the_same_gradient_without_an_fp32_copy(dtype, eps):
    """train.loss_chunk: the loss sums equal the whole-batch loss's (to float rounding: summed chunk by
    chunk), the gradient is the same row for row (both outputs differentiated), and nothing of [N, V] in
    fp32 is saved for the backward pass when the logits are bf16 (the whole-batch loss saves one)."""
    torch.manual_seed(0)
    N, V = 37, 50  # 37 rows in chunks of 8: a short last chunk
    base = torch.randn(N, V) * 3
    target = torch.randint(0, V, (N,))
    target[[3, 20]] = PAD_ID
    outs, grads = [], []
    for chunk in (0, 8):
        logits = base.to(dtype).requires_grad_()
        loss, nll = label_smoothed_nll(logits.view(1, N, V), target.view(1, N), eps, chunk=chunk)
        saved = [t for t in loss.grad_fn.saved_tensors if t.dtype == torch.float32 and t.numel() >= N * V]
        assert bool(saved) == (chunk == 0 and dtype == torch.bfloat16 or dtype == torch.float32)
        (loss * 0.3 + nll * 0.7).backward()
        outs.append(torch.stack([loss, nll]).detach())
        grads.append(logits.grad)
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-6, atol=1e-5)
    assert torch.equal(grads[1], grads[0])
