"""nmt.training.distributed + DDP training: two CPU processes (gloo) launched with torchrun.

- one DDP step (no_sync accumulation, global-token normalisation, clipping) equals a
  single-process step over the union of the ranks' micro-batches; both ranks agree on
  the gradient norm, the parameters and the NaN/inf skip decision;
- `torchrun -m nmt train` for a few steps equals a single process fed, at step k, rank
  0's and rank 1's micro-batches of step k (an independent re-implementation of the
  schedule below), writes one run directory with one event file and one train.log;
- N steps + resume + N steps == 2N steps under two processes (dropout on: per-rank RNGs);
- a failing rank ends the job promptly with its message; a UserError is printed once.
"""

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import yaml

from nmt.model import checkpoint as ckpt
from nmt.config import Config, config_from_dict
from nmt.data.batches import epoch_batches, load_data
from nmt.training.distributed import DistEnv, main_first, simulate_failure, timeout_seconds
from nmt.errors import UserError
from nmt.layout import collate
from nmt.model.transformer import Transformer
from nmt.training.optim import build_optimizer, build_scheduler
from nmt.training.step import setup_precision, train_step
from nmt.text.tokenizer import Tokenizer

from helpers import DDP_CLIP as CLIP, DDP_MICRO as MICRO, NoSchedule, random_corpus, tiny_config_dict, tiny_transformer

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)

CPU = torch.device("cpu")
FP32 = setup_precision("fp32", CPU)


pytestmark = pytest.mark.usefixtures("one_thread")


# --------------------------------------------------------------------------- helpers without processes

def test_env_detection_and_single_process_helpers():
    assert DistEnv.from_env({}) == DistEnv(0, 0, 1)
    assert DistEnv.from_env({"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"}).distributed is False
    env = DistEnv.from_env({"WORLD_SIZE": "16", "RANK": "9", "LOCAL_RANK": "1"})
    assert (env.rank, env.local_rank, env.world_size, env.distributed, env.is_main) == (9, 1, 16, True, False)
    with pytest.raises(UserError, match="RANK=4"):
        DistEnv.from_env({"WORLD_SIZE": "4", "RANK": "4"})
    alone = DistEnv()
    assert alone.broadcast("x") == "x" and alone.gather(3) == [3] and alone.sum_values([1, 2], CPU) == [1, 2]
    assert main_first(alone, lambda: 7) == 7
    assert timeout_seconds({}) == 1800 and timeout_seconds({"NMT_DIST_TIMEOUT": "90"}) == 90
    with pytest.raises(UserError, match="NMT_DIST_TIMEOUT"):
        timeout_seconds({"NMT_DIST_TIMEOUT": "soon"})
    simulate_failure(DistEnv(1, 1, 2), 3, {"NMT_TEST_FAIL_RANK": "0", "NMT_TEST_FAIL_STEP": "3"})  # other rank
    simulate_failure(DistEnv(1, 1, 2), 2, {"NMT_TEST_FAIL_RANK": "1", "NMT_TEST_FAIL_STEP": "3"})  # other step
    with pytest.raises(RuntimeError, match="simulated failure on rank 1 before step 4"):
        simulate_failure(DistEnv(1, 1, 2), 3, {"NMT_TEST_FAIL_RANK": "1", "NMT_TEST_FAIL_STEP": "3"})


# --------------------------------------------------------------------------- launching

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(args: list[str], *, timeout: float = 120, extra_env: dict | None = None,
              launcher: list[str] | None = None) -> subprocess.CompletedProcess:
    """`python -m torch.distributed.run --nproc_per_node 2 ... ARGS`; the whole group is killed on timeout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NMT_TEST_", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                                    "MASTER_"))}
    env.update(PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""), OMP_NUM_THREADS="1", **(extra_env or {}))
    launcher = launcher or ["--nnodes", "1", "--master_port", str(_free_port())]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", *launcher, *args]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"torchrun did not finish in {timeout} s:\n{err[-3000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _nmt_train(config_path: str, *extra: str, **kw) -> subprocess.CompletedProcess:
    return _torchrun(["-m", "nmt", "train", "--config", config_path, "--quiet", *extra], **kw)


def _write_config(tmp_path, name: str, dropout: float = 0.1, **train) -> tuple[str, "Config"]:
    raw = tiny_config_dict(str(tmp_path), **{"valid_bleu": False, "metric": "loss", "valid_every": 5,
                                             "log_every": 2, "update_freq": 2, "max_steps": 10, "warmup_steps": 4,
                                             **train})
    raw["name"] = name
    raw["model"]["dropout"] = dropout
    raw["data"]["train"]["max_sentences"] = 200
    raw["data"]["batch_tokens"] = 200  # 11 batches per epoch: odd, so shard_batches pads rank 1's share
    path = os.path.join(str(tmp_path), f"{name}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(raw, f)
    return path, config_from_dict(raw)


# --------------------------------------------------------------------------- one DDP step


STEP_WORKER = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {tests!r})
    import nmt.training.step as train_mod
    from nmt.layout import collate
    from nmt.training.distributed import DistEnv, process_group, wrap_model
    from helpers import DDP_CLIP as CLIP, DDP_MICRO as MICRO, NoSchedule, random_corpus, tiny_transformer

    env = DistEnv.from_env()
    cpu = torch.device("cpu")
    FP32 = train_mod.setup_precision("fp32", cpu)
    real = train_mod.label_smoothed_nll
    out = {{}}
    with process_group(env, cpu):
        batches = [collate(random_corpus(24), i) for i in MICRO[env.rank]]
        n_tokens = env.sum_values([sum(b.n_tgt_tokens for b in batches)], cpu)[0]
        for case in ("plain", "inf_on_rank1", "inf_on_rank1_no_reduce"):
            if case != "plain" and env.rank == 1:  # infinite loss, finite gradient, on rank 1 only
                train_mod.label_smoothed_nll = lambda *a: (lambda l, n: (l + float("inf"), n))(*real(*a))
            model = tiny_transformer()
            opt = torch.optim.SGD(model.parameters(), lr=1.0)
            reduce = None if case.endswith("no_reduce") else env.all_reduce_sum
            res = train_mod.train_step(wrap_model(env, model, cpu), batches, opt, NoSchedule(), FP32,
                                       label_smoothing=0.1, clip_norm=CLIP, grad_denominator=n_tokens / 2,
                                       reduce=reduce)
            out[case] = dict(updated=res.updated, grad_norm=res.grad_norm, loss=res.loss_sum, n_tokens=n_tokens,
                             params={{k: v.detach().clone() for k, v in model.named_parameters()}})
    torch.save(out, {out!r} + f"/rank{{env.rank}}.pt")
""")


@pytest.mark.slow
def test_ddp_step_equals_one_process_step_and_ranks_agree(tmp_path):
    script = tmp_path / "step_worker.py"
    script.write_text(STEP_WORKER.format(tests=TESTS, out=str(tmp_path)))
    t0 = time.perf_counter()
    proc = _torchrun([str(script)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))

    # reference: one process, one step over all four micro-batches
    corpus = random_corpus(24)
    model = tiny_transformer()
    init = {k: v.detach().clone() for k, v in model.named_parameters()}
    ref_batches = [collate(corpus, i) for r in (0, 1) for i in MICRO[r]]
    ref = train_step(model, ref_batches, torch.optim.SGD(model.parameters(), lr=1.0), NoSchedule(), FP32,
                     label_smoothing=0.1, clip_norm=CLIP)
    assert r0["plain"]["n_tokens"] == r1["plain"]["n_tokens"] == ref.n_tokens
    assert ref.grad_norm.item() > CLIP  # clipping is exercised
    for a in (r0["plain"], r1["plain"]):
        assert a["updated"]
        torch.testing.assert_close(a["loss"], ref.loss_sum, rtol=1e-5, atol=1e-5)  # global loss sum
        torch.testing.assert_close(a["grad_norm"], ref.grad_norm, rtol=1e-5, atol=1e-6)
        for k, v in model.named_parameters():
            torch.testing.assert_close(a["params"][k], v.detach(), rtol=1e-5, atol=1e-6)
    # the ranks agree exactly: same all-reduced gradients, same norm, same update
    assert torch.equal(r0["plain"]["grad_norm"], r1["plain"]["grad_norm"])
    assert all(torch.equal(r0["plain"]["params"][k], r1["plain"]["params"][k]) for k in init)
    # inf loss on rank 1 only (finite gradients): both ranks skip, parameters untouched ...
    assert not r0["inf_on_rank1"]["updated"] and not r1["inf_on_rank1"]["updated"]
    assert all(torch.equal(r["inf_on_rank1"]["params"][k], init[k]) for r in (r0, r1) for k in init)
    # ... which needs the loss all-reduce: without it the ranks disagree (and would diverge)
    assert r0["inf_on_rank1_no_reduce"]["updated"] and not r1["inf_on_rank1_no_reduce"]["updated"]
    print(f"DDP step test: {time.perf_counter() - t0:.1f}s")


# --------------------------------------------------------------------------- nmt train under torchrun

def _reference_params(cfg, steps: int, ranks=(0, 1), world_size: int = 2) -> dict:
    """One process; step k trains on rank 0's then rank 1's micro-batches of step k (fresh model)."""
    tokenizer = Tokenizer.load(cfg.run_dir)
    corpus = load_data(cfg, tokenizer, cfg.run_dir, lambda m: None).train
    torch.manual_seed(cfg.seed)
    model = Transformer(cfg.model, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size)
    opt = build_optimizer(model, cfg.train, CPU)
    sched = build_scheduler(opt, cfg.train, cfg.model.d_model)
    uf, step, epoch = cfg.train.update_freq, 0, 1
    while step < steps:
        shards = [epoch_batches(corpus, cfg, epoch, rank=r, world_size=world_size) for r in range(world_size)]
        assert len({len(s) for s in shards}) == 1  # padded: no rank runs out of batches first
        for i in range(0, len(shards[0]), uf):
            if step == steps:
                break
            group = [collate(corpus, b) for r in ranks for b in shards[r][i:i + uf]]
            res = train_step(model, group, opt, sched, FP32, label_smoothing=cfg.train.label_smoothing,
                             clip_norm=cfg.train.clip_norm)
            assert res.updated
            step += 1
        epoch += 1
    return {k: v.detach() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    """10 steps, update_freq 2, dropout 0, over two ranks with gloo; BLEU validation on rank 0."""
    tmp = tmp_path_factory.mktemp("ddp")
    # Adam eps 1e-6, not 1e-9: the key biases have zero true gradient (softmax is shift-invariant),
    # and a tiny eps would turn their rounding noise into full-size, run-dependent updates
    path, cfg = _write_config(tmp, "ddp", dropout=0.0, eps=1e-6, valid_bleu=True, valid_max_sentences=10)
    t0 = time.perf_counter()
    proc = _nmt_train(path)
    seconds = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    return cfg, proc, seconds


@pytest.mark.slow
def test_two_processes_equal_one_process_with_the_union_of_batches(ddp_run):
    cfg, proc, seconds = ddp_run
    saved = ckpt.load_checkpoint(os.path.join(cfg.run_dir, "checkpoints", "latest.pt"))
    assert saved["step"] == 10 and saved["epoch"] == 4  # 11 batches per epoch -> 6 per rank -> 3 steps
    tokenizer = Tokenizer.load(cfg.run_dir)
    corpus = load_data(cfg, tokenizer, cfg.run_dir, lambda m: None).train
    assert len(epoch_batches(corpus, cfg, 1)) % 2 == 1  # the padded case of shard_batches is exercised
    ref = _reference_params(cfg, 10)
    for k, v in ref.items():
        torch.testing.assert_close(saved["model"][k], v, rtol=0, atol=1e-5, msg=k)
    # the comparison can fail: rank 0's batches alone give other parameters
    alone = _reference_params(cfg, 10, ranks=(0,))
    assert max((alone[k] - saved["model"][k]).abs().max().item() for k in ref) > 1e-3
    print(f"torchrun 2 x gloo, 10 steps + 2 validations: {seconds:.1f}s")


@pytest.mark.slow
def test_one_run_directory_one_event_file_one_log(ddp_run):
    cfg, proc, _ = ddp_run
    run = cfg.run_dir
    assert sorted(os.listdir(os.path.dirname(run))) == ["ddp"]
    assert sorted(os.listdir(run)) == [".lock", "cache", "checkpoints", "config.yaml", "spm.json", "spm.model",
                                       "tensorboard", "train.log"]
    events = [f for _, _, files in os.walk(os.path.join(run, "tensorboard")) for f in files]
    assert len(events) == 1 and events[0].startswith("events.out.tfevents"), events
    assert sorted(os.listdir(os.path.join(run, "checkpoints"))) == ["best.pt", "latest.pt", "step_10.pt", "step_5.pt"]
    log = open(os.path.join(run, "train.log")).read()
    assert "DDP over 2 processes" in log and log.count("stopped at step 10") == 1
    assert log.count("valid step 5 |") == 1 and "bleu" in log and "sample 1/2" in log
    assert proc.stderr.count("stopped at step 10") == 1  # only rank 0 talks
    latest = ckpt.load_checkpoint(os.path.join(run, "checkpoints", "latest.pt"))
    rngs = latest["train_state"]["rng_ranks"]
    assert len(rngs) == 2 and latest["train_state"]["world_size"] == 2
    assert not torch.equal(rngs[0]["torch"], rngs[1]["torch"])  # each rank its own generator


@pytest.mark.slow
def test_resume_under_two_processes_continues_exactly(tmp_path):
    straight, cfg_s = _write_config(tmp_path, "straight")  # dropout 0.1: per-rank RNG states matter
    split, cfg_p = _write_config(tmp_path, "split", max_steps=5)
    t0 = time.perf_counter()
    for args in ([straight], [split], [split, "--resume", "--set", "train.max_steps=10"]):
        proc = _nmt_train(*args)
        assert proc.returncode == 0, proc.stderr[-3000:]
    a = ckpt.load_checkpoint(os.path.join(cfg_s.run_dir, "checkpoints", "latest.pt"))
    b = ckpt.load_checkpoint(os.path.join(cfg_p.run_dir, "checkpoints", "latest.pt"))
    mid = ckpt.load_checkpoint(os.path.join(cfg_p.run_dir, "checkpoints", "step_5.pt"))
    assert mid["step"] == 5 and mid["epoch"] == 2 and mid["train_state"]["batch_offset"] == 4  # mid-epoch
    assert a["step"] == b["step"] == 10
    assert (a["epoch"], a["train_state"]["batch_offset"]) == (b["epoch"], b["train_state"]["batch_offset"])
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    sa, sb = a["train_state"]["optimizer"]["state"], b["train_state"]["optimizer"]["state"]
    assert all(torch.equal(sa[i]["exp_avg_sq"], sb[i]["exp_avg_sq"]) for i in sa)
    assert "resuming" in open(os.path.join(cfg_p.run_dir, "train.log")).read()
    print(f"resume test, 3 torchrun launches: {time.perf_counter() - t0:.1f}s")


# --------------------------------------------------------------------------- failures

@pytest.mark.slow
def test_a_failing_rank_ends_the_job_with_its_message(tmp_path):
    path, _ = _write_config(tmp_path, "fail", max_steps=1000)
    port = _free_port()
    t0 = time.perf_counter()
    proc = _nmt_train(path, timeout=90, extra_env={"NMT_TEST_FAIL_RANK": "1", "NMT_TEST_FAIL_STEP": "2"},
                      launcher=["--nnodes", "1", "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}"])
    seconds = time.perf_counter() - t0
    assert proc.returncode != 0
    assert "simulated failure on rank 1 before step 3" in proc.stderr
    assert "nmt train: error on rank 1 (" in proc.stderr
    assert seconds < 60, seconds
    print(f"failing rank: job ended after {seconds:.1f}s")


@pytest.mark.slow
def test_user_error_is_printed_once(tmp_path):
    path, _ = _write_config(tmp_path, "never_ran")
    proc = _nmt_train(path, "--resume")
    assert proc.returncode != 0
    assert proc.stderr.count("cannot resume") == 1, proc.stderr[-3000:]
    assert "nmt train: error: cannot resume" in proc.stderr
