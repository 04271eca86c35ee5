"""Waiting in a test for something that happens on another thread or process."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, TypeVar

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


def returns_in_time(call: Callable[[], T], what: str, timeout_s: float = WAIT_S) -> T:
    """``call()`` on a thread of its own, awaited at most ``timeout_s``: its result, or the
    exception it raised, raised here; AssertionError naming ``what`` if it is still
    running then (it is left to finish on its daemon thread).

    For a call that must not wait for something that takes far longer than
    ``timeout_s`` (a time limit the test sets to ten minutes, a server that never
    answers): returning at all shows that it did not wait, however busy the machine,
    where a bound on how long it took would not."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append((call(), None))
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
            outcome.append((None, e))

    runner = threading.Thread(target=run, name=f"pybk-test-call {what}", daemon=True)
    runner.start()
    runner.join(timeout_s)
    if not outcome:
        raise AssertionError(f"still waiting after {timeout_s} s: {what}")
    result, error = outcome[0]
    if error is not None:
        raise error
    return result
