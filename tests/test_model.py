"""Transformer: against torch.nn's reference layers, causality, padding, counts, training."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nmt.config import ModelConfig
from nmt.masks import padding_mask
from nmt.layout import PAD_ID
from nmt.model.transformer import Transformer, sinusoidal_positions

V = 37


def tiny_cfg(**kw) -> ModelConfig:
    base = dict(d_model=32, n_heads=4, layers=2, ffn_dim=48, max_positions=64, dropout=0.1)
    base.update(kw)
    return ModelConfig(**base)


def tiny_model(seed=0, src_vocab=V, tgt_vocab=V, perturb=True, **kw) -> Transformer:
    """A seeded tiny model in eval mode; `perturb` moves every weight off its init
    (LayerNorms start as identical identities, biases as zeros: miswiring would hide)."""
    torch.manual_seed(seed)
    model = Transformer(tiny_cfg(**kw), src_vocab, tgt_vocab).eval()
    if perturb:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.2 * torch.randn_like(p))
    return model


def batch(lengths, vocab=V, seed=1, max_len=None):
    """Right-padded random ids [B,L] and their mask [B,L] (True = token)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(lengths)
    mask = padding_mask(lengths, max_len)
    ids = torch.randint(4, vocab, mask.shape, generator=g)
    return ids.masked_fill(~mask, PAD_ID), mask


# ----------------------------------------------------------------------------- reference

def reference_forward(model: Transformer, src, src_mask, tgt):
    """The same network assembled from torch.nn.TransformerEncoderLayer/DecoderLayer
    (PyTorch's own attention, FFN and norm wiring), with our weights copied in."""
    cfg = model.cfg
    D, pre = cfg.d_model, cfg.norm == "pre"
    activation = F.silu if cfg.activation == "silu" else cfg.activation
    kw = dict(d_model=D, nhead=cfg.n_heads, dim_feedforward=cfg.ffn_dim, dropout=0.0,
              activation=activation, batch_first=True, norm_first=pre)
    enc = nn.ModuleList(nn.TransformerEncoderLayer(**kw) for _ in model.encoder.layers)
    dec = nn.ModuleList(nn.TransformerDecoderLayer(**kw) for _ in model.decoder.layers)
    with torch.no_grad():
        for ref, ours in zip(enc, model.encoder.layers):
            ref.self_attn.in_proj_weight.copy_(ours.self_attn.qkv_proj.weight)
            ref.self_attn.in_proj_bias.copy_(ours.self_attn.qkv_proj.bias)
            ref.self_attn.out_proj.load_state_dict(ours.self_attn.out_proj.state_dict())
            ref.linear1.load_state_dict(ours.ffn.fc1.state_dict())
            ref.linear2.load_state_dict(ours.ffn.fc2.state_dict())
            ref.norm1.load_state_dict(ours.norm1.state_dict())
            ref.norm2.load_state_dict(ours.norm2.state_dict())
        for ref, ours in zip(dec, model.decoder.layers):
            ref.self_attn.in_proj_weight.copy_(ours.self_attn.qkv_proj.weight)
            ref.self_attn.in_proj_bias.copy_(ours.self_attn.qkv_proj.bias)
            ref.self_attn.out_proj.load_state_dict(ours.self_attn.out_proj.state_dict())
            ca = ours.cross_attn
            ref.multihead_attn.in_proj_weight.copy_(torch.cat([ca.q_proj.weight, ca.kv_proj.weight]))
            ref.multihead_attn.in_proj_bias.copy_(torch.cat([ca.q_proj.bias, ca.kv_proj.bias]))
            ref.multihead_attn.out_proj.load_state_dict(ca.out_proj.state_dict())
            ref.linear1.load_state_dict(ours.ffn.fc1.state_dict())
            ref.linear2.load_state_dict(ours.ffn.fc2.state_dict())
            for n in ("norm1", "norm2", "norm3"):
                getattr(ref, n).load_state_dict(getattr(ours, n).state_dict())
    enc.eval(), dec.eval()

    def positions(L, table):
        if cfg.positions == "learned":
            return table.weight[:L]
        return torch.tensor([sinusoid(p + cfg.position_offset) for p in range(L)])

    def sinusoid(p):
        if cfg.positions == "sinusoidal":  # interleaved
            return [math.sin(p / 10000 ** (i / D)) if i % 2 == 0 else math.cos(p / 10000 ** ((i - 1) / D)) for i in range(D)]
        if cfg.positions == "sinusoidal_halves":  # MarianMT
            angles = [p / 10000 ** (2 * i / D) for i in range(D // 2)]
        else:  # sinusoidal_fairseq
            angles = [p * 10000 ** (-i / (D // 2 - 1)) for i in range(D // 2)]
        return [math.sin(a) for a in angles] + [math.cos(a) for a in angles]

    scale = math.sqrt(D) if cfg.scale_embeddings else 1.0
    with torch.no_grad():
        x = model.src_embed.weight[src] * scale + positions(src.shape[1], getattr(model, "src_positions", None))
        pad = ~src_mask  # PyTorch's key_padding_mask convention: True = padding
        for layer in enc:
            x = layer(x, src_key_padding_mask=pad)
        if pre:
            x = model.encoder.final_norm(x)
        T = tgt.shape[1]
        causal = torch.triu(torch.full((T, T), float("-inf")), diagonal=1)
        y = model.tgt_embed.weight[tgt] * scale + positions(T, getattr(model, "tgt_positions", None))
        for layer in dec:
            y = layer(y, x, tgt_mask=causal, memory_key_padding_mask=pad)
        if pre:
            y = model.decoder.final_norm(y)
        bias = model.output_proj.bias if cfg.output_bias else 0.0
        return y @ model.output_proj.weight.T + bias


HF_OPTIONS = [  # the options of imported models (nmt/interop/hf.py), also usable from scratch
    dict(norm="post", activation="silu", positions="sinusoidal_halves", output_bias=True),  # MarianMT
    dict(norm="pre", positions="sinusoidal_fairseq", position_offset=2, scale_embeddings=False),  # M2M100-like
    dict(positions="sinusoidal", position_offset=3, output_bias=True, share_embeddings=False, tie_output=False),
]


@pytest.mark.parametrize("kw", [dict(norm="pre"), dict(norm="post"), dict(activation="gelu"),
                                dict(positions="learned", norm="post"), dict(share_embeddings=False, tie_output=False),
                                *HF_OPTIONS])
def test_matches_torch_nn_reference(kw):
    model = tiny_model(**kw)
    src, src_mask = batch([7, 3, 5])
    tgt, _ = batch([6, 6, 6], seed=2)
    with torch.no_grad():
        ours = model(src, src_mask, tgt)
    ref = reference_forward(model, src, src_mask, tgt)
    assert ours.shape == (3, 6, V)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


def test_output_bias_is_added_to_the_logits():
    model = tiny_model(output_bias=True)
    src, src_mask = batch([5])
    tgt, _ = batch([4], seed=2)
    with torch.no_grad():
        with_bias = model(src, src_mask, tgt)
        model.output_proj.bias.zero_()
        without = model(src, src_mask, tgt)
    assert (with_bias - without).abs().max() > 1e-3


def test_sinusoidal_table_is_the_papers_formula():
    table = sinusoidal_positions(50, 16)
    for p in (0, 1, 7, 49):
        for i in range(8):
            assert table[p, 2 * i].item() == pytest.approx(math.sin(p / 10000 ** (2 * i / 16)), abs=1e-6)
            assert table[p, 2 * i + 1].item() == pytest.approx(math.cos(p / 10000 ** (2 * i / 16)), abs=1e-6)


# ----------------------------------------------------------------------------- masking

@pytest.mark.parametrize("norm", ["pre", "post"])
def test_decoder_is_causal(norm):
    model = tiny_model(norm=norm)
    src, src_mask = batch([6, 4])
    tgt, _ = batch([9, 9], seed=3)
    changed = tgt.clone()
    changed[:, 5:] = torch.randint(4, V, (2, 4))
    with torch.no_grad():
        a, b = model(src, src_mask, tgt), model(src, src_mask, changed)
    torch.testing.assert_close(a[:, :5], b[:, :5], atol=1e-5, rtol=0)
    assert (a[:, 5:] - b[:, 5:]).abs().max() > 1e-3  # the changed positions do matter


@pytest.mark.parametrize("kw", [dict(norm="pre"), dict(norm="post", positions="learned")])
def test_source_padding_is_invisible(kw):
    model = tiny_model(**kw)
    src, src_mask = batch([5])
    tgt, _ = batch([7], seed=4)
    with torch.no_grad():
        alone = model(src, src_mask, tgt)
        padded = model(F.pad(src, (0, 4)), F.pad(src_mask, (0, 4)), tgt)
        longer, longer_mask = batch([11, 5, 8], seed=5)
        longer[1, :5] = src[0]
        in_batch = model(longer, longer_mask, torch.cat([batch([7], seed=6)[0], tgt, tgt]))
    torch.testing.assert_close(padded, alone, atol=1e-5, rtol=0)
    torch.testing.assert_close(in_batch[1], alone[0], atol=1e-5, rtol=0)


def test_target_right_padding_leaves_real_positions_unchanged():
    """No target padding mask: right padding cannot reach earlier real positions."""
    model = tiny_model()
    src, src_mask = batch([5, 5])
    tgt, _ = batch([4, 9], seed=7)
    with torch.no_grad():
        together = model(src, src_mask, tgt)
        alone = model(src[:1], src_mask[:1], tgt[:1, :4])
    torch.testing.assert_close(together[0, :4], alone[0], atol=1e-5, rtol=0)


def test_attention_dropout_is_off_in_eval_and_on_in_training():
    model = tiny_model(attention_dropout=0.5, dropout=0.0)
    reference = tiny_model(attention_dropout=0.0, dropout=0.0)
    src, src_mask = batch([6, 4])
    tgt, _ = batch([5, 5], seed=8)
    with torch.no_grad():
        torch.testing.assert_close(model(src, src_mask, tgt), reference(src, src_mask, tgt))
        model.train()
        assert not torch.allclose(model(src, src_mask, tgt), reference(src, src_mask, tgt))


def test_too_long_input_raises():
    model = tiny_model(max_positions=8)
    src, src_mask = batch([9])
    with pytest.raises(ValueError, match="max_positions"):
        model.encode(src, src_mask)


# ----------------------------------------------------------------------------- parameters

@pytest.mark.parametrize("share,tie", [(True, True), (False, True), (False, False), (True, False)])
@pytest.mark.parametrize("kw", [dict(), dict(norm="post"), dict(positions="learned"),
                                dict(encoder_layers=3, decoder_layers=1, activation="gelu"), dict(output_bias=True)])
def test_parameter_count_matches_closed_form(share, tie, kw):
    src_vocab, tgt_vocab = (V, V) if share else (V, V + 11)
    cfg = tiny_cfg(share_embeddings=share, tie_output=tie, **kw)
    model = Transformer(cfg, src_vocab, tgt_vocab)
    assert model.num_parameters() == parameter_count_formula(cfg, src_vocab, tgt_vocab)
    names = {n for n, _ in model.named_parameters()}
    assert ("output_proj.weight" in names) == (not tie)
    assert ("tgt_embed.weight" in names) == (not share)


def test_shared_and_tied_weights_are_one_tensor():
    model = tiny_model(share_embeddings=True, tie_output=True)
    assert model.src_embed.weight is model.tgt_embed.weight is model.output_proj.weight
    sep = tiny_model(share_embeddings=False, tie_output=True, tgt_vocab=V + 5)
    assert sep.src_embed.weight is not sep.tgt_embed.weight
    assert sep.output_proj.weight is sep.tgt_embed.weight
    src, src_mask = batch([4])
    with torch.no_grad():
        assert sep(src, src_mask, batch([3], vocab=V + 5)[0]).shape == (1, 3, V + 5)


def test_share_embeddings_needs_equal_vocabularies():
    with pytest.raises(ValueError, match="share_embeddings"):
        Transformer(tiny_cfg(share_embeddings=True), V, V + 1)


def test_parameter_names_are_stable():
    model = tiny_model(share_embeddings=False, tie_output=False)
    names = set(model.state_dict())
    for name in ("src_embed.weight", "tgt_embed.weight", "output_proj.weight", "encoder.final_norm.weight",
                 "encoder.layers.1.self_attn.qkv_proj.weight", "encoder.layers.0.self_attn.out_proj.bias",
                 "encoder.layers.0.ffn.fc1.weight", "encoder.layers.0.norm2.weight",
                 "decoder.layers.1.cross_attn.q_proj.weight", "decoder.layers.1.cross_attn.kv_proj.bias",
                 "decoder.layers.0.ffn.fc2.weight", "decoder.layers.0.norm3.bias", "decoder.final_norm.bias"):
        assert name in names
    assert not any("sinusoid" in n for n in names)  # a fixed table, not state


def test_initialisation():
    D = 64
    model = tiny_model(d_model=D, ffn_dim=128, share_embeddings=False, tie_output=False, perturb=False)
    for embed in (model.src_embed, model.tgt_embed):
        assert embed.weight[PAD_ID].abs().sum() == 0
        assert embed.weight[1:].std().item() == pytest.approx(D ** -0.5, rel=0.15)
    # Fused Q/K/V: each [D,D] block is xavier_uniform for a DxD matrix, bound sqrt(6/(2D)).
    bound = math.sqrt(6 / (2 * D))
    for block in model.encoder.layers[0].self_attn.qkv_proj.weight.chunk(3):
        assert block.abs().max() <= bound and block.abs().max() > 0.95 * bound
    for name, p in model.named_parameters():
        if name.endswith(".bias") and "norm" not in name:
            assert p.abs().sum() == 0, name


def test_pad_id_row_starts_at_zero_and_gets_no_gradient():
    torch.manual_seed(0)
    model = Transformer(tiny_cfg(share_embeddings=False, tie_output=False, output_bias=True), V, V, pad_id=V - 1)
    assert model.src_embed.weight[V - 1].abs().sum() == 0 and model.tgt_embed.weight[V - 1].abs().sum() == 0
    assert model.src_embed.weight[PAD_ID].abs().sum() > 0
    assert model.output_proj.bias.abs().sum() == 0
    src = torch.tensor([[5, 6, V - 1]])
    model(src, src != V - 1, torch.tensor([[V - 1, 7]])).sum().backward()
    assert model.src_embed.weight.grad[V - 1].abs().sum() == 0 and model.tgt_embed.weight.grad[V - 1].abs().sum() == 0
    assert model.src_embed.weight.grad[5].abs().sum() > 0


def test_initialisation_is_reproducible():
    a = tiny_model(seed=3, share_embeddings=False, tie_output=False, perturb=False)
    b = tiny_model(seed=3, share_embeddings=False, tie_output=False, perturb=False)
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, y), name


# ----------------------------------------------------------------------------- training

@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_trains_on_a_repeated_batch(precision):
    torch.manual_seed(0)
    model = Transformer(tiny_cfg(positions="learned", dropout=0.0), V, V).train()
    src, src_mask = batch([7, 5, 3])
    tgt, _ = batch([6, 4, 5], seed=9)
    tgt_in, tgt_out = F.pad(tgt, (1, 0), value=2)[:, :-1], tgt  # shift right after BOS
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(25):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = model(src, src_mask, tgt_in)
        loss = F.cross_entropy(logits.float().flatten(0, 1), tgt_out.flatten(), ignore_index=PAD_ID)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < 0.5 * losses[0]
    assert model.src_positions.weight.grad is not None and model.src_positions.weight.grad.abs().sum() > 0


def parameter_count_formula(cfg, src_vocab_size: int, tgt_vocab_size: int) -> int:
    """Closed-form number of distinct parameters of `Transformer(cfg, src_vocab_size, tgt_vocab_size)`."""
    D, F_ = cfg.d_model, cfg.ffn_dim
    attn = 4 * D * D + 4 * D  # Q, K, V, out: weights + biases (self- and cross-attention alike)
    ffn = 2 * D * F_ + F_ + D
    norm = 2 * D
    encoder = cfg.n_encoder_layers * (attn + ffn + 2 * norm)
    decoder = cfg.n_decoder_layers * (2 * attn + ffn + 3 * norm)
    finals = 2 * norm if cfg.norm == "pre" else 0
    embeddings = src_vocab_size * D + (0 if cfg.share_embeddings else tgt_vocab_size * D)
    positions = 2 * cfg.max_positions * D if cfg.positions == "learned" else 0
    output = (0 if cfg.tie_output else tgt_vocab_size * D) + (tgt_vocab_size if cfg.output_bias else 0)
    return encoder + decoder + finals + embeddings + positions + output


@pytest.mark.parametrize("kind", ["buckets", "same_source"])
def test_bucket_padded_and_unmasked_batches_give_the_padded_batchs_loss_and_gradients(kind):
    """Issue 56: a batch padded to its bucket's shape (extra columns and rows: data.length_buckets), and a
    batch of one source length run without a source mask (data.same_source_length), give the loss and
    gradients of the same pairs collated as today."""
    import numpy as np

    from nmt.data.batches import bucket_shape
    from nmt.layout import collate
    from nmt.training.loss import label_smoothed_nll
    from tests.helpers import from_lists, tiny_transformer

    r = np.random.default_rng(0)
    s = [6, 6, 6, 6] if kind == "same_source" else [3, 9, 6, 1]
    t = [4, 8, 0, 11]
    enc = from_lists([r.integers(4, 20, n).tolist() for n in s], [r.integers(4, 20, n).tolist() for n in t])
    idx = np.arange(4)
    shape = bucket_shape(np.array(s), np.array(t), [8, 16, 24], 96) if kind == "buckets" else None
    other = collate(enc, idx, shape=shape, masks=kind != "same_source")
    plain = collate(enc, idx)
    assert (other.src.shape != plain.src.shape) if kind == "buckets" else other.src_mask is None

    def loss_and_grads(b):
        model = tiny_transformer(seed=1)
        loss, _ = label_smoothed_nll(model(b.src, b.src_mask, b.tgt_in), b.tgt_out, 0.1)
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    (la, ga), (lb, gb) = loss_and_grads(plain), loss_and_grads(other)
    torch.testing.assert_close(lb, la, atol=1e-5, rtol=1e-6)
    assert ga.keys() == gb.keys()
    for name in ga:
        torch.testing.assert_close(gb[name], ga[name], atol=1e-6, rtol=1e-5, msg=name)
