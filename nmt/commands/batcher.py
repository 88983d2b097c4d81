"""Cross-request batching for `nmt serve`: a bounded queue of requests and one task that
translates them in groups.

    batcher = Batcher(translate, Settings())   # translate(lines, prefixes, line_numbers, decode, cancel[, glossary],
                                               #           on_line=...)
    batcher.submit(job)                        # asyncio.QueueFull when max_queue requests wait (503)
    task = asyncio.create_task(batcher.run())  # until cancelled

The batcher takes the first queued request, then gathers more for a short while after it arrived (`window`),
at most `batch_lines` lines, and groups them by their validated decode settings (a frozen
`DecodeConfig`: nmt/commands/serve_request.py) and glossary: one translate call per group, in a worker
thread, so the event loop keeps answering. Each line keeps its number within its own request, and each
sentence is searched independently of its batch, so a request's results do not depend on who shared its
call. Scheduling (`Settings.scheduling`):
- "step" (the default): requests gather in two lanes, short (at most SHORT_LINES lines) and long, with
  PER_LANE gatherings of each at a time (`lane_of`), each lane first come first served; a gathering's calls
  start at once, while others run, as long as the lines and source tokens of the running calls stay within
  `batch_lines` and `max_batch_tokens` (a request over them runs alone). The running calls' searches join
  their decoding steps (PyTorch: nmt/search/joining.py; each step runs the search with the least compute
  so far and the short ones that fit beside it as one batch; a new search starts a second below the
  fair share, so a one-line request that arrives during a long call runs first and is answered after about
  its own time, not after the long call; CTranslate2: the calls take turns between batches, nmt/api.py's
  `Turns`). The oldest queued request that does not fit waits for room, and nothing queued after it starts
  before it.
- "call": one call at a time; the gathering waits `gather_wait`: `window`, or `wait_fraction` of the
  previous call's duration when that is longer (at most 1 s), so that requests arriving during a call
  share the next.

A request is abandoned when its future is done first (its time limit passed, or its client went
away): it leaves the queue at once; if it is being translated, its call stops at its next decoding
step (`cancel`) and runs again for the requests still waiting. A request that shares its call with others
is answered as soon as its own lines are final (`translate`'s `on_line`), not when the call ends; a request
with a `ready` queue (a streamed answer) gets (line, result) in it as each of its lines is final (a call
that runs again may put a line twice). When a shared call fails, each of
its requests is translated alone, so only the one that fails gets the error. With `batching` off
a call takes one request.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from nmt.config import DecodeConfig
from nmt.errors import Cancelled

# translate(lines, prefixes or None, line numbers, decode settings, cancel) -> one result per line
# translate(lines, prefixes, line_numbers, decode, cancel[, glossary], on_line=...) -> results (on_line given
# only for a call of several requests or with a streamed one)
Translate = Callable[..., Sequence[Any]]
MAX_WAIT = 1.0  # seconds: the longest a request waits for company
SHORT_LINES = 8  # scheduling "step": requests of at most this many lines gather in the short lane (`lane_of`)
PER_LANE = (2, 2)  # scheduling "step": gatherings of each lane whose calls run at once (short, long)


@dataclass(frozen=True)
class Settings:
    """The server's limits and batching (flags of `nmt serve`; docs/serving.md)."""

    max_lines: int = 256  # sentences in one request (more: 413)
    max_chars: int = 100_000  # characters of text and prefixes in one request (more: 413)
    max_beam: int = 16  # the largest beam_size, nbest and glossary_beam_size a request may ask for (more: 400)
    max_queue: int = 256  # requests waiting for the model (more: 503)
    timeout: float = 60.0  # seconds from a request's arrival to its answer (more: 504)
    window: float = 0.005  # seconds the batcher waits for company after a request arrives, at least
    wait_fraction: float = 0.05  # ... or this fraction of the previous call's duration (at most MAX_WAIT)
    batch_lines: int = 1024  # lines gathered into one call ("step": of the calls running at once), at most
    batching: bool = True  # False: one request per call
    scheduling: str = "step"  # "step": calls run at once, their decoding steps joined; "call": one call at a time
    max_batch_tokens: int = 32768  # "step": source tokens (EOS included) of the calls running at once, at most


@dataclass(eq=False)
class Job:
    """One request: its lines, target prefixes (or None), its validated decode settings (the group
    key, passed as they are to the translate call), the future its handler awaits and its arrival
    (loop time)."""

    lines: list[str]
    prefixes: list[str] | None
    decode: DecodeConfig
    future: asyncio.Future
    arrived: float
    glossary: Any = None  # its nmt.text.glossary.Glossary (requests with other glossaries are other calls)
    tokens: int = 0  # its lines' source tokens, EOS included (bounded by Settings.max_batch_tokens)
    ready: asyncio.Queue | None = None  # (a streamed answer) (line, result) as each line is final
    first_line: float | None = None  # (a streamed answer) when its first line was sent (loop time)


@dataclass
class Stats:
    """Counters shown by GET /health."""

    requests: int = 0  # requests translated (or being translated)
    sentences: int = 0
    calls: int = 0  # translate calls (a cancelled call included)
    shared_calls: int = 0  # calls that served more than one request
    largest_call: int = 0  # the most requests one call served
    expired: int = 0  # requests abandoned before their answer (time limit passed, or the client went away)
    cancelled_calls: int = 0  # calls stopped because a request of theirs was abandoned
    translating: int = 0  # requests in the calls now running
    running_calls: int = 0  # calls now running (scheduling "step": several, their decoding steps joined)


def gather_wait(settings: "Settings", last_call: float) -> float:
    """Seconds after the first request's arrival that the batcher gathers more (module docstring)."""
    return max(settings.window, min(settings.wait_fraction * last_call, MAX_WAIT))


def lane_of(job: Job) -> int:
    """The lane of a job with step scheduling: 0 short (at most SHORT_LINES lines), 1 long. PER_LANE gatherings
    of each lane run at a time: short requests are never gathered into a call with a long one to wait for its
    lines, one slow request does not hold up the others, and many short requests still share calls."""
    return 0 if len(job.lines) <= SHORT_LINES else 1


def groups(jobs: Sequence[Job]) -> list[list[Job]]:
    """Jobs grouped by equal decode settings and glossary, in order of first appearance."""
    by_key: dict[Any, list[Job]] = {}
    for job in jobs:
        by_key.setdefault((job.decode, None if job.glossary is None else job.glossary.key), []).append(job)
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
        self._queue: deque[Job] = deque()  # jobs waiting for a call, oldest first (abandoned ones leave at once)
        self._changed = asyncio.Event()  # set when a job is queued or a call ends
        self._running: dict[Job, threading.Event] = {}  # the jobs of the calls in progress: their call's stop
        self._closed = False  # set by close(): no call starts, the running ones stop at their next step
        self._lines = self._tokens = 0  # lines and source tokens of the calls in progress (admitted groups)
        self._tasks: set[asyncio.Task] = set()  # scheduling "step": the groups' tasks
        self._gatherings = [0, 0]  # scheduling "step": the gatherings of each lane whose calls run (`lane_of`)
        self.stats = Stats()
        self.last_call = 0.0  # seconds the previous translate call took
        workers = 1 if settings.scheduling == "call" else 256  # (step: more calls wait for a thread)
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="nmt-serve")
        self._busy = 0  # calls running in worker threads (`_in_thread`)
        self._idle = threading.Condition()

    @property
    def queued(self) -> int:
        """Jobs waiting for a call."""
        return len(self._queue)

    def submit(self, job: Job) -> None:
        """Queue a job; asyncio.QueueFull when max_queue jobs wait already."""
        if len(self._queue) >= self.settings.max_queue:
            raise asyncio.QueueFull
        self._queue.append(job)
        self._changed.set()
        job.future.add_done_callback(lambda _, job=job: self._abandoned(job))

    def _abandoned(self, job: Job) -> None:
        """A job's future is done: delivered, or abandoned (its handler cancelled it). An abandoned
        job leaves the queue; the call translating it stops at its next step (a job answered before its
        call ends leaves it running for the others)."""
        if not job.future.cancelled():
            return
        self.stats.expired += 1  # abandoned: counted here, once, wherever it was
        if job in self._queue:  # (identity: Job compares by identity)
            self._queue.remove(job)
            self._changed.set()  # (the job behind it may start now)
        elif job in self._running:
            self._running[job].set()

    async def run(self) -> None:
        """Translate queued jobs until cancelled."""
        try:
            while True:
                jobs = await self._gather()
                if self.settings.scheduling == "call":
                    for group in groups(jobs):
                        await self._run_group(group)
                    continue
                parts = groups(jobs)
                left = [len(parts)]

                def ended(left=left, lane=lane_of(jobs[0])) -> None:
                    left[0] -= 1
                    if left[0] == 0:  # the gathering's calls are all done: its lane is free
                        self._gatherings[lane] -= 1

                for group in parts:
                    task = asyncio.get_running_loop().create_task(self._run_group(group, ended))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
        finally:
            for task in list(self._tasks):
                task.cancel()

    def close(self, wait: float | None = None) -> bool:
        """Stop the running calls (if any) at their next step and wait for them, at most `wait` seconds (None: as
        long as they take); no call starts afterwards. Whether none still runs (a CTranslate2 call stops only
        before its next batch)."""
        self._closed = True  # (the run task is cancelled first: calls may still run in worker threads)
        for stop in list(self._running.values()):
            stop.set()
        self._executor.shutdown(wait=False, cancel_futures=True)
        with self._idle:
            return self._idle.wait_for(lambda: self._busy == 0, timeout=wait)

    def _in_thread(self, call: Callable[[], Any]) -> Any:
        """Run `call` in a worker thread, counted in `_busy` (what `close` waits for)."""
        with self._idle:
            self._busy += 1
        try:
            return call()
        finally:
            with self._idle:
                self._busy -= 1
                self._idle.notify_all()

    def _next(self, lane: int | None) -> Job | None:
        """The queued job that may start now, if any. "call": the oldest. "step": the oldest of `lane` (None:
        of a free lane, for the first job of a gathering), if nothing runs or the running lines and tokens
        stay within their bounds with it."""
        s = self.settings
        if s.scheduling == "call" or not self._queue:
            return self._queue[0] if self._queue else None
        if self._lines and not self._within(self._queue[0]):  # the oldest waits for room: nobody overtakes it
            return None
        seen = set()
        for job in self._queue:
            own = lane_of(job)
            if own in seen or (lane is not None and own != lane) or (lane is None and
                                                                     self._gatherings[own] >= PER_LANE[own]):
                continue
            seen.add(own)  # (only the oldest of each lane: first come first served within it)
            if self._lines == 0 or self._within(job):
                return job
        return None

    def _within(self, job: Job) -> bool:
        """Whether the running lines and tokens stay within their bounds with `job`'s."""
        s = self.settings
        return self._lines + len(job.lines) <= s.batch_lines and self._tokens + job.tokens <= s.max_batch_tokens

    async def _take(self, deadline: float | None = None, lane: int | None = None) -> Job | None:
        """The next job that may start (`_next`), waiting until `deadline` (loop time; None: for ever); None
        when the deadline passes first. Its lines and tokens count as running from now on."""
        loop = asyncio.get_running_loop()
        while (job := self._next(lane)) is None:
            self._changed.clear()
            if deadline is None:
                await self._changed.wait()
                continue
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except asyncio.TimeoutError:
                return None
        self._queue.remove(job)
        self._lines += len(job.lines)
        self._tokens += job.tokens
        return job

    def _wait(self) -> float:
        """Seconds after the first request's arrival that the batcher gathers more: the window ("step": calls
        run at once, a wait would only delay them) or `gather_wait`."""
        return self.settings.window if self.settings.scheduling == "step" else gather_wait(self.settings,
                                                                                            self.last_call)

    async def _gather(self) -> list[Job]:
        first = await self._take()
        lane = lane_of(first)
        if self.settings.scheduling == "step":
            self._gatherings[lane] += 1
        jobs, n_lines = [first], len(first.lines)
        if not self.settings.batching:
            return jobs
        deadline = first.arrived + self._wait()
        while n_lines < self.settings.batch_lines:
            job = await self._take(deadline, lane)
            if job is None:
                break
            jobs.append(job)
            n_lines += len(job.lines)
        return jobs

    def _live(self, jobs: list[Job]) -> list[Job]:
        """The jobs still waiting for their answer (the others were abandoned: `_abandoned` counted them)."""
        return [job for job in jobs if not job.future.done()]

    async def _run_group(self, jobs: list[Job], ended: Callable[[], None] | None = None) -> None:
        """Translate a group's jobs and deliver their answers; then free their lines and tokens, and call
        `ended` (its gathering's lane), before the admission looks again."""
        try:
            live = self._live(jobs)  # (a job gathered but abandoned before its group's turn)
            if not live:
                return
            self.stats.requests += len(live)
            self.stats.sentences += sum(len(job.lines) for job in live)
            try:
                await self._translate_live(live)
            except Exception as e:
                if len(live) == 1:
                    _fail(live[0], e)
                    return
                for job in live:  # one request's failure must not fail the others: each alone
                    if job.future.done():  # (abandoned meanwhile)
                        continue
                    try:
                        await self._translate_live([job])
                    except Exception as e:  # an engine failure: the request gets it (500)
                        _fail(job, e)
        finally:
            self._lines -= sum(len(job.lines) for job in jobs)
            self._tokens -= sum(job.tokens for job in jobs)
            if ended is not None:
                ended()
            self._changed.set()

    async def _translate_live(self, jobs: list[Job]) -> None:
        """Translate `jobs` in one call and deliver their results. When one is abandoned during
        the call, the call stops and runs again over the others (as long as any is live)."""
        while jobs:
            try:
                results = await self._call(jobs)
            except Cancelled:
                self.stats.cancelled_calls += 1
                live = self._live(jobs)
                if len(live) == len(jobs) or self._closed:  # stopped by close(), not by an abandoned job
                    raise
                jobs = live
                continue
            self._deliver(jobs, results)
            return

    async def _call(self, jobs: list[Job]) -> Sequence[Any]:
        """One translate call over `jobs`, in a worker thread; nmt.errors.Cancelled when one of
        them is abandoned while it runs."""
        s = self.stats
        s.calls += 1
        s.shared_calls += len(jobs) > 1
        s.largest_call = max(s.largest_call, len(jobs))
        s.translating += len(jobs)
        s.running_calls += 1
        lines, prefixes, numbers = merge(jobs)
        loop = asyncio.get_running_loop()
        stop = threading.Event()
        if self._closed:
            stop.set()
        self._running.update((job, stop) for job in jobs)
        start = loop.time()
        try:
            glossary = () if jobs[0].glossary is None else (jobs[0].glossary,)  # (the same in the whole group)
            early = len(jobs) > 1 or any(job.ready is not None for job in jobs)
            streamed = {"on_line": _line_handler(jobs, loop)} if early else {}
            call = functools.partial(self._translate, lines, prefixes, numbers, jobs[0].decode,
                                     lambda: self._closed or stop.is_set(), *glossary, **streamed)
            return await loop.run_in_executor(self._executor, self._in_thread, call)
        finally:
            for job in jobs:
                self._running.pop(job, None)
            s.translating -= len(jobs)
            s.running_calls -= 1
            self.last_call = loop.time() - start

    def _deliver(self, jobs: list[Job], results: Sequence[Any]) -> None:
        start = 0
        for job in jobs:
            part = list(results[start:start + len(job.lines)])
            start += len(job.lines)
            if not job.future.done():  # (else abandoned after the call's last step: nobody waits for it)
                job.future.set_result(part)


def _line_handler(jobs: list[Job], loop: asyncio.AbstractEventLoop) -> Callable[[int, Any], None]:
    """translate's on_line for a call over `jobs` (called from its threads, once per line): line i of the call
    goes into its job's `ready` queue, and a job whose lines are all final gets its answer, in the event
    loop."""
    owner = [(job, k) for job in jobs for k in range(len(job.lines))]
    got = {job: [None] * len(job.lines) for job in jobs}
    left = {job: len(job.lines) for job in jobs}
    lock = threading.Lock()  # (a call's lines are final in several threads: its decode workers, its parts)

    def on_line(i: int, result: Any) -> None:
        job, k = owner[i]
        with lock:
            if job.ready is not None:
                loop.call_soon_threadsafe(job.ready.put_nowait, (k, result))
            got[job][k] = result
            left[job] -= 1
            done = not left[job]
        if done:
            loop.call_soon_threadsafe(_answer, job, got[job])
    return on_line


def _answer(job: Job, results: list) -> None:
    if not job.future.done():  # (else abandoned meanwhile)
        job.future.set_result(results)


def _fail(job: Job, error: Exception) -> None:
    if not job.future.done():
        job.future.set_exception(error)
