"""Waiting in a test for something that happens on another thread or process."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")

#: How long :func:`wait_until` waits by default: a bound against hangs on a busy machine,
#: not an expectation of how fast things are.
WAIT_S = 60.0


def wait_until(condition: Callable[[], T], what: str, timeout_s: float = WAIT_S,
               interval_s: float = 0.02) -> T:
    """Call ``condition`` every ``interval_s`` until it returns a true value, and return
    that value; AssertionError naming ``what`` if it has not within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not (found := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(interval_s)
    return found
