"""`train.compile: true` (regional compilation of the layers, the compiled loss) against the eager fp32
path on CPU: the same losses over 20 steps, one compiled graph per layer stack for every batch shape,
unchanged parameter names, and a resumed compiled run equal to a straight one."""

from __future__ import annotations

import os

import pytest
import torch

from nmt.model import checkpoint as ckpt
from nmt.config import config_from_dict, replace
from nmt.training.logging_utils import RunLogger
from nmt.training.step import train_step
from tests.helpers import tiny_config_dict

pytestmark = pytest.mark.slow  # compiles with Inductor (C++ on CPU): tens of seconds


def _config(tmp_path, name: str, compile_: bool, **train):
    raw = tiny_config_dict(str(tmp_path), valid_bleu=False, metric="loss", valid_every=7, log_every=5,
                           warmup_steps=5, compile=compile_, **train)
    raw["name"] = name
    raw["model"].update(dropout=0.0)  # Inductor draws its own dropout masks: equal losses need none
    raw["data"]["train"]["max_sentences"] = 200
    raw["data"]["batch_tokens"] = 200  # 13 batches per epoch, of several shapes
    return config_from_dict(raw)


def _losses(cfg, steps: int) -> tuple[list[float], dict]:
    from nmt.data.batches import epoch_batches
    from nmt.layout import collate
    from nmt.train import build_training

    tr = build_training(cfg, cfg.run_dir, torch.device("cpu"), RunLogger(cfg.run_dir, enabled=False))
    index = epoch_batches(tr.train_data, cfg, 1)
    losses = []
    for i in range(steps):
        batch = collate(tr.train_data, index[i % len(index)], tr.tokenizer.specials)
        res = train_step(tr.forward, [batch], tr.optimizer, tr.scheduler, tr.precision, label_smoothing=0.1,
                         clip_norm=1.0, pad_id=tr.tokenizer.specials.pad, loss_fn=tr.loss_fn)
        assert res.updated
        losses.append(res.loss_sum.item() / res.n_tokens)
    return losses, {k: v.detach().clone() for k, v in tr.model.state_dict().items()}


def test_compiled_training_equals_eager_fp32(tmp_path):
    from torch._dynamo.utils import counters

    eager, w_eager = _losses(_config(tmp_path, "eager", False), 20)
    counters.clear()
    compiled, w_compiled = _losses(_config(tmp_path, "compiled", True), 20)
    assert counters["stats"]["unique_graphs"] <= 3  # encoder layer, decoder layer, loss: not one per layer or shape
    assert len(set(eager)) > 10  # the steps saw different batches
    for a, b in zip(compiled, eager):
        assert abs(a - b) <= 1e-5 * max(1.0, abs(b)), (compiled, eager)
    assert list(w_compiled) == list(w_eager)  # the same parameter names: checkpoints do not change
    for k in w_eager:
        a, b = w_compiled[k], w_eager[k]
        # the key biases: their gradient is 0 up to rounding (softmax ignores a constant per query), which
        # Adam normalises into steps of random sign; the other rows of the projection are compared
        if k.endswith("qkv_proj.bias"):  # [q | k | v]
            D = a.numel() // 3
            a, b = torch.cat([a[:D], a[2 * D:]]), torch.cat([b[:D], b[2 * D:]])
        elif k.endswith("kv_proj.bias"):  # [k | v]
            a, b = a[a.numel() // 2:], b[b.numel() // 2:]
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_compiled_resume_is_exact(tmp_path):
    from nmt.train import train

    straight = _config(tmp_path, "straight", True, max_steps=20)
    train(straight, quiet=True)
    split = _config(tmp_path, "split", True, max_steps=10)
    assert train(split, quiet=True)["step"] == 10
    assert train(replace(split, train=replace(split.train, max_steps=20)), resume=True, quiet=True)["step"] == 20
    a = ckpt.load_checkpoint(os.path.join(straight.run_dir, "checkpoints", "latest.pt"))
    b = ckpt.load_checkpoint(os.path.join(split.run_dir, "checkpoints", "latest.pt"))
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k


def test_length_buckets_bound_the_static_graphs_over_an_epoch(tmp_path, monkeypatch):
    """Issue 56: `train.compile` with data.length_buckets compiles static graphs (for CUDA graphs on a GPU):
    over a whole epoch, one per batch shape for each layer stack and the loss, and the buckets leave
    fewer shapes than the epoch's batches have without them."""
    import functools

    from torch._dynamo.utils import counters

    from nmt.data.batches import epoch_batches, training_batch
    from nmt.layout import collate
    from nmt.train import build_training

    # the graphs are what is counted: Dynamo's, without Inductor's C++ compilation of each
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    buckets = [12, 24, 48]
    cfg = _config(tmp_path, "static", True)
    cfg = replace(cfg, data=replace(cfg.data, length_buckets=buckets))
    tr = build_training(cfg, cfg.run_dir, torch.device("cpu"), RunLogger(cfg.run_dir, enabled=False))
    torch._dynamo.reset()
    counters.clear()
    shapes, unbucketed = set(), set()
    for b in epoch_batches(tr.train_data, cfg, 1):
        batch = training_batch(tr.train_data, b, cfg.data, tr.tokenizer.specials)
        shapes.add((tuple(batch.src.shape), tuple(batch.tgt_in.shape)))
        plain = collate(tr.train_data, b, tr.tokenizer.specials)
        unbucketed.add((tuple(plain.src.shape), tuple(plain.tgt_in.shape)))
        res = train_step(tr.forward, [batch], tr.optimizer, tr.scheduler, tr.precision, label_smoothing=0.1,
                         clip_norm=1.0, pad_id=tr.tokenizer.specials.pad, loss_fn=tr.loss_fn)
        assert res.updated
    assert 1 < len(shapes) <= len(buckets) < len(unbucketed)
    # encoder layer, decoder layer and loss, static: a graph per shape (dynamic shapes would make 3 in all)
    assert counters["stats"]["unique_graphs"] == 3 * len(shapes)


def test_static_layers_compile_every_shape_past_dynamos_default_limit(monkeypatch):
    """compile_layers(shapes=10) (data.length_buckets with 10 buckets): a static graph for each of 10 batch
    shapes in each layer stack; Dynamo's default recompile limit (8) would run the last two eagerly."""
    import functools

    from torch._dynamo.utils import counters

    from tests.helpers import tiny_transformer

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))  # graphs counted
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 8)  # (the default; restored afterwards)
    model = tiny_transformer().train()
    model.compile_layers(shapes=10)
    torch._dynamo.reset()
    counters.clear()
    for n in range(2, 12):  # 10 shapes [n, n]
        src = torch.randint(4, 20, (n, n))
        model(src, torch.ones(n, n, dtype=torch.bool), src).sum().backward()
    assert counters["stats"]["unique_graphs"] == 2 * 10  # encoder layer and decoder layer, per shape
