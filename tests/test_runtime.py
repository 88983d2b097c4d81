"""CPU runtime tuning (nmt/runtime.py): packed weights must not change what the model computes,
and both switches must turn off with NMT_CPU_TUNING=0.

The reference is the same model without packing (`F.linear`): every packed layer is
checked, full forward, cached decode steps, greedy and beam outputs, and training-mode
gradients (where packing must step aside).
"""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch

from nmt import runtime
from nmt.config import ModelConfig
from nmt.model import Transformer
from nmt.search import beam_search, greedy_search

pytestmark = pytest.mark.usefixtures("one_thread")

needs_onednn = pytest.mark.skipif(
    not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")),
    reason="this torch build has no oneDNN: pack_linear_weights is a no-op there")


def tiny_pair(seed: int = 0):
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=32, n_heads=4, layers=2, ffn_dim=64, dropout=0.1, max_positions=64)
    model = Transformer(cfg, 50, 50).eval()
    with torch.no_grad():  # non-zero biases and LayerNorm parameters (init leaves them 0 / 1)
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    packed = copy.deepcopy(model)
    return model, packed, runtime.pack_linear_weights(packed, min_weight=0)  # every layer, however small


def batch(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, 50, (5, 9), generator=g)
    src[1, 6:] = 0
    src[3, 4:] = 0
    return src, src != 0


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
    assert runtime.pack_linear_weights(model) == 1
    assert not hasattr(model[0], "_packed_weight") and hasattr(model[1], "_packed_weight")


@needs_onednn
def test_packed_linear_matches_f_linear_for_few_and_many_rows():
    lin = torch.nn.Linear(24, 40).eval()
    ref = copy.deepcopy(lin)
    runtime.pack_linear_weights(lin, max_rows=16, min_weight=0)
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
        kw = dict(max_len_a=1.0, max_len_b=5)
        g_ref, g = greedy_search(model, src, src_mask, **kw), greedy_search(packed, src, src_mask, **kw)
        assert [h.tokens for h in g] == [h.tokens for h in g_ref]
        b_ref = beam_search(model, src, src_mask, beam_size=4, nbest=2, **kw)
        b = beam_search(packed, src, src_mask, beam_size=4, nbest=2, **kw)
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
    assert not runtime.enabled()
    _, packed, n = tiny_pair()
    assert n == 0 and not any(hasattr(m, "_packed_weight") for m in packed.modules())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's (Linux)")
def test_tune_malloc_applies_on_glibc_and_not_when_switched_off():
    code = "from nmt.runtime import tune_malloc; print(tune_malloc())"
    on = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    off = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"NMT_CPU_TUNING": "0", "PATH": "/usr/bin:/bin"})
    assert off.stdout.strip() == "False"
    import platform
    if platform.libc_ver()[0] == "glibc":
        assert on.stdout.strip() == "True"
