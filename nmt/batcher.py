"""Cross-request batching for `nmt serve`: a bounded queue of requests and one task that
translates them in groups.

    batcher = Batcher(translate, Settings())   # translate(lines, prefixes, line_numbers, options)
    batcher.submit(job)                        # asyncio.QueueFull when the queue is full (503)
    task = asyncio.create_task(batcher.run())  # until cancelled

The batcher takes the first queued request, then gathers more until `gather_wait` seconds
after that request arrived (requests that queued while the previous call ran are taken at
once), at most `batch_lines` lines. The wait is `window`, or `wait_fraction` (5%) of the
previous call's duration when that is longer (at most 1 s): under load, clients whose answers
left together come back spread over tens of milliseconds, and a call started on the first few
of them would leave the rest waiting a whole call (p95 latency twice the median); waiting 5% of
a call gathers them for at most 5% of the throughput. It groups the gathered requests by their
decode settings and makes one translate call per group, in a worker thread, so the event loop
keeps answering while the model runs (the calls of nmt.Translator run one at a time in the
process anyway: nmt/api.py). Each line keeps its number within its own request (the
`line_numbers` of the call), so a sampled line gets the samples `nmt translate` gives it for that
request alone; each sentence is searched independently of its batch companions (nmt/translate.py),
so a request's results do not depend on who shared its call.

A request whose future is already done when its turn comes (its time limit passed: the
server answered 504) is skipped; one that times out during the call gets its results
dropped when they come. When a shared call fails, each of its requests is translated alone, so
only the one that fails gets the error. With `batching` off the batcher takes one request per call (the
comparison point of scripts/bench_serve.py).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Sequence

Translate = Callable[[list[str], "list[str] | None", list[int], dict], Sequence[Any]]
MAX_WAIT = 1.0  # seconds: the longest a request waits for company


@dataclass(frozen=True)
class Settings:
    """The server's limits and batching (flags of `nmt serve`; README "Serving")."""

    max_lines: int = 256  # sentences in one request (more: 413)
    max_chars: int = 100_000  # characters of text and prefixes in one request (more: 413)
    max_beam: int = 16  # the largest beam_size and nbest a request may ask for (more: 400)
    max_queue: int = 256  # requests waiting for the model (more: 503)
    timeout: float = 60.0  # seconds from a request's arrival to its answer (more: 504)
    window: float = 0.005  # seconds the batcher waits for company after a request arrives, at least
    wait_fraction: float = 0.05  # ... or this fraction of the previous call's duration (at most MAX_WAIT)
    batch_lines: int = 1024  # lines gathered into one call at most (a request is never split)
    batching: bool = True  # False: one request per call


@dataclass(eq=False)
class Job:
    """One request: its lines, target prefixes (or None), raw decode options, their validated
    settings (the group key), the future its handler awaits and its arrival (loop time)."""

    lines: list[str]
    prefixes: list[str] | None
    options: dict
    decode: Any
    future: asyncio.Future
    arrived: float


@dataclass
class Stats:
    """Counters shown by GET /health."""

    requests: int = 0  # requests translated (or being translated)
    sentences: int = 0
    calls: int = 0  # translate calls
    shared_calls: int = 0  # calls that served more than one request
    largest_call: int = 0  # the most requests one call served
    expired: int = 0  # requests skipped or dropped because their time limit passed
    translating: int = 0  # requests in the call now running


def gather_wait(settings: "Settings", last_call: float) -> float:
    """Seconds after the first request's arrival that the batcher gathers more (module docstring)."""
    return max(settings.window, min(settings.wait_fraction * last_call, MAX_WAIT))


def groups(jobs: Sequence[Job]) -> list[list[Job]]:
    """Jobs grouped by equal decode settings, in order of first appearance."""
    by_key: dict[Any, list[Job]] = {}
    for job in jobs:
        by_key.setdefault(job.decode, []).append(job)
    return list(by_key.values())


def merge(jobs: Sequence[Job]) -> tuple[list[str], list[str] | None, list[int]]:
    """(lines, prefixes or None, line numbers) of one call over `jobs`: each line numbered within
    its own request; a request without prefixes gets empty ones when another has some (an empty
    prefix forces nothing)."""
    lines = [line for job in jobs for line in job.lines]
    numbers = [i for job in jobs for i in range(len(job.lines))]
    prefixes = None
    if any(job.prefixes is not None for job in jobs):
        prefixes = [p for job in jobs for p in (job.prefixes if job.prefixes is not None else [""] * len(job.lines))]
    return lines, prefixes, numbers


class Batcher:
    """A bounded queue of Jobs and the task that translates them (module docstring)."""

    def __init__(self, translate: Translate, settings: Settings):
        self._translate = translate
        self.settings = settings
        self.queue: asyncio.Queue[Job] = asyncio.Queue(maxsize=settings.max_queue)
        self.stats = Stats()
        self.last_call = 0.0  # seconds the previous translate call took
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nmt-serve")

    def submit(self, job: Job) -> None:
        """Queue a job; asyncio.QueueFull when the queue holds max_queue jobs."""
        self.queue.put_nowait(job)

    async def run(self) -> None:
        """Translate queued jobs until cancelled."""
        while True:
            for group in groups(await self._gather()):
                await self._run_group(group)

    def close(self) -> None:
        """Wait for the running call (if any) to end; no call starts afterwards."""
        self._executor.shutdown(wait=True, cancel_futures=True)

    async def _gather(self) -> list[Job]:
        first = await self.queue.get()
        jobs, n_lines = [first], len(first.lines)
        if not self.settings.batching:
            return jobs
        loop = asyncio.get_running_loop()
        deadline = first.arrived + gather_wait(self.settings, self.last_call)
        while n_lines < self.settings.batch_lines:
            if self.queue.empty():
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    job = await asyncio.wait_for(self.queue.get(), remaining)
                except asyncio.TimeoutError:
                    break
            else:
                job = self.queue.get_nowait()
            jobs.append(job)
            n_lines += len(job.lines)
        return jobs

    async def _run_group(self, jobs: list[Job]) -> None:
        live = [job for job in jobs if not job.future.done()]  # done: timed out while queued
        self.stats.expired += len(jobs) - len(live)
        if not live:
            return
        self.stats.requests += len(live)
        self.stats.sentences += sum(len(job.lines) for job in live)
        try:
            self._deliver(live, await self._call(live))
        except Exception as e:
            if len(live) == 1:
                _fail(live[0], e)
                return
            for job in live:  # one request's failure must not fail the others: each alone
                try:
                    self._deliver([job], await self._call([job]))
                except Exception as e:  # an engine failure: the request gets it (500)
                    _fail(job, e)

    async def _call(self, jobs: list[Job]) -> Sequence[Any]:
        """One translate call over `jobs`, in the worker thread."""
        s = self.stats
        s.calls += 1
        s.shared_calls += len(jobs) > 1
        s.largest_call = max(s.largest_call, len(jobs))
        s.translating = len(jobs)
        lines, prefixes, numbers = merge(jobs)
        loop = asyncio.get_running_loop()
        start = loop.time()
        try:
            return await loop.run_in_executor(self._executor, self._translate, lines, prefixes, numbers,
                                              jobs[0].options)
        finally:
            s.translating = 0
            self.last_call = loop.time() - start

    def _deliver(self, jobs: list[Job], results: Sequence[Any]) -> None:
        start = 0
        for job in jobs:
            part = list(results[start:start + len(job.lines)])
            start += len(job.lines)
            if job.future.done():  # its time limit passed during the call: the answer was 504
                self.stats.expired += 1
            else:
                job.future.set_result(part)


def _fail(job: Job, error: Exception) -> None:
    if not job.future.done():
        job.future.set_exception(error)
