"""Batches for inference: token-budget batches of sorted sentences, and how they are run.

`make_batches` groups sentences longest first into batches of at most `batch_tokens` padded positions
and `max_batch_size` sentences; `run_batches` runs a function over them, several at once in a thread
pool on CPU (`decode.workers`, sharing torch's intra-op threads for the run); `run_engine` does both
for an engine (the text pipeline and scoring use it).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Sequence

from nmt.config import DecodeConfig
from nmt.device import resolve_workers

Progress = Callable[[int], None]


def make_batches(lengths: Sequence[int], batch_tokens: int, max_batch_size: int) -> list[list[int]]:
    """Indices grouped into batches, longest sentences first: at most `max_batch_size` sentences and
    `B * max(length) <= batch_tokens` positions (`lengths` with EOS; a sentence over the budget alone
    gets a batch of one). Equal lengths keep their input order, so batching is deterministic."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        # Sorted descending: the first sentence of a batch is its longest.
        width = lengths[current[0]] if current else lengths[i]
        if current and ((len(current) + 1) * width > batch_tokens or len(current) >= max_batch_size):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def run_batches(fn: Callable[[list[int]], object], batches: Sequence[list[int]], workers: int,
                torch_device=None, costs: Sequence[float] | None = None) -> Iterator[tuple[list[int], object]]:
    """(batch, fn(batch)) for each batch, in order; with workers > 1, `workers` batches run at once in a
    thread pool (torch and CTranslate2 release the GIL). On CPU (`torch_device`) the workers share torch's
    intra-op threads (restored afterwards); on other devices batches run one at a time. costs: each
    batch's estimated work (`batch_cost`): the largest go first, and batches that cannot be shared out
    evenly run one at a time with all threads (`_balanced`). On an error, queued batches are dropped and
    running ones finish before it propagates."""
    import torch

    if torch_device is not None and torch_device.type != "cpu":
        workers = 1
    if costs is not None and workers > 1 and not _balanced(costs, workers):
        workers = 1
    if workers <= 1 or len(batches) <= 1:
        for batch in batches:
            yield batch, fn(batch)
        return
    from concurrent.futures import ThreadPoolExecutor

    threads = torch.get_num_threads()
    if torch_device is not None:
        torch.set_num_threads(max(1, threads // workers))  # read by each worker thread at its first op
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="nmt-decode")
    try:
        order = range(len(batches)) if costs is None else sorted(range(len(batches)), key=lambda i: -costs[i])
        futures = {i: pool.submit(fn, batches[i]) for i in order}  # largest first
        for i, batch in enumerate(batches):
            yield batch, futures[i].result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        if torch_device is not None:
            torch.set_num_threads(threads)


def batch_cost(lengths: Sequence[int]) -> int:
    """A batch's estimated decoding work for `run_batches`: its padded source tokens."""
    return len(lengths) * max(lengths)


def _balanced(costs: Sequence[float], workers: int, slack: float = 1.2) -> bool:
    """True when the largest-first schedule of `costs` on `workers` workers ends within `slack` x
    the perfectly even share. A worker with 1/workers of the threads runs a batch markedly slower
    than all threads do, so a worse balance is slower than running the batches one at a time."""
    loads = [0.0] * workers
    for c in sorted(costs, reverse=True):
        loads[loads.index(min(loads))] += c
    return max(loads) <= slack * sum(loads) / workers


def engine_workers(engine, decode: DecodeConfig) -> int:
    """The batches `run_engine` searches at once: the engine's own workers (CTranslate2's replicas), else
    decode.workers resolved for its device."""
    return engine.workers if engine.workers is not None else resolve_workers(decode.workers, engine.torch_device)


def splits_threads(engine, decode: DecodeConfig) -> bool:
    """Whether a run with `decode` splits torch's CPU threads among decode workers (`run_batches`), changing
    the process' thread setting while it runs."""
    device = engine.torch_device
    return engine.workers is None and device is not None and device.type == "cpu" and engine_workers(engine, decode) > 1


def run_engine(engine, fn: Callable[[list[int]], Any], lengths: Sequence[int], decode: DecodeConfig,
               on_batch: Progress | None = None) -> Iterator[tuple[list[int], Any]]:
    """fn over the token-budget batches of items with these padded `lengths`, with the engine's
    workers, in batch order: (item indices, fn(item indices)). Used for search and scoring."""
    batches = make_batches(lengths, decode.batch_tokens, decode.max_batch_size)
    torch_device = engine.torch_device
    workers = engine_workers(engine, decode)
    costs = [batch_cost([lengths[i] for i in b]) for b in batches] if torch_device is not None else None
    with engine.running(), contextlib.closing(run_batches(fn, batches, workers, torch_device, costs)) as done:
        for batch, result in done:
            yield batch, result
            if on_batch is not None:
                on_batch(len(batch))
