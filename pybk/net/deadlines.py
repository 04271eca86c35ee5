"""Deadlines for an event loop: which items are due, and how long to sleep until the next.

Requests and long polls are usually answered long before their deadline.  Rather than
removing them from the heap then (a linear search), they stay and are skipped when they
come up; the heap is rebuilt without them whenever it has doubled since the last
rebuild, so a busy loop keeps only about twice the items that are really waiting.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from typing import Callable, Generic, TypeVar

T = TypeVar("T")

_REBUILD_MIN_ITEMS = 1024


class Deadlines(Generic[T]):
    """Items due at ``time.monotonic()`` deadlines.  ``live(item)`` says whether an item
    still waits (an answered request does not).  One thread only."""

    def __init__(self, live: Callable[[T], bool]) -> None:
        self._live = live
        self._heap: list[tuple[float, int, T]] = []
        self._seq = itertools.count()  # ties: first added, first due; items never compared
        self._rebuild_at = _REBUILD_MIN_ITEMS

    def add(self, deadline: float, item: T) -> None:
        heapq.heappush(self._heap, (deadline, next(self._seq), item))
        if len(self._heap) >= self._rebuild_at:
            self._heap = [entry for entry in self._heap if self._live(entry[2])]
            heapq.heapify(self._heap)
            self._rebuild_at = max(_REBUILD_MIN_ITEMS, 2 * len(self._heap))

    def timeout_ms(self, now: float | None = None) -> int | None:
        """Milliseconds until the first live item is due (0: now), None if there is none."""
        heap = self._heap
        while heap and not self._live(heap[0][2]):
            heapq.heappop(heap)
        if not heap:
            return None
        now = time.monotonic() if now is None else now
        return max(0, math.ceil((heap[0][0] - now) * 1000))

    def pop_due(self, now: float | None = None) -> list[T]:
        """The live items whose deadline has passed, earliest first; they are removed."""
        now = time.monotonic() if now is None else now
        heap = self._heap
        due = []
        while heap and heap[0][0] <= now:
            item = heapq.heappop(heap)[2]
            if self._live(item):
                due.append(item)
        return due
