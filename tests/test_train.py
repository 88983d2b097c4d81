"""nmt.train: one step (accumulation, clipping, NaN skip), the loop end to end on the
synthetic task, resume equivalence, signals, TensorBoard output."""

import math
import os
import random
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from nmt.model import checkpoint as ckpt
from nmt.config import Config, ConfigError, config_from_dict, load_config, replace
from nmt.layout import collate
from nmt.translation.torch_engine import TorchEngine
from nmt.errors import UserError
from nmt.training.optim import lr_at
import nmt.training.step as step_mod
import nmt.training.trainer as train_mod
from nmt.training.step import setup_precision, train_step
from nmt.train import SignalStop, train
from nmt.training import rundir

from helpers import (ENV, ROOT, HostReads, NoSchedule, one_line_error, random_corpus, run_nmt, tiny_config, tiny_config_dict,
                     tiny_transformer, write_yaml)

CPU = torch.device("cpu")
FP32 = setup_precision("fp32", CPU)


pytestmark = pytest.mark.usefixtures("one_thread")


# --------------------------------------------------------------------------- train_step

def _sgd_step(batches, clip_norm=0.0):
    model = tiny_transformer()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = NoSchedule()
    before = {k: v.detach().clone() for k, v in model.named_parameters()}  # tied weights once
    res = train_step(model, batches, opt, sched, FP32, label_smoothing=0.1, clip_norm=clip_norm)
    delta = {k: before[k] - v.detach() for k, v in model.named_parameters()}  # = lr * (clipped) gradient
    return res, delta, sched


def test_update_freq_equals_one_big_batch():
    corpus = random_corpus(12)
    idx1, idx2 = np.arange(0, 5), np.arange(5, 12)
    res_acc, delta_acc, _ = _sgd_step([collate(corpus, idx1), collate(corpus, idx2)])
    res_one, delta_one, _ = _sgd_step([collate(corpus, np.concatenate([idx1, idx2]))])
    assert res_acc.n_tokens == res_one.n_tokens == int(corpus.tgt_lens.sum()) + 12
    torch.testing.assert_close(res_acc.loss_sum, res_one.loss_sum, rtol=1e-5, atol=1e-5)
    for k in delta_one:
        torch.testing.assert_close(delta_acc[k], delta_one[k], rtol=1e-4, atol=1e-6)
    # and the gradient really is normalised per token: not the sum of two per-batch means
    res_half, delta_half, _ = _sgd_step([collate(corpus, idx1)])
    assert not torch.allclose(delta_half["decoder.final_norm.weight"], delta_one["decoder.final_norm.weight"])


def test_clipping_and_reported_grad_norm():
    batches = [collate(random_corpus(12), np.arange(12))]
    res, delta, _ = _sgd_step(batches, clip_norm=0.0)
    full_norm = torch.sqrt(sum((d.double() ** 2).sum() for d in delta.values())).item()
    assert res.grad_norm.item() == pytest.approx(full_norm, rel=1e-5)
    res_c, delta_c, _ = _sgd_step(batches, clip_norm=full_norm / 4)
    clipped = torch.sqrt(sum((d.double() ** 2).sum() for d in delta_c.values()))
    assert res_c.grad_norm.item() == pytest.approx(full_norm, rel=1e-5)  # reported before clipping
    assert clipped.item() == pytest.approx(full_norm / 4, rel=1e-4)


def test_nonfinite_loss_skips_the_update(monkeypatch):
    real = step_mod.label_smoothed_nll
    monkeypatch.setattr(step_mod, "label_smoothed_nll", lambda *a: tuple(x * float("nan") for x in real(*a)))
    res, delta, sched = _sgd_step([collate(random_corpus(12), np.arange(12))])
    assert not res.updated and res.nonfinite_loss and sched.steps == 1  # (the trainer rewinds it: optim.rewind)
    assert all(torch.all(d == 0) for d in delta.values())


def test_precision_choices_on_cpu():
    auto = setup_precision("auto", CPU)
    assert auto.name == "fp32" and auto.dtype is None and auto.scaler is None
    bf16 = setup_precision("bf16", CPU)
    assert bf16.dtype is torch.bfloat16 and bf16.scaler is None
    model = tiny_transformer()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    res = train_step(model, [collate(random_corpus(12), np.arange(12))], opt, NoSchedule(), bf16,
                     label_smoothing=0.1, clip_norm=1.0)
    assert res.updated and math.isfinite(res.loss_sum.item())


def test_master_weights_follow_autocast_within_bf16_rounding():
    """train.master_weights: 50 AdamW steps with the model in bf16 and fp32 masters in the optimizer give
    the losses of bf16 autocast within bf16 rounding; after each step the model holds its masters rounded."""
    from nmt.training.step import MasterWeights

    batches = [collate(random_corpus(16, seed=k), np.arange(16)) for k in range(4)]
    runs = {}
    for mode in ("autocast", "master"):
        model = tiny_transformer()
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        prec = setup_precision("bf16", CPU)
        if mode == "master":
            prec.master = MasterWeights(model, opt, torch.bfloat16)
            assert all(p.dtype == torch.bfloat16 for p in model.parameters())
            assert all(p.dtype == torch.float32 for g in opt.param_groups for p in g["params"])
        losses = []
        for k in range(50):
            res = train_step(model, [batches[k % 4]], opt, NoSchedule(), prec, label_smoothing=0.1, clip_norm=1.0)
            losses.append(res.loss_sum.item() / res.n_tokens)
            if mode == "master":
                assert all(torch.equal(m, p.to(torch.bfloat16)) for m, p in prec.master.pairs)
        runs[mode] = losses
        if mode == "master":  # what a checkpoint holds: the fp32 masters under the model's names
            state, master = prec.state_dict(model), {id(m): p for m, p in prec.master.pairs}
            assert set(state) == set(model.state_dict()) and all(v.dtype == torch.float32 for v in state.values())
            assert all(torch.equal(state[k], master[id(p)]) for k, p in model.named_parameters())
    auto, master = np.array(runs["autocast"]), np.array(runs["master"])
    assert master[-5:].mean() < 0.9 * master[:5].mean()  # it learns: the comparison below means something
    assert np.abs(master - auto).max() / auto.mean() < 0.01


def test_signal_stop_first_flags_second_raises_and_handlers_restored():
    before = signal.getsignal(signal.SIGINT)
    with SignalStop() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)
        assert stop.requested == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
    assert signal.getsignal(signal.SIGINT) is before


# --------------------------------------------------------------------------- end to end

@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One 300-step run on the synthetic task, shared by the tests below."""
    cfg = tiny_config(str(tmp_path_factory.mktemp("e2e")))
    t0 = time.perf_counter()
    result = train(cfg, quiet=True)
    result["seconds"] = time.perf_counter() - t0
    return cfg, result


@pytest.mark.slow
def test_reaches_high_bleu_and_writes_the_run_dir(trained):
    cfg, result = trained
    assert result["step"] == 300 and result["reason"] == "max_steps 300"
    assert result["best"] >= 90, result
    run = cfg.run_dir
    names = sorted(os.listdir(os.path.join(run, "checkpoints")))
    assert names == ["best.pt", "latest.pt", "step_200.pt", "step_300.pt"]  # keep_last = 2
    assert os.path.isfile(os.path.join(run, "spm.model"))
    assert load_config(os.path.join(run, "config.yaml")) == cfg
    log = open(os.path.join(run, "train.log")).read()
    assert "parameters" in log and "valid step 300" in log and "src: " in log
    latest = ckpt.load_checkpoint(os.path.join(run, "checkpoints", "latest.pt"))
    assert latest["step"] == 300 and latest["train_state"]["best"] == pytest.approx(result["best"])


@pytest.mark.slow
def test_best_checkpoint_alone_translates_the_test_set(trained):
    import sacrebleu

    from nmt.translation.translate import translate_lines

    cfg, _ = trained
    model, tokenizer, loaded_cfg = ckpt.load_for_inference(os.path.join(cfg.run_dir, "checkpoints", "best.pt"), "cpu")
    assert not model.training and loaded_cfg == cfg
    src = open(cfg.data.test.src).read().splitlines()
    ref = open(cfg.data.test.tgt).read().splitlines()
    hyps = translate_lines(TorchEngine(model, tokenizer, cfg.decode), src, replace(cfg.decode, beam_size=1))
    assert sacrebleu.corpus_bleu(hyps, [ref]).score >= 90


@pytest.mark.slow
def test_tensorboard_scalars_and_samples(trained):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg, _ = trained
    acc = EventAccumulator(os.path.join(cfg.run_dir, "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for tag in ("train/loss", "train/ppl", "train/lr", "train/grad_norm", "train/tokens_per_s",
                "train/padding_efficiency", "valid/loss", "valid/ppl", "valid/bleu", "valid/chrf"):
        assert tag in tags, tag
    lrs = {e.step: e.value for e in acc.Scalars("train/lr")}
    assert sorted(lrs) == list(range(20, 301, 20))
    for step, value in lrs.items():  # the lr logged after step k is the one for update k+1
        assert value == pytest.approx(lr_at(step + 1, cfg.train, cfg.model.d_model), rel=1e-6)
    assert [e.step for e in acc.Scalars("valid/bleu")] == [100, 200, 300]
    assert acc.Scalars("valid/bleu")[-1].value >= 90
    assert any(t.startswith("valid/sample_1") for t in acc.Tags()["tensors"])


@pytest.mark.slow
def test_existing_run_needs_resume_and_finished_run_resumes_to_nothing(trained):
    cfg, result = trained
    with pytest.raises(UserError, match="--resume"):
        train(cfg, quiet=True)
    again = train(cfg, resume=True, quiet=True)
    assert again["step"] == 300 and again["best"] == pytest.approx(result["best"])


@pytest.mark.slow
def test_resume_with_another_model_config_names_both_values(trained):
    """A model key that differs from the run's checkpoint (e.g. a default that changed since the run
    started: model.positions) is named with both values, so it can be set back in the config."""
    import dataclasses

    cfg, _ = trained
    other = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, positions="sinusoidal", position_offset=0))
    with pytest.raises(UserError, match=r"the model config changed \(model.positions: 'sinusoidal_fairseq' in the "
                                        r"checkpoint, 'sinusoidal' now, model.position_offset: 1 in the checkpoint, 0 now\)"):
        train(other, resume=True, quiet=True)


def test_resume_without_checkpoint_is_an_error(tmp_path):
    with pytest.raises(UserError, match="cannot resume"):
        train(tiny_config(str(tmp_path)), resume=True, quiet=True)


# --------------------------------------------------------------------------- resume, NaN, signals

def _small(tmp_path, name: str, **train) -> "Config":
    raw = tiny_config_dict(str(tmp_path), **{"valid_bleu": False, "metric": "loss", "valid_every": 7,
                                             "log_every": 5, "warmup_steps": 5, **train})
    raw["name"] = name
    raw["data"]["train"]["max_sentences"] = 200
    raw["data"]["batch_tokens"] = 200  # 13 batches per epoch: the 10-step split point is mid-epoch
    return config_from_dict(raw)


def test_resume_is_bitwise_identical(tmp_path):
    straight = _small(tmp_path, "straight", max_steps=20, update_freq=2)
    train(straight, quiet=True)
    split = _small(tmp_path, "split", max_steps=10, update_freq=2)
    first = train(split, quiet=True)
    mid = ckpt.load_checkpoint(os.path.join(split.run_dir, "checkpoints", "latest.pt"))
    assert first["step"] == 10 and mid["train_state"]["batch_offset"] > 0  # resumes mid-epoch
    second = train(replace(split, train=replace(split.train, max_steps=20)), resume=True, quiet=True)
    assert second["step"] == 20 and second["epoch"] > 1
    a = ckpt.load_checkpoint(os.path.join(straight.run_dir, "checkpoints", "latest.pt"))
    b = ckpt.load_checkpoint(os.path.join(split.run_dir, "checkpoints", "latest.pt"))
    assert (a["epoch"], a["train_state"]["batch_offset"]) == (b["epoch"], b["train_state"]["batch_offset"])
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    sa, sb = a["train_state"]["optimizer"]["state"], b["train_state"]["optimizer"]["state"]
    for i in sa:
        assert torch.equal(sa[i]["exp_avg_sq"], sb[i]["exp_avg_sq"])


def test_training_steps_read_nothing_on_the_host(tmp_path, monkeypatch):
    """Two runs of 4 and 12 steps with nothing due between (no log line, validation or checkpoint) read tensor
    values on the host the same number of times: the steps in between read nothing (on the path a GPU runs:
    the CPU fast paths off). The code before read the finiteness of every step's loss."""
    monkeypatch.setenv("NMT_CPU_TUNING", "0")
    reads = []
    for steps in (4, 12):
        cfg = _small(tmp_path, f"reads{steps}", max_steps=steps, log_every=1000, valid_every=1000, warmup_steps=2)
        with HostReads() as counter:
            result = train(cfg, quiet=True)
        assert result["step"] == steps
        reads.append(counter.count)
    assert reads[1] == reads[0], reads


def test_a_chunked_loss_trains_the_same_weights(tmp_path):
    """train.loss_chunk computes the loss in pieces but its gradient row for row as the whole batch does:
    the same weights after a few steps."""
    weights = []
    for chunk in (0, 16):
        result = train(_small(tmp_path, f"chunk{chunk}", max_steps=4, warmup_steps=2, loss_chunk=chunk), quiet=True)
        model, _, _ = ckpt.load_for_inference(os.path.join(result["run_dir"], "checkpoints", "latest.pt"))
        weights.append(model.state_dict())
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_nan_steps_are_skipped_counted_and_bounded(tmp_path, monkeypatch):
    real, calls = step_mod.label_smoothed_nll, {"n": 0}

    def flaky(logits, target, eps, pad_id):
        calls["n"] += 1
        loss, nll = real(logits, target, eps, pad_id)
        bad = logits.requires_grad and calls["n"] in (3, 4)  # training calls 3 and 4 only
        return (loss * float("nan"), nll) if bad else (loss, nll)

    monkeypatch.setattr(step_mod, "label_smoothed_nll", flaky)
    result = train(_small(tmp_path, "nan", max_steps=6), quiet=True)
    assert result["step"] == 6 and result["nan_steps"] == 2
    log = open(os.path.join(result["run_dir"], "train.log")).read()
    assert "2 in a row, 2 in total" in log
    model, _, _ = ckpt.load_for_inference(os.path.join(result["run_dir"], "checkpoints", "latest.pt"))
    assert all(torch.isfinite(p).all() for p in model.parameters())

    monkeypatch.setattr(step_mod, "label_smoothed_nll", lambda *a: tuple(x * float("nan") for x in real(*a)))
    with pytest.raises(UserError, match=r"[3-6] non-finite losses in a row \(train.max_nan_steps=3\)"):
        train(_small(tmp_path, "allnan", max_steps=6, max_nan_steps=3), quiet=True)  # (read at the next log line)


SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from nmt.config import config_from_dict
from nmt.train import train
import json
raw = json.loads({raw!r})
result = train(config_from_dict(raw), quiet=True)
print("RESULT", result["step"], result["signal"], flush=True)
"""


@pytest.mark.slow
def test_sigint_finishes_step_saves_and_resumes(tmp_path):
    import json

    raw = tiny_config_dict(str(tmp_path), valid_bleu=False, metric="loss", valid_every=10_000, log_every=1,
                           max_steps=100_000)
    raw["name"] = "sig"
    script = SCRIPT.format(tests=os.path.dirname(__file__), raw=json.dumps(raw))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=root, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    log_path = os.path.join(raw["output_dir"], "sig", "train.log")
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            if os.path.exists(log_path) and "step 5 |" in open(log_path).read():
                break
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "received SIGINT" in err
    step = int(out.split("RESULT")[1].split()[0])
    assert step >= 5 and out.split()[-1] == str(int(signal.SIGINT))
    saved = ckpt.load_checkpoint(os.path.join(raw["output_dir"], "sig", "checkpoints", "latest.pt"))
    assert saved["step"] == step
    cfg = config_from_dict(raw)
    resumed = train(replace(cfg, train=replace(cfg.train, max_steps=step + 3)), resume=True, quiet=True)
    assert resumed["step"] == step + 3 and resumed["signal"] is None


def test_early_stopping_keeps_the_best_checkpoint(tmp_path, monkeypatch):
    losses = iter([3.0, 2.0, 2.5, 2.1, 1.0])  # best at the 2nd validation, then 2 without improvement

    def scripted(model, cfg, *args, **kwargs):
        v = next(losses)
        return {"loss": v, "nll": v, "ppl": math.exp(v)}

    monkeypatch.setattr(train_mod, "validate", scripted)
    result = train(_small(tmp_path, "early", max_steps=100, valid_every=3, patience=2), quiet=True)
    assert result["step"] == 12 and result["reason"].startswith("early stopping") and result["best"] == 2.0
    best = ckpt.load_checkpoint(os.path.join(result["run_dir"], "checkpoints", "best.pt"))
    assert best["step"] == 6 and best["train_state"]["bad_validations"] == 0


def test_a_signal_during_the_final_validation_sets_the_exit_code(tmp_path, monkeypatch):
    """Ctrl-C while the final validation ran (train.tune_decode off) was ignored: the run ended with no
    signal and `nmt train` exited 0. Now the validation finishes and saves, and the result carries the
    signal (exit 130) with one log line. (The validation is scripted and signals the process itself.)"""
    real = train_mod.validate
    calls = []

    def signalled(model, cfg, *args, **kwargs):
        calls.append(1)
        metrics = real(model, cfg, *args, **kwargs)
        if len(calls) == 2:  # the final one (the first is at valid_every)
            os.kill(os.getpid(), signal.SIGINT)
        return metrics
    monkeypatch.setattr(train_mod, "validate", signalled)
    result = train(_small(tmp_path, "final", max_steps=6, valid_every=4, tune_decode=False), quiet=True)
    assert len(calls) == 2 and result["step"] == 6 and result["signal"] == signal.SIGINT
    saved = ckpt.load_checkpoint(os.path.join(result["run_dir"], "checkpoints", "latest.pt"))
    assert saved["step"] == 6 and saved["train_state"]["last_valid_step"] == 6
    log = open(os.path.join(result["run_dir"], "train.log"), encoding="utf-8").read()
    assert "received SIGINT: stopping (the final validation had ended and saved)" in log


def test_max_epochs_and_max_time(tmp_path):
    from nmt.data.batches import epoch_batches, load_data
    from nmt.text.tokenizer import Tokenizer

    cfg = _small(tmp_path, "epochs", max_epochs=2, valid_every=1000)
    result = train(cfg, quiet=True)
    tokenizer = Tokenizer.load(cfg.run_dir)
    corpus = load_data(cfg, tokenizer, cfg.run_dir, lambda m: None).train
    per_epoch = [len(epoch_batches(corpus, cfg, e)) for e in (1, 2)]
    assert result["step"] == sum(per_epoch) and result["epoch"] == 3 and result["reason"] == "max_epochs 2"
    timed = train(_small(tmp_path, "timed", max_time=1e-6), quiet=True)
    assert timed["step"] == 0 and timed["reason"].startswith("max_time")


@pytest.mark.slow
def test_time_keyed_schedule_and_validation_every_minutes(tmp_path):
    """schedule_clock time: the lr warms up over 20% of max_time then decays to min_lr as the budget
    runs out; valid_every_minutes validates on the clock, not on the step count."""
    cfg = _small(tmp_path, "timed_cosine", max_steps=0, max_time=4.0, schedule="cosine", schedule_clock="time",
                 warmup_fraction=0.2, min_lr=1e-6, lr=1e-3, log_every=1, valid_every=100_000,
                 valid_every_minutes=0.01)
    result = train(cfg, quiet=True)
    assert result["reason"].startswith("max_time")
    log = open(os.path.join(result["run_dir"], "train.log")).read()
    lrs = [float(x) for x in re.findall(r"\| lr ([0-9.e+-]+) \|", log)]
    peak = lrs.index(max(lrs))
    assert max(lrs) > 5e-4 and lrs[-1] < 0.2 * max(lrs)  # warmed up, then decayed with the clock
    assert all(a >= b for a, b in zip(lrs[peak:], lrs[peak + 1:]))
    assert log.count("valid step") >= 3  # every 0.6 s of training, and at the end
    with pytest.raises(ConfigError, match="schedule_clock: time' needs 'train.max_time'"):
        _small(tmp_path, "bad", schedule_clock="time")


def test_valid_every_zero_validates_only_at_the_end(tmp_path):
    """valid_every 0 turns step-count validation off (a time budget uses valid_every_minutes): one
    validation, at the end."""
    result = train(_small(tmp_path, "end_only", max_steps=7, valid_every=0, log_every=1), quiet=True)
    log = open(os.path.join(result["run_dir"], "train.log")).read()
    assert re.findall(r"valid step (\d+) \|", log) == ["7"]


# --------------------------------------------------------------------------- signals, stale temporaries, the run lock, resume, kill -9

def test_signal_handler_never_writes(tmp_path):
    """A signal that arrives while train.log is being written must not write to it again (a
    reentrant write into a BufferedWriter raises RuntimeError mid-training): the handler only
    records the signal, and the loop reports it afterwards."""
    writes: list[str] = []
    busy = {"in_write": False}

    def log(msg: str) -> None:
        assert not busy["in_write"], "reentrant write from the signal handler"
        busy["in_write"] = True
        try:
            if not writes:
                os.kill(os.getpid(), signal.SIGTERM)  # the signal lands in the middle of this write
            time.sleep(0.01)
            writes.append(msg)
        finally:
            busy["in_write"] = False

    with SignalStop() as stop:
        log("step 1 | loss 3.0")
        assert stop.requested == signal.SIGTERM and writes == ["step 1 | loss 3.0"]
        stop.announce(log)
        stop.announce(log)  # once only
    assert len(writes) == 2 and "received SIGTERM" in writes[1]


@pytest.mark.slow
def test_signals_during_logging_always_leave_a_checkpoint(tmp_path):
    """SIGTERM while every step logs (log_every 1): the run ends with exit 143 and latest.pt, every time."""
    raw = tiny_config_dict(str(tmp_path), valid_bleu=False, metric="loss", valid_every=10_000, log_every=1,
                           max_steps=100_000)
    for trial in range(3):
        raw["name"] = f"sig{trial}"
        path = write_yaml(tmp_path / f"c{trial}.yaml", raw)
        proc = subprocess.Popen([sys.executable, "-m", "nmt", "train", "--config", path, "--quiet"], cwd=ROOT,
                                env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        log_path = os.path.join(raw["output_dir"], raw["name"], "train.log")
        deadline = time.time() + 120
        while time.time() < deadline and not (os.path.exists(log_path) and "step 3 |" in open(log_path).read()):
            time.sleep(0.05)
        time.sleep(0.05 * random.random())  # some moment while steps are being logged
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        assert b"reentrant" not in err and b"Traceback" not in err, err.decode()
        assert proc.returncode == 143, err.decode()
        assert b"received SIGTERM" in err
        saved = ckpt.load_checkpoint(os.path.join(raw["output_dir"], raw["name"], "checkpoints", "latest.pt"))
        assert saved["step"] >= 3


def test_a_killed_first_save_does_not_leave_the_run_stuck(tmp_path):
    """kill -9 while the first checkpoint is written leaves checkpoints/.tmp-*: it is not a
    checkpoint, a fresh start works and removes it."""
    raw = tiny_config_dict(str(tmp_path), max_steps=2, warmup_steps=1, valid_every=1000, valid_bleu=False, metric="loss")
    cfg = config_from_dict(raw)
    with pytest.raises(UserError, match="cannot resume: .* does not exist .*start without --resume"):
        train(cfg, resume=True, quiet=True)  # (a mistyped name made runs/NAME/.lock and checkpoints/)
    assert not os.path.exists(cfg.run_dir)
    d = os.path.join(cfg.run_dir, "checkpoints")
    os.makedirs(d)
    for name in (".tmp-abc123.pt.tmp", ".tmp-xyz.pt", ".tmp-link-77-best.pt.tmp"):  # old and new temp names
        open(os.path.join(d, name), "wb").write(b"partial")
    with pytest.raises(UserError, match="latest.pt does not exist.*start without --resume"):
        train(cfg, resume=True, quiet=True)
    result = train(cfg, quiet=True)
    assert result["step"] == 2
    assert sorted(os.listdir(d)) == ["best.pt", "latest.pt", "step_2.pt"]


@pytest.mark.slow
def test_a_second_train_on_the_same_run_directory_is_refused(tmp_path):
    raw = tiny_config_dict(str(tmp_path), max_steps=2, warmup_steps=1, valid_every=1000, valid_bleu=False, metric="loss")
    path = write_yaml(tmp_path / "c.yaml", raw)
    cfg = config_from_dict(raw)
    with rundir.RunLock(rundir.create(cfg.run_dir)):  # another nmt train holds the directory
        proc = run_nmt("train", "--config", path, "--quiet")
        one_line_error(proc, 2, f"in use by another nmt train (PID {os.getpid()})")
    assert rundir.checkpoint_files(cfg.run_dir) == []
    assert train(cfg, quiet=True)["step"] == 2  # released: the run goes ahead


@pytest.mark.slow
def test_master_weights_checkpoints_stay_fp32_and_resume_exactly(tmp_path):
    """train.master_weights (bf16 on CPU): latest.pt holds fp32 weights, and 3 steps + --resume to 6 equal
    6 straight steps bit for bit; refused in one line without bf16/fp16 and with train.ema_decay."""
    kw = dict(precision="bf16", master_weights=True, valid_every=1000, valid_bleu=False, metric="loss",
              warmup_steps=2)
    straight = tiny_config(str(tmp_path / "a"), max_steps=6, **kw)
    train(straight, quiet=True)
    split = tiny_config(str(tmp_path / "b"), max_steps=3, **kw)
    train(split, quiet=True)
    train(replace(split, train=replace(split.train, max_steps=6)), resume=True, quiet=True)
    a, b = (ckpt.load_checkpoint(os.path.join(c.run_dir, "checkpoints", "latest.pt")) for c in (straight, split))
    assert a["step"] == b["step"] == 6 and set(a["model"]) == set(b["model"])
    for k, v in a["model"].items():
        assert v.dtype == torch.float32 and torch.equal(v, b["model"][k]), k
    assert any(not torch.equal(v, v.to(torch.bfloat16).float()) for v in a["model"].values())  # fp32 masters, not bf16
    for state_a, state_b in zip(a["train_state"]["optimizer"]["state"].values(),
                                b["train_state"]["optimizer"]["state"].values()):
        assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)
    with pytest.raises(UserError, match="master_weights needs bf16 or fp16"):
        train(tiny_config(str(tmp_path / "c"), max_steps=3, warmup_steps=2, master_weights=True), quiet=True)
    with pytest.raises(UserError, match="ema_decay"):
        train(tiny_config(str(tmp_path / "d"), max_steps=3, ema_decay=0.9, **kw), quiet=True)


@pytest.mark.slow
def test_output_dir_that_is_a_file(tmp_path):
    raw = tiny_config_dict(str(tmp_path), max_steps=2, warmup_steps=1)
    open(tmp_path / "afile", "w").write("x")
    raw["output_dir"] = str(tmp_path / "afile")
    path = write_yaml(tmp_path / "c.yaml", raw)
    one_line_error(run_nmt("train", "--config", path, "--quiet"), 2, "is a file")


def test_resume_from_an_averaged_checkpoint_says_what_to_do(tmp_path):
    raw = tiny_config_dict(str(tmp_path), max_steps=2, warmup_steps=1, valid_every=1000, valid_bleu=False, metric="loss")
    cfg = config_from_dict(raw)
    train(cfg, quiet=True)
    latest = os.path.join(cfg.run_dir, "checkpoints", "latest.pt")
    ckpt.average_checkpoints([latest], str(tmp_path / "avg.pt"))
    os.replace(tmp_path / "avg.pt", latest)
    with pytest.raises(UserError, match="no training state.*train.init_from"):
        train(cfg, resume=True, quiet=True)


def _saved_then_wait(proc, path, delay):
    """Wait until `proc` has replaced `path` (or ended), then `delay` seconds more."""
    def mtime():
        try:
            return os.stat(path).st_mtime_ns
        except FileNotFoundError:
            return None
    before, deadline = mtime(), time.time() + 120
    while proc.poll() is None and mtime() == before and time.time() < deadline:
        time.sleep(0.005)
    time.sleep(delay)


def _kill_at(proc, wait):
    """SIGKILL `proc` once `wait()` returns; False if it had already ended."""
    wait()
    if proc.poll() is not None:
        return False
    proc.kill()
    return True


@pytest.mark.slow
def test_kill_9_at_random_moments_then_resume_equals_an_uninterrupted_run(tmp_path):
    """SIGKILL a tiny training run at random moments (saves every step, so some kills land in a
    save), restart it (--resume once latest.pt exists) until it finishes: the final weights (the
    trained ones and their moving average, train.ema_decay) equal an uninterrupted run's, bit for
    bit, and no restart is ever refused."""
    raw = tiny_config_dict(str(tmp_path), max_steps=150, valid_every=50, valid_bleu=False, metric="loss",
                           save_every=1, log_every=50, keep_last=2, ema_decay=0.99)  # the average resumes too
    raw["name"] = "killed"
    path = write_yaml(tmp_path / "killed.yaml", raw)
    run = os.path.join(raw["output_dir"], "killed")
    latest = os.path.join(run, "checkpoints", "latest.pt")
    rng = random.Random(0)
    kills, mid_run, finished = 0, 0, False
    deadline = time.time() + 300
    while not finished and time.time() < deadline:
        resume = os.path.exists(latest)
        cmd = [sys.executable, "-m", "nmt", "train", "--config", path, "--quiet"] + (["--resume"] if resume else [])
        proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if kills == 0:  # the first kill at a random moment, maybe before the first save
            killed = _kill_at(proc, lambda: time.sleep(rng.uniform(0.5, 3.0)))
        elif mid_run < 3:  # then a random moment after this process's first save: timed by the run, not the clock
            killed = _kill_at(proc, lambda: _saved_then_wait(proc, latest, rng.uniform(0.0, 0.3)))
        else:
            killed = False
        kills += killed
        _, err = proc.communicate(timeout=300)
        if proc.returncode not in (0, -signal.SIGKILL):
            pytest.fail(f"restart failed ({proc.returncode}): {err.decode()}")
        finished = proc.returncode == 0
        mid_run += not finished and os.path.exists(latest)  # killed while training and saving every step
    assert finished and mid_run >= 2, (kills, mid_run)
    reference = dict(raw, name="reference")
    train(config_from_dict(reference), quiet=True)
    got = ckpt.load_checkpoint(os.path.join(run, "checkpoints", "latest.pt"))
    want = ckpt.load_checkpoint(os.path.join(reference["output_dir"], "reference", "checkpoints", "latest.pt"))
    assert got["step"] == want["step"] == 150
    assert got["train_state"]["ema"] == want["train_state"]["ema"] == {"updates": 150}
    for k, v in want["model"].items():  # the average
        assert torch.equal(got["model"][k], v), k
    for k, v in want["train_state"]["raw_model"].items():  # the trained weights
        assert torch.equal(got["train_state"]["raw_model"][k], v), k


# --------------------------------------------------------------------------- a run stopped before validating

@pytest.mark.slow
def test_a_run_stopped_before_validating_says_so_not_nan(tmp_path):
    """A run stopped by a signal before its first validation ended with `best bleu nan`."""
    raw = tiny_config_dict(str(tmp_path), max_steps=100_000, valid_every=100_000, log_every=5)
    path = write_yaml(tmp_path / "c.yaml", raw)
    log = os.path.join(raw["output_dir"], raw["name"], "train.log")
    proc = subprocess.Popen([sys.executable, "-m", "nmt", "train", "--config", path, "--quiet"], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            if os.path.exists(log) and "step 10 |" in open(log, encoding="utf-8").read():
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("stopped at step") and "signal SIGINT" in last
    assert "nan" not in last, last


def test_a_run_directory_through_a_device_or_pipe_fails_and_a_changed_tokenizer_is_not_resumed(tmp_path):
    """`output_dir: /dev/null` spun forever looking for the file in the way (dirname('/') is '/'); a FIFO was
    called "a file". `--resume --set data.tokenizer.vocab_size=200` on a 300-piece run wrote 200 into the run's
    config and checkpoints."""
    from nmt.config import to_dict
    from nmt.train import _check_same_model

    fifo = tmp_path / "p"
    os.mkfifo(fifo)
    for parent, blocker in [(os.devnull, os.devnull), (str(fifo), str(fifo))]:
        with pytest.raises(UserError, match=f"cannot create the run directory {parent}/run: {blocker} is not a directory"):
            rundir.create(os.path.join(parent, "run"))
    cfg = config_from_dict(tiny_config_dict(str(tmp_path)))
    saved = to_dict(cfg)
    _check_same_model(saved["model"], cfg, "runs/x", saved["data"])
    _check_same_model(saved["model"], cfg, "runs/x", {"tokenizer": {**saved["data"]["tokenizer"], "threads": 7}})
    _check_same_model(saved["model"], cfg, "runs/x", {"tokenizer": {}})  # (a run from before a key existed)
    vocab = cfg.data.tokenizer.vocab_size
    with pytest.raises(UserError, match=rf"the tokenizer config changed \(data.tokenizer.vocab_size: {vocab + 1} in "
                                        rf"the checkpoint, {vocab} now\)"):
        _check_same_model(saved["model"], cfg, "runs/x", {"tokenizer": {**saved["data"]["tokenizer"], "vocab_size": vocab + 1}})


def test_a_closed_stderr_does_not_stop_the_run(tmp_path, monkeypatch):
    """`nmt train 2>&1 | head -1` ended the run with no checkpoint and exit 0: messages now go to train.log only."""
    import io

    from nmt.training.logging_utils import RunLogger

    class Closed(io.StringIO):
        def write(self, s):
            raise BrokenPipeError(32, "Broken pipe")

    log = RunLogger(str(tmp_path), quiet=True)
    monkeypatch.setattr(sys, "stderr", Closed())
    log.info("one")
    log.info("two")
    log.close()
    lines = [line.split(" ", 2)[2] for line in (tmp_path / "train.log").read_text().splitlines()]
    assert lines == ["one", "stderr closed: messages go to train.log only", "two"]
