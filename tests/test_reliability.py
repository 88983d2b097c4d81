"""Nothing a user does by mistake, and no signal or crash, loses data or leaves a run stuck.

Each test reproduces one failure of issue 15 through the real entry points (the CLI in a
subprocess where the process boundary matters: exit codes, signals, kill -9, file-size
limits standing in for a full disk).
"""

from __future__ import annotations

import gzip
import io
import json
import os
import random
import resource
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml

from nmt import checkpoint as ckpt
from nmt import rundir
from nmt.config import ConfigError, config_from_dict, load_config
from nmt.errors import UserError
from nmt.train import SignalStop, train

from helpers import make_pairs, tiny_config_dict
from helpers import make_tiny_checkpoint
from helpers import ROOT

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}

pytestmark = pytest.mark.usefixtures("one_thread")


def nmt(*args: str, stdin: bytes | None = None, limit_bytes: int | None = None, cwd: str = ROOT,
        timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `python -m nmt ARGS`; limit_bytes caps the size of files it writes (RLIMIT_FSIZE: a
    write past it fails with EFBIG, as a full disk fails with ENOSPC; Python ignores SIGXFSZ)."""
    limit = (lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))) if limit_bytes else None
    return subprocess.run([sys.executable, "-m", "nmt", *args], input=stdin, capture_output=True, cwd=cwd,
                          env=ENV, timeout=timeout, preexec_fn=limit)


def one_line_error(proc: subprocess.CompletedProcess, code: int, pattern: str) -> str:
    err = proc.stderr.decode()
    assert proc.returncode == code, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert pattern in err, err
    return err


@pytest.fixture(scope="module")
def model_ckpt(tmp_path_factory) -> str:
    return make_tiny_checkpoint(str(tmp_path_factory.mktemp("rel") / "tiny.pt"))


def write(path, lines) -> str:
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))
    return str(path)


# --------------------------------------------------------------------------- 1. signals

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


def test_signals_during_logging_always_leave_a_checkpoint(tmp_path):
    """SIGTERM while every step logs (log_every 1): the run ends with exit 143 and latest.pt, every time."""
    raw = tiny_config_dict(str(tmp_path), valid_bleu=False, metric="loss", valid_every=10_000, log_every=1,
                           max_steps=100_000)
    for trial in range(3):
        raw["name"] = f"sig{trial}"
        path = write(tmp_path / f"c{trial}.yaml", [yaml.safe_dump(raw)])
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


# --------------------------------------------------------------------------- 2. outputs never overwrite inputs

def test_outputs_never_overwrite_inputs(model_ckpt, tmp_path):
    src = write(tmp_path / "src.es", [p[0] for p in make_pairs(3, 1)])
    ref = write(tmp_path / "ref.en", [p[1] for p in make_pairs(3, 1)])
    link = tmp_path / "link.pt"
    os.symlink(model_ckpt, link)
    before = {p: open(p, "rb").read() for p in (src, ref, model_ckpt)}
    cases = [
        ["translate", "-c", model_ckpt, "-i", src, "-o", model_ckpt],
        ["translate", "-c", model_ckpt, "-i", src, "-o", str(link)],  # through a symlink
        ["translate", "-c", str(link), "-i", src, "-o", src],
        ["evaluate", "-c", model_ckpt, "--src", src, "--ref", ref, "--save-hyps", ref],
        ["evaluate", "-c", model_ckpt, "--src", src, "--ref", ref, "--save-hyps", src],
        ["evaluate", "-c", model_ckpt, "--src", src, "--ref", ref, "--save-hyps", model_ckpt],
        ["evaluate", "--hyp", src, "--ref", ref, "--save-hyps", src],
        ["score", "-c", model_ckpt, "--src", src, "--tgt", ref, "-o", ref],
        ["average", model_ckpt, "-o", str(link)],
    ]
    for args in cases:
        one_line_error(nmt(*args), 2, "same file")
    with open(src, "rb") as f:  # `-o f < f`: stdin is the output file
        proc = subprocess.run([sys.executable, "-m", "nmt", "translate", "-c", model_ckpt, "-o", src], stdin=f,
                              capture_output=True, cwd=ROOT, env=ENV, timeout=300)
    one_line_error(proc, 2, "standard input")
    with open(src, "ab") as f:  # `< f >> f` would read its own output
        proc = subprocess.run([sys.executable, "-m", "nmt", "translate", "-c", model_ckpt, "-i", src], stdout=f,
                              capture_output=False, stderr=subprocess.PIPE, cwd=ROOT, env=ENV, timeout=300)
    one_line_error(proc, 2, "standard output")
    assert before == {p: open(p, "rb").read() for p in (src, ref, model_ckpt)}


def test_save_hyps_into_a_missing_directory_fails_before_translating(model_ckpt, tmp_path):
    src = write(tmp_path / "src.es", ["el sol"])
    proc = nmt("evaluate", "-c", model_ckpt, "--src", src, "--ref", src, "--save-hyps", str(tmp_path / "no" / "h.txt"))
    one_line_error(proc, 2, "does not exist")


# --------------------------------------------------------------------------- 3, 4. stale temporaries, lock

def test_a_killed_first_save_does_not_leave_the_run_stuck(tmp_path):
    """kill -9 while the first checkpoint is written leaves checkpoints/.tmp-*: it is not a
    checkpoint, a fresh start works and removes it."""
    raw = tiny_config_dict(str(tmp_path), max_steps=2, warmup_steps=1, valid_every=1000, valid_bleu=False, metric="loss")
    cfg = config_from_dict(raw)
    d = os.path.join(cfg.run_dir, "checkpoints")
    os.makedirs(d)
    for name in (".tmp-abc123.pt.tmp", ".tmp-xyz.pt", ".tmp-link-77-best.pt.tmp"):  # old and new temp names
        open(os.path.join(d, name), "wb").write(b"partial")
    with pytest.raises(UserError, match="latest.pt does not exist.*start without --resume"):
        train(cfg, resume=True, quiet=True)
    result = train(cfg, quiet=True)
    assert result["step"] == 2
    assert sorted(os.listdir(d)) == ["best.pt", "latest.pt", "step_2.pt"]


def test_a_second_train_on_the_same_run_directory_is_refused(tmp_path):
    raw = tiny_config_dict(str(tmp_path), max_steps=2, warmup_steps=1, valid_every=1000, valid_bleu=False, metric="loss")
    path = write(tmp_path / "c.yaml", [yaml.safe_dump(raw)])
    cfg = config_from_dict(raw)
    with rundir.RunLock(rundir.create(cfg.run_dir)):  # another nmt train holds the directory
        proc = nmt("train", "--config", path, "--quiet")
        one_line_error(proc, 2, f"in use by another nmt train (PID {os.getpid()})")
    assert rundir.checkpoint_files(cfg.run_dir) == []
    assert train(cfg, quiet=True)["step"] == 2  # released: the run goes ahead


def test_output_dir_that_is_a_file(tmp_path):
    raw = tiny_config_dict(str(tmp_path), max_steps=2, warmup_steps=1)
    open(tmp_path / "afile", "w").write("x")
    raw["output_dir"] = str(tmp_path / "afile")
    path = write(tmp_path / "c.yaml", [yaml.safe_dump(raw)])
    one_line_error(nmt("train", "--config", path, "--quiet"), 2, "is a file")


def test_resume_from_an_averaged_checkpoint_says_what_to_do(tmp_path):
    raw = tiny_config_dict(str(tmp_path), max_steps=2, warmup_steps=1, valid_every=1000, valid_bleu=False, metric="loss")
    cfg = config_from_dict(raw)
    train(cfg, quiet=True)
    latest = os.path.join(cfg.run_dir, "checkpoints", "latest.pt")
    ckpt.average_checkpoints([latest], str(tmp_path / "avg.pt"))
    os.replace(tmp_path / "avg.pt", latest)
    with pytest.raises(UserError, match="no training state.*train.init_from"):
        train(cfg, resume=True, quiet=True)


# --------------------------------------------------------------------------- 6. OS errors: one line, nothing half-written

def test_disk_full_is_one_line_and_leaves_no_partial_file(model_ckpt, tmp_path):
    lines = [p[0] for p in make_pairs(300, 2)]
    src = write(tmp_path / "src.es", lines)
    out = tmp_path / "out.en"
    proc = nmt("translate", "-c", model_ckpt, "-i", src, "-o", str(out), "--beam", "1", "-q", limit_bytes=300)
    one_line_error(proc, 1, "File too large")
    assert sorted(os.listdir(tmp_path)) == ["src.es"]  # neither out.en nor its temporary
    proc = nmt("evaluate", "-c", model_ckpt, "--src", src, "--ref", src, "--save-hyps", str(out), "-q",
               "--beam", "1", limit_bytes=300)
    one_line_error(proc, 1, "File too large")
    assert sorted(os.listdir(tmp_path)) == ["src.es"]
    proc = nmt("average", model_ckpt, model_ckpt, "-o", str(tmp_path / "avg.pt"), limit_bytes=20_000)
    one_line_error(proc, 1, "File too large")
    assert sorted(os.listdir(tmp_path)) == ["src.es"]
    raw = tiny_config_dict(str(tmp_path / "t"), max_steps=3, warmup_steps=1, valid_every=1000, valid_bleu=False, metric="loss")
    path = write(tmp_path / "c.yaml", [yaml.safe_dump(raw)])
    proc = nmt("train", "--config", path, "--quiet", limit_bytes=400_000)  # data fits, a checkpoint does not
    err = proc.stderr.decode()
    assert proc.returncode == 1 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == "nmt train: error: File too large", err
    assert os.listdir(os.path.join(raw["output_dir"], raw["name"], "checkpoints")) == []  # no half checkpoint


def test_average_into_a_directory_or_bad_checkpoints(model_ckpt, tmp_path):
    one_line_error(nmt("average", model_ckpt, "-o", str(tmp_path) + "/"), 2, "is a directory")
    text = write(tmp_path / "notes.txt", ["not a checkpoint"])
    one_line_error(nmt("average", text, "-o", str(tmp_path / "a.pt")), 2, "not a PyTorch checkpoint file")
    one_line_error(nmt("translate", "-c", text, "-i", text), 2, "not a PyTorch checkpoint file")
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    one_line_error(nmt("translate", "-c", str(empty), "-i", text), 2, "an empty file")
    state = ckpt.load_checkpoint(model_ckpt)
    del state["model"]
    torch.save(state, tmp_path / "nomodel.pt")
    one_line_error(nmt("average", str(tmp_path / "nomodel.pt"), "-o", str(tmp_path / "a.pt")), 2, "no model")


def test_corrupt_gzip_input(model_ckpt, tmp_path):
    lines = [p[0] for p in make_pairs(2000, 3)]
    good = gzip.compress("".join(x + "\n" for x in lines).encode())
    (tmp_path / "trunc.gz").write_bytes(good[: len(good) // 2])
    (tmp_path / "fake.gz").write_bytes(b"\x1f\x8b" + b"not really gzip at all")
    (tmp_path / "gz_named_otherwise.txt").write_bytes(good)  # gzip by content, whatever the name
    ref = write(tmp_path / "ref.en", lines)
    for name, pattern in (("trunc.gz", "corrupt or truncated gzip"), ("fake.gz", "gzip")):
        one_line_error(nmt("translate", "-c", model_ckpt, "-i", str(tmp_path / name), "-o", str(tmp_path / "o"),
                           "--beam", "1", "-q"), 2, pattern)
        one_line_error(nmt("evaluate", "--hyp", str(tmp_path / name), "--ref", ref), 2, pattern)
        assert not os.path.exists(tmp_path / "o")
    proc = nmt("evaluate", "--hyp", str(tmp_path / "gz_named_otherwise.txt"), "--ref", ref, "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["bleu"]["score"] == pytest.approx(100.0)


# --------------------------------------------------------------------------- 7, 8. config values

@pytest.mark.parametrize("value", ["nan", "inf", "-inf", ".nan", "1e999"])
def test_non_finite_floats_are_rejected(tmp_path, value):
    raw = tiny_config_dict(str(tmp_path))
    path = write(tmp_path / "c.yaml", [yaml.safe_dump(raw)])
    with pytest.raises(ConfigError, match="train.lr.*finite"):
        load_config(path, [f"train.lr={value}"])
    with pytest.raises(ConfigError, match="decode.length_penalty.*finite"):
        load_config(path, [f"decode.length_penalty={value}"])
    one_line_error(nmt("train", "--config", path, "--check", "--set", f"model.dropout={value}"), 2, "finite")


def test_yaml_aliases_are_refused(tmp_path):
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
        for p, c in zip("abcdefgh", "bcdefghi"))
    path = tmp_path / "bomb.yaml"
    path.write_text(bomb)
    t0 = time.perf_counter()
    proc = nmt("train", "--config", str(path), "--check")
    assert time.perf_counter() - t0 < 60
    one_line_error(proc, 2, "alias")
    merge = tmp_path / "merge.yaml"
    raw = tiny_config_dict(str(tmp_path))
    merge.write_text("base: &base {lr: 0.1}\n" + yaml.safe_dump(raw) + "extra: *base\n")
    with pytest.raises(ConfigError, match="alias"):
        load_config(str(merge))


# --------------------------------------------------------------------------- 10. evaluate options

def test_evaluate_rejects_nbest_and_uses_batch_size(model_ckpt, tmp_path, monkeypatch):
    from nmt.commands.evaluate import evaluate_command

    src = write(tmp_path / "src.es", [p[0] for p in make_pairs(9, 4)])
    one_line_error(nmt("evaluate", "-c", model_ckpt, "--src", src, "--ref", src, "--nbest", "2", "--beam", "2"),
                   2, "--nbest must be 1")
    import nmt.batching as batching

    seen = []
    real = batching.make_batches
    monkeypatch.setattr(batching, "make_batches", lambda lengths, bt, mbs: seen.append(mbs) or real(lengths, bt, mbs))
    evaluate_command(None, src, checkpoint=model_ckpt, src=src, overrides={"max_batch_size": "2"}, quiet=True,
                     stdout=io.StringIO())
    assert seen == [2]


# --------------------------------------------------------------------------- fault injection

def test_kill_9_at_random_moments_then_resume_equals_an_uninterrupted_run(tmp_path):
    """SIGKILL a tiny training run at random moments (saves every step, so some kills land in a
    save), restart it (--resume once latest.pt exists) until it finishes: the final weights (the
    trained ones and their moving average, train.ema_decay) equal an uninterrupted run's, bit for
    bit, and no restart is ever refused."""
    raw = tiny_config_dict(str(tmp_path), max_steps=300, valid_every=100, valid_bleu=False, metric="loss",
                           save_every=1, log_every=50, keep_last=2, ema_decay=0.99)  # the average resumes too
    raw["name"] = "killed"
    path = write(tmp_path / "killed.yaml", [yaml.safe_dump(raw)])
    run = os.path.join(raw["output_dir"], "killed")
    latest = os.path.join(run, "checkpoints", "latest.pt")
    rng = random.Random(0)
    kills, mid_run, finished, scale = 0, 0, False, 1.0
    deadline = time.time() + 300
    while not finished and time.time() < deadline:
        resume = os.path.exists(latest)
        cmd = [sys.executable, "-m", "nmt", "train", "--config", path, "--quiet"] + (["--resume"] if resume else [])
        proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        killing = mid_run < 3 and kills < 20  # then let it finish
        try:
            proc.wait(timeout=rng.uniform(1.5, 6.0) * scale if killing else 300)
        except subprocess.TimeoutExpired:
            proc.kill()
            kills += 1
            if not os.path.exists(latest):
                scale *= 1.5  # a loaded machine: the run had not reached its first save yet
        _, err = proc.communicate()
        if proc.returncode not in (0, -signal.SIGKILL):
            pytest.fail(f"restart failed ({proc.returncode}): {err.decode()}")
        finished = proc.returncode == 0
        mid_run += not finished and os.path.exists(latest)  # killed while training and saving every step
    assert finished and mid_run >= 2, (kills, mid_run)
    reference = dict(raw, name="reference")
    train(config_from_dict(reference), quiet=True)
    got = ckpt.load_checkpoint(os.path.join(run, "checkpoints", "latest.pt"))
    want = ckpt.load_checkpoint(os.path.join(reference["output_dir"], "reference", "checkpoints", "latest.pt"))
    assert got["step"] == want["step"] == 300
    assert got["train_state"]["ema"] == want["train_state"]["ema"] == {"updates": 300}
    for k, v in want["model"].items():  # the average
        assert torch.equal(got["model"][k], v), k
    for k, v in want["train_state"]["raw_model"].items():  # the trained weights
        assert torch.equal(got["train_state"]["raw_model"][k], v), k
