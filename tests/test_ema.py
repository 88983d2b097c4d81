"""train.ema_decay: the moving average against a float64 loop, tied weights, what checkpoints hold,
validation on the average, bitwise resume."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
import torch

from nmt.model import checkpoint as ckpt
from nmt.config import ModelConfig, config_from_dict
from nmt.training.ema import EMA
from nmt.model.transformer import Transformer
from nmt.train import train

from helpers import tiny_config_dict

pytestmark = pytest.mark.usefixtures("one_thread")


def _model(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=16, n_heads=2, layers=1, ffn_dim=32, dropout=0.0, max_positions=16)
    return Transformer(cfg, 20, 20)  # shared embeddings, tied output


def test_average_equals_a_float64_loop_with_marians_warmup():
    model = _model()
    ema = EMA(model, decay=0.9)
    expected = {k: v.double().clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(1)
    for n in range(25):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.1)
        d = min(0.9, (1 + n) / (10 + n))  # Marian's warm-up: 0.1, 0.18, ... then 0.9
        for k, v in model.state_dict().items():
            expected[k] = d * expected[k] + (1 - d) * v.double()
        ema.update(model)
    averaged = ema.state_dict(model)
    assert ema.updates == 25 and set(averaged) == set(model.state_dict())
    for k, v in averaged.items():
        assert torch.allclose(v.double(), expected[k], atol=1e-6), k


def test_tied_weights_stay_one_tensor_and_applied_restores():
    model = _model()
    ema = EMA(model, decay=0.5)
    with torch.no_grad():
        model.src_embed.weight.add_(1.0)
    ema.update(model)
    state, averaged = model.state_dict(), ema.state_dict(model)
    tied = [(a, b) for a in state for b in state if a < b and state[a].data_ptr() == state[b].data_ptr()]
    assert tied, "the test model should tie its embeddings"
    for a, b in tied:
        assert averaged[a] is averaged[b]
    before = {k: v.clone() for k, v in state.items()}
    with ema.applied(model):
        for k, v in model.state_dict().items():
            assert torch.equal(v, averaged[k]), k
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def _cfg(tmp_path, name: str, **train):
    raw = tiny_config_dict(str(tmp_path), **{"valid_bleu": False, "metric": "loss", "valid_every": 7, "log_every": 5,
                                             "warmup_steps": 5, "ema_decay": 0.9, **train})
    raw["name"] = name
    raw["data"]["train"]["max_sentences"] = 200
    raw["data"]["batch_tokens"] = 200
    return config_from_dict(raw)


def test_checkpoints_hold_the_average_and_validation_scores_it(tmp_path):
    from nmt.layout import iter_batches
    from nmt.training.loss import label_smoothed_nll
    from nmt.data.batches import batch_indices

    cfg = _cfg(tmp_path, "ema", max_steps=14)
    result = train(cfg, quiet=True)
    saved = ckpt.load_checkpoint(os.path.join(cfg.run_dir, "checkpoints", "latest.pt"))
    ts = saved["train_state"]
    assert ts["ema"]["updates"] == 14 and set(ts["raw_model"]) == set(saved["model"])
    log = open(os.path.join(cfg.run_dir, "train.log"), encoding="utf-8").read()
    assert "valid step 7 " in log and "step 5 |" in log and "step 10 |" in log  # the loop logs and validates as without
    assert any(not torch.equal(saved["model"][k], ts["raw_model"][k]) for k in saved["model"])
    # the reported validation loss is the averaged weights' (teacher forcing over the validation set)
    model, tokenizer, _ = ckpt.load_for_inference(os.path.join(cfg.run_dir, "checkpoints", "latest.pt"))
    from helpers import prepare_data

    _, data = prepare_data(cfg, cfg.run_dir, log=lambda m: None)
    order = batch_indices(data.valid.src_lens, data.valid.tgt_lens, cfg.data.batch_tokens, cfg.seed, 0)
    loss = n = 0.0
    with torch.inference_mode():
        for b in iter_batches(data.valid, order, tokenizer.specials):
            value, _ = label_smoothed_nll(model(b.src, b.src_mask, b.tgt_in), b.tgt_out, cfg.train.label_smoothing)
            loss, n = loss + float(value), n + b.n_tgt_tokens
    assert result["valid"]["loss"] == pytest.approx(loss / n, rel=1e-5)
    best = ckpt.load_checkpoint(os.path.join(cfg.run_dir, "checkpoints", "best.pt"))
    assert "raw_model" in best["train_state"]


def test_resume_with_ema_is_bitwise_identical(tmp_path):
    straight = _cfg(tmp_path, "straight", max_steps=20, update_freq=2)
    train(straight, quiet=True)
    split = _cfg(tmp_path, "split", max_steps=10, update_freq=2)
    train(split, quiet=True)
    train(replace(split, train=replace(split.train, max_steps=20)), resume=True, quiet=True)
    a = ckpt.load_checkpoint(os.path.join(straight.run_dir, "checkpoints", "latest.pt"))
    b = ckpt.load_checkpoint(os.path.join(split.run_dir, "checkpoints", "latest.pt"))
    assert a["train_state"]["ema"] == b["train_state"]["ema"] == {"updates": 20}
    for part in ("model", "raw_model"):
        x = a["model"] if part == "model" else a["train_state"][part]
        y = b["model"] if part == "model" else b["train_state"][part]
        for k in x:
            assert torch.equal(x[k], y[k]), (part, k)


def test_off_by_default_and_turned_on_when_resuming(tmp_path):
    cfg = _cfg(tmp_path, "plain", max_steps=7, ema_decay=0.0)
    train(cfg, quiet=True)
    saved = ckpt.load_checkpoint(os.path.join(cfg.run_dir, "checkpoints", "latest.pt"))
    assert "raw_model" not in saved["train_state"] and "ema" not in saved["train_state"]
    on = replace(cfg, train=replace(cfg.train, max_steps=9, ema_decay=0.9))
    train(on, resume=True, quiet=True)  # the average starts from the resumed weights
    saved = ckpt.load_checkpoint(os.path.join(cfg.run_dir, "checkpoints", "latest.pt"))
    assert saved["train_state"]["ema"] == {"updates": 2}
