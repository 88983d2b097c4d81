"""CPU fast paths (nmt/model/fast.py, nmt/search/fast.py, nmt/device.py), each against the plain path it replaces: packed weights
(`F.linear`), blocked top-k (`torch.topk`), the reusing cache (nmt/search/cache.py, also in
tests/test_cache.py), numpy dropout (`nn.Dropout`'s semantics); and NMT_CPU_TUNING=0
turns them all off.

The packed-weight reference is the same model without packing: every packed layer is
checked, full forward, cached decode steps, greedy and beam outputs, and training-mode
gradients (where packing must step aside).
"""

from __future__ import annotations

import copy
import math
import subprocess
import sys

import pytest
import torch

from nmt.model import fast
from nmt.config import ModelConfig
from nmt.search.fast import FAST_OPS, blocked_argmax, blocked_topk
from nmt.model.fast import NumpyDropout, install_for_training
from nmt.device import cpu_tuning
from nmt.translation.torch_engine import _cpu_fast_paths
from nmt.model.transformer import Transformer
from nmt.search import PLAIN_OPS, SearchOptions, beam_search, greedy_search

pytestmark = pytest.mark.usefixtures("one_thread")

needs_onednn = pytest.mark.skipif(
    fast._MKLDNN is None, reason="this torch build lacks oneDNN or its private ops: pack_linear_weights is a no-op")


def tiny_pair(seed: int = 0):
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=32, n_heads=4, layers=2, ffn_dim=64, dropout=0.1, max_positions=64)
    model = Transformer(cfg, 50, 50).eval()
    with torch.no_grad():  # non-zero biases and LayerNorm parameters (init leaves them 0 / 1)
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    packed = copy.deepcopy(model)
    return model, packed, fast.pack_linear_weights(packed, min_weight=0)  # every layer, however small


def batch(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, 50, (5, 9), generator=g)
    src[1, 6:] = 0
    src[3, 4:] = 0
    return src, src != 0


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch build has no oneDNN at all")
def test_the_private_onednn_ops_exist_on_the_installed_torch():
    """nmt/model/fast.py relies on private torch.ops.mkldnn ops; a torch upgrade that drops them turns the packed
    linear layers off silently (see the fallback test below): this test makes it loud."""
    missing = [name for name in fast.PRIVATE_OPS if not hasattr(torch.ops.mkldnn, name)]
    assert not missing, f"torch {torch.__version__} has no torch.ops.mkldnn.{missing}: PackedLinear is off"
    assert fast._MKLDNN is not None


def test_without_the_private_ops_inference_falls_back_to_the_plain_path(monkeypatch):
    monkeypatch.setattr(fast, "_MKLDNN", None)
    model, packed, n = tiny_pair()
    assert n == 0 and not any(isinstance(m, fast.PackedLinear) for m in packed.modules())
    assert _cpu_fast_paths(packed) is FAST_OPS  # the search ops do not need oneDNN
    src, src_mask = batch()
    options = SearchOptions(max_len_a=1.0, max_len_b=5)
    assert [h.tokens for (h,) in greedy_search(packed, src, src_mask, options, ops=FAST_OPS)] == \
        [h.tokens for (h,) in greedy_search(model, src, src_mask, options)]


@needs_onednn
def test_packs_every_linear_and_keeps_the_state_dict():
    model, packed, n = tiny_pair()
    linears = [m for m in packed.modules() if isinstance(m, torch.nn.Linear)]
    assert n == len(linears) > 0
    assert all(hasattr(m, "_packed_weight") for m in linears)
    assert packed.state_dict().keys() == model.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(packed.state_dict().values(), model.state_dict().values()))


@needs_onednn
def test_small_layers_keep_f_linear():
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 1024)).eval()
    assert fast.pack_linear_weights(model) == 1
    assert not hasattr(model[0], "_packed_weight") and hasattr(model[1], "_packed_weight")


@needs_onednn
def test_packed_linear_matches_f_linear_for_few_and_many_rows():
    lin = torch.nn.Linear(24, 40).eval()
    ref = copy.deepcopy(lin)
    fast.pack_linear_weights(lin, max_rows=16, min_weight=0)
    with torch.inference_mode():
        for shape in [(24,), (1, 24), (7, 24), (3, 5, 24), (16, 24), (17, 24), (0, 24)]:  # packed up to 16 rows, then F.linear
            x = torch.randn(*shape)
            torch.testing.assert_close(lin(x), ref(x), rtol=1e-5, atol=1e-5)


@needs_onednn
def test_packed_model_decodes_like_the_unpacked_one():
    model, packed, _ = tiny_pair()
    src, src_mask = batch()
    with torch.inference_mode():
        torch.testing.assert_close(packed(src, src_mask, src[:, :6]), model(src, src_mask, src[:, :6]),
                                   rtol=1e-5, atol=1e-5)
        options = SearchOptions(max_len_a=1.0, max_len_b=5)
        g_ref, g = greedy_search(model, src, src_mask, options), greedy_search(packed, src, src_mask, options)
        assert [h.tokens for (h,) in g] == [h.tokens for (h,) in g_ref]
        options = SearchOptions(beam_size=4, nbest=2, max_len_a=1.0, max_len_b=5)
        b_ref = beam_search(model, src, src_mask, options)
        b = beam_search(packed, src, src_mask, options)
        assert [[h.tokens for h in hs] for hs in b] == [[h.tokens for h in hs] for hs in b_ref]
        for hs, hs_ref in zip(b, b_ref):
            for h, r in zip(hs, hs_ref):
                assert h.score == pytest.approx(r.score, abs=1e-4)


@needs_onednn
def test_training_mode_bypasses_the_packed_weights():
    model, packed, _ = tiny_pair()
    src, src_mask = batch()
    for m in (model, packed):
        m.train()
        torch.manual_seed(5)  # same dropout masks
        m(src, src_mask, src[:, :6]).square().mean().backward()
    for (name, p), q in zip(model.named_parameters(), packed.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6, msg=name)


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setenv("NMT_CPU_TUNING", "0")
    assert not cpu_tuning()
    _, packed, n = tiny_pair()
    assert n == 0 and not any(hasattr(m, "_packed_weight") for m in packed.modules())


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's (Linux)")
@pytest.mark.parametrize("inference", [False, True])
def test_tune_malloc_applies_on_glibc_and_not_when_switched_off(inference):
    code = f"from nmt.device import tune_malloc; print(tune_malloc(inference={inference}))"
    on = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    off = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"NMT_CPU_TUNING": "0", "PATH": "/usr/bin:/bin"})
    assert off.stdout.strip() == "False"
    import platform
    if platform.libc_ver()[0] == "glibc":
        assert on.stdout.strip() == "True"


# --------------------------------------------------------------------------- search ops

def test_blocked_topk_and_argmax_equal_torch():
    """The blocked top-k (wide rows) returns exactly torch.topk's values and indices, -inf included."""
    g = torch.Generator().manual_seed(0)
    for rows, cols, K in [(3, 8000, 5), (4, 40000, 5), (2, 640, 4), (5, 8000, 1), (3, 29, 5)]:
        x = torch.randn(rows, cols, generator=g)
        x[0, : cols // 2] = float("-inf")
        x[-1, 1::3] = float("-inf")
        top, idx = blocked_topk(x, K)
        ref = x.topk(K, dim=1)
        assert torch.equal(top, ref.values) and torch.equal(idx, ref.indices)
        best, arg = blocked_argmax(x)
        assert torch.equal(best, x.max(dim=1).values) and torch.equal(arg, x.max(dim=1).indices)


@pytest.mark.parametrize("V", [50, 640])  # 640: wide enough for the blocked top-k
def test_search_with_fast_ops_equals_plain_search(V):
    """Greedy and beam search with FAST_OPS (blocked top-k + reusing cache): the same hypotheses and
    scores as with PLAIN_OPS (torch.topk + DecoderCache)."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(d_model=32, n_heads=4, layers=2, ffn_dim=64, dropout=0.0, max_positions=64),
                        V, V).eval()
    with torch.no_grad():
        model.output_proj.weight.normal_(0.0, 0.5)
    g = torch.Generator().manual_seed(3)
    src = torch.randint(4, V, (6, 8), generator=g)
    src[2, 5:] = 0
    src[4, 3:] = 0
    mask = src != 0
    kw = dict(max_len_a=1.0, max_len_b=6)
    for ops_a, ops_b in [(PLAIN_OPS, FAST_OPS)]:
        ga, gb = (greedy_search(model, src, mask, SearchOptions(**kw), ops=o) for o in (ops_a, ops_b))
        assert ga == gb
        for K in (2, 5):
            options = SearchOptions(beam_size=K, nbest=K, **kw)
            ba, bb = (beam_search(model, src, mask, options, ops=o) for o in (ops_a, ops_b))
            assert ba == bb


# --------------------------------------------------------------------------- dropout

def test_install_for_training_swaps_only_dropout_layers():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(d_model=16, n_heads=2, layers=1, ffn_dim=32, max_positions=16), 20, 20)
    plain = [m for m in model.modules() if type(m) is torch.nn.Dropout]
    assert install_for_training(model) == len(plain) > 0
    assert all(type(m) is NumpyDropout for m in plain)
    assert model.state_dict().keys() == Transformer(model.cfg, 20, 20).state_dict().keys()


def test_dropout_is_identity_in_eval_or_with_p_zero():
    x = torch.randn(50, 40)
    d = NumpyDropout(0.3).eval()
    assert d(x) is x
    assert NumpyDropout(0.0).train()(x) is x


def test_dropout_rate_scale_and_gradient():
    """Same semantics as nn.Dropout: a share p of entries zeroed, the others scaled by 1/(1-p),
    gradient through the same mask."""
    p = 0.1
    x = torch.randn(1000, 1000).abs().add_(0.1).requires_grad_()  # no zeros: a zero in y means dropped
    torch.manual_seed(0)
    y = NumpyDropout(p).train()(x)
    dropped = y == 0
    n = x.numel()
    assert abs(dropped.sum().item() - p * n) < 5 * math.sqrt(n * p * (1 - p))  # binomial, 5 sigma
    torch.testing.assert_close(y[~dropped], x[~dropped] * (1 / (1 - p)), rtol=0, atol=0)  # kept: x/(1-p), as F.dropout
    (y * torch.arange(n, dtype=torch.float).view_as(x)).sum().backward()
    expected = torch.arange(n, dtype=torch.float).view_as(x) * (~dropped) / (1 - p)
    torch.testing.assert_close(x.grad, expected)
    # neighbouring entries are independent (the two halves of each 64-bit draw are both used)
    pairs = dropped.view(-1, 2)
    both = (pairs[:, 0] & pairs[:, 1]).float().mean().item()
    assert abs(both - p * p) < 5 * math.sqrt(p * p / pairs.shape[0])


def test_dropout_masks_follow_torch_seed():
    x = torch.ones(64, 64)
    d = NumpyDropout(0.5).train()
    torch.manual_seed(3)
    a, b = d(x), d(x)
    torch.manual_seed(3)
    assert torch.equal(d(x), a) and torch.equal(d(x), b)
    assert not torch.equal(a, b)
    assert torch.equal(NumpyDropout(1.0).train()(x), torch.zeros_like(x))
