"""Learning-rate schedules (against the formulas, at chosen steps) and parameter groups."""

import math
import os

import pytest
import torch
from torch import nn

from nmt.config import TrainConfig
from nmt.training.optim import build_optimizer, build_scheduler, lr_at, param_groups
from nmt.config import load_config
from helpers import ROOT


def _lrs(cfg: TrainConfig, d_model: int, n: int) -> list[float]:
    """lr used by updates 1..n, read from a real optimizer driven by the real scheduler."""
    p = nn.Parameter(torch.zeros(2, 2))
    opt = build_optimizer(nn.ParameterList([p]), cfg, torch.device("cpu"))
    sched = build_scheduler(opt, cfg, d_model)
    out = []
    for _ in range(n):
        out.append(opt.param_groups[0]["lr"])
        p.grad = torch.ones_like(p)
        opt.step()
        sched.step()
    return out


CASES = [
    # (config, d_model, {step: expected lr})
    (TrainConfig(schedule="inverse_sqrt", lr=1e-3, warmup_steps=4), 64,
     {1: 2.5e-4, 2: 5e-4, 4: 1e-3, 5: 1e-3 * math.sqrt(4 / 5), 16: 5e-4}),
    (TrainConfig(schedule="noam", lr=2.0, warmup_steps=4), 64,
     {1: 2 * 64 ** -0.5 * 1 * 4 ** -1.5, 4: 2 / 8 * 0.5, 16: 2 / 8 * 0.25}),
    (TrainConfig(schedule="cosine", lr=1.0, min_lr=0.1, warmup_steps=2, max_steps=12), 64,
     {1: 0.5, 2: 1.0, 7: 0.55, 12: 0.1, 20: 0.1}),
    (TrainConfig(schedule="linear", lr=1.0, min_lr=0.1, warmup_steps=2, max_steps=12), 64,
     {1: 0.5, 2: 1.0, 4: 0.82, 7: 0.55, 12: 0.1, 20: 0.1}),
    (TrainConfig(schedule="constant", lr=0.3, warmup_steps=3), 64, {1: 0.1, 2: 0.2, 3: 0.3, 50: 0.3}),
    (TrainConfig(schedule="constant", lr=0.3, warmup_steps=0), 64, {1: 0.3, 2: 0.3}),
    (TrainConfig(schedule="inverse_sqrt", lr=1.0, warmup_steps=0), 64, {1: 1.0, 4: 0.5}),
]


@pytest.mark.parametrize("cfg,d_model,expected", CASES, ids=lambda x: getattr(x, "schedule", ""))
def test_schedule_values(cfg, d_model, expected):
    lrs = _lrs(cfg, d_model, max(expected))
    for step, lr in expected.items():
        assert lr_at(step, cfg, d_model) == pytest.approx(lr, rel=1e-9), step
        assert lrs[step - 1] == pytest.approx(lr, rel=1e-9), step


def test_scheduler_state_resumes():
    cfg = TrainConfig(schedule="inverse_sqrt", lr=1e-3, warmup_steps=3)
    p = nn.Parameter(torch.zeros(1))
    opt = build_optimizer(nn.ParameterList([p]), cfg, torch.device("cpu"))
    sched = build_scheduler(opt, cfg, 64)
    for _ in range(5):
        p.grad = torch.ones_like(p)
        opt.step()
        sched.step()
    opt2 = build_optimizer(nn.ParameterList([nn.Parameter(torch.zeros(1))]), cfg, torch.device("cpu"))
    sched2 = build_scheduler(opt2, cfg, 64)
    opt2.load_state_dict(opt.state_dict())
    sched2.load_state_dict(sched.state_dict())
    assert opt2.param_groups[0]["lr"] == pytest.approx(lr_at(6, cfg, 64))


def test_param_groups_decay_matrices_only():
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 4), nn.LayerNorm(4))
    groups = param_groups(model, 0.01)
    decay = {id(p) for p in groups[0]["params"]}
    no_decay = {id(p) for p in groups[1]["params"]}
    assert groups[0]["weight_decay"] == 0.01 and groups[1]["weight_decay"] == 0.0
    assert decay == {id(model[0].weight), id(model[1].weight)}
    assert no_decay == {id(model[1].bias), id(model[2].weight), id(model[2].bias)}


def test_adamw_step_matches_reference_and_is_fused_on_cpu():
    cfg = TrainConfig(optimizer="adamw", lr=0.1, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.5)
    lin = nn.Linear(3, 2)
    w0, b0 = lin.weight.detach().clone(), lin.bias.detach().clone()
    opt = build_optimizer(lin, cfg, torch.device("cpu"))
    assert opt.defaults["fused"] is True
    g = torch.full_like(lin.weight, 2.0)
    lin.weight.grad, lin.bias.grad = g, torch.full_like(lin.bias, -3.0)
    opt.step()
    # first Adam step: m/(sqrt(v)+eps) = sign(g) after bias correction; decoupled decay on the weight only
    torch.testing.assert_close(lin.weight.detach(), w0 * (1 - 0.1 * 0.5) - 0.1)
    torch.testing.assert_close(lin.bias.detach(), b0 + 0.1)


# --------------------------------------------------------------------------- time-keyed schedules

def test_time_clock_cosine_reaches_min_lr_at_the_budget_end():
    cfg = TrainConfig(lr=1e-3, schedule="cosine", schedule_clock="time", max_time=600.0, warmup_fraction=0.1,
                      min_lr=1e-5)
    assert lr_at(30.0, cfg, 512) == pytest.approx(1e-3 * 30 / 60)  # warmup: 10% of 600 s
    assert lr_at(60.0, cfg, 512) == pytest.approx(1e-3)
    assert lr_at(330.0, cfg, 512) == pytest.approx(1e-5 + (1e-3 - 1e-5) * 0.5)  # half way through the decay
    assert lr_at(600.0, cfg, 512) == pytest.approx(1e-5) and lr_at(900.0, cfg, 512) == pytest.approx(1e-5)
    lin = TrainConfig(lr=1e-3, schedule="linear", max_steps=100, warmup_fraction=0.2)  # steps clock, fractional warmup
    assert lr_at(10, lin, 512) == pytest.approx(0.5e-3) and lr_at(60, lin, 512) == pytest.approx(0.5e-3)


def test_time_clock_scheduler_reads_the_clock_at_each_update():
    cfg = TrainConfig(lr=1e-3, schedule="linear", schedule_clock="time", max_time=100.0, warmup_fraction=0.0,
                      warmup_steps=0, min_lr=0.0)
    now = [0.0]
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=cfg.lr)
    sched = build_scheduler(opt, cfg, 512, lambda: now[0])
    for t, want in ((25.0, 0.75e-3), (50.0, 0.5e-3), (100.0, 0.0)):
        now[0] = t
        opt.step()
        sched.step()
        assert opt.param_groups[0]["lr"] == pytest.approx(want, abs=1e-8)
    with pytest.raises(ValueError, match="clock"):
        build_scheduler(opt, cfg, 512)


def test_decay_fraction_holds_the_peak_then_decays():
    """Warmup-stable-decay: with decay_fraction f the lr stays at its peak until the last f of the
    post-warmup span, then decays (linear or cosine) to min_lr at the end."""
    lin = TrainConfig(lr=1e-3, schedule="linear", max_steps=100, warmup_steps=10, decay_fraction=0.5, min_lr=0.0)
    assert [lr_at(s, lin, 512) for s in (10, 54, 55)] == pytest.approx([1e-3, 1e-3, 1e-3])
    assert lr_at(77.5, lin, 512) == pytest.approx(0.5e-3) and lr_at(100, lin, 512) == pytest.approx(0.0)
    cos = TrainConfig(lr=1e-3, schedule="cosine", max_time=100.0, schedule_clock="time", warmup_fraction=0.1,
                      decay_fraction=0.2, min_lr=1e-5)
    assert lr_at(50.0, cos, 512) == pytest.approx(1e-3) and lr_at(82.0, cos, 512) == pytest.approx(1e-3)
    assert lr_at(91.0, cos, 512) == pytest.approx(1e-5 + (1e-3 - 1e-5) * 0.5) and lr_at(100.0, cos, 512) == pytest.approx(1e-5)
    assert lr_at(60, TrainConfig(lr=1e-3, schedule="linear", max_steps=100, warmup_steps=10), 512) == \
        pytest.approx(1e-3 * (1 - 50 / 90))  # decay_fraction 1 (the default): decay over the whole span


# --------------------------------------------------------------------------- the shipped recipes' schedules

@pytest.mark.parametrize("path", ["quickstart.yaml", "quickstart-30min.yaml", "bible-es-en.yaml"])
def test_shipped_schedules_are_unchanged(path, monkeypatch):
    """The recipes' learning rates at a few points of their budget (values of the landed main)."""
    from nmt.training.optim import lr_at

    monkeypatch.chdir(ROOT)
    cfg = load_config(os.path.join("configs", path))
    want = {"quickstart.yaml": [6.6667e-06, 0.002, 0.00069282, 0.0002],
            "quickstart-30min.yaml": [1.1111e-05, 0.002, 0.0014444, 0.0],
            "bible-es-en.yaml": [3.5e-07, 0.000105, 0.0006261, 0.00018074]}[path]
    clock = [1, 300, 2500, 30000] if cfg.train.schedule_clock == "steps" else [1, 180, 630, 1800]
    assert [lr_at(t, cfg.train, cfg.model.d_model) for t in clock] == pytest.approx(want, rel=1e-4)
