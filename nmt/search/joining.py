"""Searches running at once in several threads, their decoding steps joined into one batch.

A search whose `SearchOps.steps` is a `StepPool` hands each decoding step to the pool, and steps of several
searches run as one forward pass: the model's projections, feed-forward layers and output layer over all
their rows at once, the attention search by search, each with its own cache (`JoinedCache`: Orca's selective
batching, Yu et al., OSDI 2022). A search keeps its own step count, rules, beams and cache, so it gives what
it gives alone (up to floating-point summation order, as any change of batch does), whatever its options. A
search joins the pool at its first step, after encoding its sources, and leaves it when it ends: the
sentences of a new call join the running searches between two of their steps, and finished ones leave.

Which searches step together (fair queuing, as nmt/api.py's `Turns` does for whole calls): each member has
a claim, the seconds of the steps it took part in, starting HEAD_START below the pool's virtual time, which
advances with the time computed, shared among the members; a member of fewer than `join_rows` rows counts
HEAD_START less. A step takes the member with the least claim, then, in the same order, every other member
whose rows still fit in `join_rows` rows: a short search does not wait for a long one's steps (on CPU a
step's time grows with its rows, and a joined step over large searches saves nothing: BENCHMARKS.md), short
searches step together, and a search of `join_rows` rows or more steps alone. A stream of short searches
cannot starve a long one: their claims start from the virtual time, which passes its claim. A step waits
until the members it takes have asked for their step, at most `wait` seconds (a member that made a step wait
that long is not waited for again until it asks); one of the waiting threads runs it for all. With
`parallel` > 1 up to that many steps (of different members) run at once, each in one of its members' threads
(`nmt serve` on CPU: as many as torch has threads, each computing on one, nmt/commands/serve.py; the engine
then searches a long call in parts at once, each of more than join_rows / 2 rows, TorchEngine.search_batch).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator

import torch
from torch import Tensor

from nmt.search.cache import DecoderCache, JoinedCache

WAIT = 0.02  # seconds a step waits for the members it takes to ask for theirs, at most
HEAD_START = 1.0  # a new member's claim starts this many seconds below the virtual time
JOIN_ROWS = 64  # rows a step fills with other members than its first one, at most


class _Member:
    def __init__(self, claim: float):
        self.claim = claim  # seconds of the steps it took part in, from where it started
        self.rows = 0  # its rows at its latest step
        self.asked: tuple | None = None  # (model, cache, tokens) of the step it waits for
        self.late = False  # a step stopped waiting for it: no step waits for it again until it asks
        self.stepping = False  # its rows are in a step running now
        self.result: Tensor | BaseException | None = None  # its rows' logits (or the step's error)


class StepPool:
    """The joined steps of the searches in several threads (module docstring). `steps` and `rows` count the
    forward passes run and the rows they decoded; `joined` the passes that served more than one search."""

    def __init__(self, wait: float = WAIT, join_rows: int = JOIN_ROWS, parallel: int = 1):
        self.wait, self.join_rows = wait, join_rows
        self.parallel = parallel  # steps that may run at once (each in one of its members' threads)
        self._cond = threading.Condition()
        self._members: dict[int, _Member] = {}  # thread -> its search's place, from its first step to its end
        self._running = 0  # steps running now
        self._since = 0.0  # when the pool last became free to start a step (perf_counter)
        self._virtual = 0.0  # advances with the time computed, shared among the members
        self.steps = self.rows = self.joined = 0

    @property
    def members(self) -> int:
        """Searches in the pool now."""
        return len(self._members)

    @property
    def running_rows(self) -> int:
        """The rows of the searches in the pool now (at their latest step)."""
        return sum(m.rows for m in list(self._members.values()))

    @contextlib.contextmanager
    def member(self) -> Iterator[None]:
        """Around a search: its thread leaves the pool when the search ends, however it ends."""
        me = threading.get_ident()
        try:
            yield
        finally:
            with self._cond:
                if self._members.pop(me, None) is not None:
                    self._cond.notify_all()  # (the others may be waiting for it)

    def step(self, model, cache: DecoderCache, tokens: Tensor) -> Tensor:
        """`model.decode_step(tokens, cache)`, joined with other members' steps (module docstring)."""
        me = threading.get_ident()
        with self._cond:
            member = self._members.get(me)
            if member is None:
                member = self._members[me] = _Member(max(0.0, self._virtual - HEAD_START))
            if not self._running and not any(m.asked for m in self._members.values()):
                self._since = time.perf_counter()
            member.asked, member.rows, member.late = (model, cache, tokens), tokens.shape[0], False
            self._cond.notify_all()
            while member.result is None:
                if self._running >= self.parallel or member.asked is None:  # (or its rows are in a running step)
                    self._cond.wait()
                    continue
                taken = self._take(asked_only=False)
                if any(m.asked is None for m in taken):  # wait for them, at most until `wait` has passed
                    left = self._since + self.wait - time.perf_counter()
                    if left > 0:
                        self._cond.wait(left)
                        continue
                    for m in taken:
                        m.late = m.asked is None
                    taken = self._take(asked_only=True)
                self._run(taken)  # (this thread runs the step, for itself or for others)
            return _result(member)

    def _take(self, asked_only: bool) -> list[_Member]:
        """The members of the next step: the one first in the order of claims (`_key`; among those that asked,
        or all but the late ones), then every other one, in that order, whose rows still fit in join_rows."""
        order = sorted((m for m in self._members.values()
                        if m.asked is not None or not (asked_only or m.late or m.stepping)), key=self._key)
        first = order[0]
        taken, rows = [first], first.rows
        for m in order[1:]:
            if rows + m.rows <= self.join_rows:
                taken.append(m)
                rows += m.rows
        return taken

    def _key(self, member: _Member) -> float:
        """A member's place in the order of claims: a short one (fewer than join_rows rows) HEAD_START ahead."""
        return member.claim - (HEAD_START if member.rows < self.join_rows else 0.0)

    def _run(self, taken: list[_Member]) -> None:
        """Run the step of `taken` (every one has asked) without the lock (held before and after), hand each
        its rows' logits and count the time in their claims."""
        asked = [m.asked for m in taken]
        for m in taken:
            m.asked, m.stepping = None, True
        self._running += 1
        self._cond.release()
        try:
            start = time.perf_counter()
            try:
                results = joined_step(asked)
            except BaseException as e:  # every member of the step gets its error
                results = [e] * len(taken)
            spent = time.perf_counter() - start
        finally:
            self._cond.acquire()
        for m, result in zip(taken, results):
            m.result, m.claim, m.stepping = result, m.claim + spent, False
        if self._members:  # fair queuing: shared among the members, never lagging the least claim
            self._virtual = max(self._virtual + spent / len(self._members), min(m.claim for m in self._members.values()))
        self._running -= 1
        self.steps += 1
        self.joined += len(taken) > 1
        self.rows += sum(m.rows for m in taken)
        self._since = time.perf_counter()  # (the members of this step get their full wait for the next)
        self._cond.notify_all()


def _result(member: _Member) -> Tensor:
    result, member.result = member.result, None
    if isinstance(result, BaseException):
        raise result
    return result


def joined_step(asked: list[tuple]) -> list[Tensor]:
    """[(model, cache, tokens [b_i])] (one model) -> each one's logits [b_i,V]: one forward pass."""
    if len(asked) == 1:
        model, cache, tokens = asked[0]
        return [model.decode_step(tokens, cache)]
    sizes = [t.shape[0] for _, _, t in asked]
    model = asked[0][0]
    logits = model.decode_step(torch.cat([t for _, _, t in asked]), JoinedCache([c for _, c, _ in asked], sizes))
    return list(logits.split(sizes))
