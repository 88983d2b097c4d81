"""nmt/data/prefetch.py: batches prepared in a background thread are the batches the loop would make itself."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from nmt.config import config_from_dict
from nmt.data.prefetch import Prefetcher
from nmt.train import train

from helpers import tiny_config_dict

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_items_in_order_at_most_depth_ahead(depth):
    made: list[int] = []

    def make(i):
        made.append(i)
        return i * i

    got = []
    for value in Prefetcher(make, range(10), depth):
        time.sleep(0.01)  # the thread runs ahead: `depth` items ready, one more in the making
        assert len(made) <= len(got) + 1 + depth + (depth > 0)
        got.append(value)
    assert got == [i * i for i in range(10)]


def test_an_error_is_raised_at_the_item_that_failed():
    def make(i):
        if i == 3:
            raise ValueError("bad item 3")
        return i

    got = []
    with pytest.raises(ValueError, match="bad item 3"):
        for value in Prefetcher(make, range(10), 2):
            got.append(value)
    assert got == [0, 1, 2]


def test_leaving_early_stops_the_thread():
    started = threading.active_count()
    p = Prefetcher(lambda i: i, range(10**9), 2)
    for value in p:
        if value == 5:
            break
    p.close()
    deadline = time.time() + 5
    while threading.active_count() > started and time.time() < deadline:
        time.sleep(0.01)
    assert threading.active_count() == started


def _weights(tmp_path, name: str, **data) -> dict:
    raw = tiny_config_dict(str(tmp_path), max_steps=20, valid_every=10_000, valid_bleu=False, metric="loss",
                           warmup_steps=5)
    raw["name"] = name
    raw["data"].update(data)
    cfg = config_from_dict(raw)
    result = train(cfg, quiet=True)
    state = torch.load(f"{result['run_dir']}/checkpoints/latest.pt", weights_only=True)
    return state


@pytest.mark.parametrize("other", [dict(prefetch=2), dict(prefetch=2, collate="device")])
def test_training_with_and_without_prefetch_is_the_same_bit_for_bit(tmp_path, other):
    """20 steps with the batches collated in the loop (prefetch 0) and in the thread (2), there padded on
    the host or on the device (data.collate; the CPU here): equal weights, optimizer state and counters."""
    a, b = _weights(tmp_path, "inline", prefetch=0), _weights(tmp_path, "thread", **other)
    assert a["step"] == b["step"] == 20
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    assert a["train_state"]["batch_offset"] == b["train_state"]["batch_offset"]
    for sa, sb in zip(a["train_state"]["optimizer"]["state"].values(), b["train_state"]["optimizer"]["state"].values()):
        assert all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("data", [dict(length_buckets=[8, 16, 32, 64], collate="device"),
                                  dict(same_source_length=True)])
def test_training_with_bucketed_or_unmasked_batches_runs_its_steps(tmp_path, data):
    """`nmt train`'s loop with data.length_buckets (padded on the device) or data.same_source_length (no
    source mask): 20 steps with finite weights, the same twice (the batches are a function of the seed),
    and not the default run's (the key reaches the batches)."""
    a, b, default = _weights(tmp_path, "one", **data), _weights(tmp_path, "two", **data), _weights(tmp_path, "default")
    assert a["step"] == 20
    for k in a["model"]:
        assert torch.isfinite(a["model"][k]).all() and torch.equal(a["model"][k], b["model"][k]), k
    assert any(not torch.equal(a["model"][k], default["model"][k]) for k in a["model"])


def test_the_generator_never_joins_the_thread_only_close_does(monkeypatch):
    """A second Ctrl-C during the join in the generator's `finally` (run by the garbage collector when the loop
    returned) printed "Exception ignored ... KeyboardInterrupt" and was swallowed: the join is close()'s, in the
    consumer's frame, where a KeyboardInterrupt propagates."""
    joins = []
    with Prefetcher(lambda i: i, range(100), depth=2) as prepared:
        monkeypatch.setattr(prepared._thread, "join", lambda timeout=None: joins.append(timeout))
        items = iter(prepared)
        assert next(items) == 0
        items.close()  # (what the garbage collector does to the loop's iterator)
        assert joins == [] and prepared._stop.is_set()
    assert joins == [10]
