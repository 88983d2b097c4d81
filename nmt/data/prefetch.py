"""Batches prepared off the critical path: a background thread that collates the next training steps.

While step n runs, a background thread collates (numpy gathers, padding, masks) and pins the
micro-batches of steps n+1, n+2, ...; the training loop only starts their asynchronous copies. numpy
and torch release the GIL in that work, so it overlaps the loop's own Python.

`Prefetcher(make, items, depth)` yields `make(item)` for each item, in order, at most `depth` ahead;
`depth` 0 computes each in the consumer's thread. `make` is a pure function (`collate` of fixed pair
indices), so training is the same bit for bit with or without it, and resuming stays exact. An
exception in `make` is raised in the consumer at the failing item; `close()` (or leaving a `with`
block) stops the thread without waiting for the rest.
"""

from __future__ import annotations

import queue
import threading
from typing import Callable, Generic, Iterable, Iterator, TypeVar

T = TypeVar("T")
R = TypeVar("R")

_DONE = object()


class Prefetcher(Generic[T, R]):
    """An iterator over make(item) for item in items, prepared up to `depth` items ahead in one thread."""

    def __init__(self, make: Callable[[T], R], items: Iterable[T], depth: int = 2):
        self._make, self._items, self.depth = make, iter(items), depth
        self._stop = threading.Event()
        self._queue: queue.Queue = queue.Queue(maxsize=max(depth, 1))
        self._thread = None
        if depth > 0:
            self._thread = threading.Thread(target=self._run, name="nmt-prefetch", daemon=True)
            self._thread.start()

    def _put(self, value) -> bool:
        """Queue `value` unless the consumer has gone; False when it has."""
        while not self._stop.is_set():
            try:
                self._queue.put(value, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            for item in self._items:
                if self._stop.is_set() or not self._put((True, self._make(item))):
                    return
        except BaseException as e:  # raised in the consumer, at this item
            self._put((False, e))
            return
        self._put((True, _DONE))

    def __iter__(self) -> Iterator[R]:
        if self._thread is None:
            yield from (self._make(item) for item in self._items)
            return
        try:
            while True:
                ok, value = self._queue.get()
                if not ok:
                    raise value
                if value is _DONE:
                    return
                yield value
        finally:  # (the thread ends after its item; close() joins it, from the consumer: a join in here, in a
            self._stop.set()  # generator the garbage collector closes, would swallow a second Ctrl-C)

    def close(self) -> None:
        """Stop preparing (the thread ends after the item it is making)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def __enter__(self) -> "Prefetcher[T, R]":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
