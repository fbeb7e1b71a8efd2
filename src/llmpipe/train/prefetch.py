"""Data loading off the step's critical path: a background thread reads the rows of the next steps
while the current one runs (a bounded queue, `depth` steps ahead), and the step measures how long it
waited for them (`wait_s`: the metric `data_wait_s`).

Reading a step's rows is Arrow -> numpy -> torch (llmpipe.train.view), which releases the GIL for the
copies; the forward/backward's torch kernels release it too, so the two overlap. depth 0 reads in the
step itself (no thread), the same rows in the same order.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Prefetcher(Generic[T]):
    """`read(step)` for steps start..stop-1, in order, `depth` steps ahead of `get` in a daemon thread."""

    def __init__(self, read: Callable[[int], T], start: int, stop: int, depth: int = 1):
        self.read, self.depth, self.wait_s = read, depth, 0.0
        self._closed = threading.Event()
        self._queue: queue.Queue = queue.Queue(maxsize=max(depth, 1))
        self._thread = None
        if depth > 0 and start < stop:
            self._thread = threading.Thread(target=self._fill, args=(start, stop), daemon=True, name="llmpipe-prefetch")
            self._thread.start()

    def _fill(self, start: int, stop: int) -> None:
        for step in range(start, stop):
            try:
                item = (step, self.read(step), None)
            except BaseException as exc:  # handed to the step that needs these rows
                item = (step, None, exc)
            while not self._closed.is_set():
                try:
                    self._queue.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if item[2] is not None or self._closed.is_set():
                return

    def get(self, step: int) -> T:
        """The rows of `step`; `wait_s` is how long this call waited for them."""
        begin = time.perf_counter()
        if self._thread is None:
            value = self.read(step)
        else:
            got, value, exc = self._queue.get()
            if exc is not None:
                raise exc
            if got != step:
                raise RuntimeError(f"prefetched rows of step {got} where step {step} was asked (steps are taken in order)")
        self.wait_s = time.perf_counter() - begin
        return value

    def close(self) -> None:
        self._closed.set()
        if self._thread is not None:
            while self._thread.is_alive():
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    self._thread.join(timeout=0.05)
