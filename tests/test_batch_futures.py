"""Record futures that share their batch's condition behave as plain Futures."""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time

import pytest

from pybk.log import futures as futures_module
from pybk.log.futures import BatchFutures, wait_for_callbacks
from pybk.testing import WAIT_S

pytestmark = pytest.mark.timeout(30)


def test_results_callbacks_and_no_cancelling():
    batch = BatchFutures()
    futures = [batch.new() for _ in range(3)]
    seen = []
    futures[0].add_done_callback(lambda f: seen.append(f.result()))
    assert not any(f.done() for f in futures)
    assert futures[1].cancel() is False  # an append cannot be taken back
    with pytest.raises(cf.TimeoutError):
        futures[2].result(timeout=0.01)
    batch.set_results(["a", "b", "c"])
    assert [f.result() for f in futures] == ["a", "b", "c"]
    assert wait_for_callbacks(timeout=10)
    futures[1].add_done_callback(lambda f: seen.append(f.result()))  # runs at once
    assert seen == ["a", "b"]
    assert all(f.done() and not f.cancelled() for f in futures)


@pytest.mark.parametrize("layout_known", [True, False], ids=["shared", "plain-fallback"])
def test_callbacks_run_in_completion_order_on_the_callback_thread(monkeypatch,
                                                                   layout_known):
    """Never on the completing thread (a bookie's journal thread, in a WAL), and in the
    order the batches completed, also for exceptions; with plain Futures too."""
    monkeypatch.setattr(futures_module, "_LAYOUT_KNOWN", layout_known)
    batches = [BatchFutures() for _ in range(20)]
    seen = []
    for number, batch in enumerate(batches):
        for slot in range(3):
            batch.new().add_done_callback(lambda f, n=number, s=slot: seen.append(
                (n, s, threading.current_thread().name)))
    for number, batch in enumerate(batches):
        if number % 5 == 4:
            batch.set_exception(ValueError("failed batch"))
        else:
            batch.set_results([number] * 3)
    assert wait_for_callbacks(timeout=10)
    assert [(n, s) for n, s, _ in seen] == [(n, s) for n in range(20) for s in range(3)]
    assert {name for _, _, name in seen} == {"pybk-callbacks"}


def test_exceptions_reach_every_waiter():
    batch = BatchFutures()
    futures = [batch.new() for _ in range(2)]
    batch.set_exception(ValueError("boom"))
    for future in futures:
        with pytest.raises(ValueError, match="boom"):
            future.result()
        assert isinstance(future.exception(), ValueError)


def test_waiters_on_siblings_wake_only_when_their_own_future_is_done():
    """Many threads wait on the futures of one batch; completing the batch wakes them
    all with their own results and none with a spurious timeout."""
    batch = BatchFutures()
    futures = [batch.new() for _ in range(50)]
    results: dict[int, object] = {}

    def wait(i: int) -> None:
        try:
            results[i] = futures[i].result(timeout=WAIT_S)
        except Exception as e:  # recorded, then asserted below
            results[i] = e

    threads = [threading.Thread(target=wait, args=(i,)) for i in range(50)]
    for thread in threads:
        thread.start()
    time.sleep(0.05)
    batch.set_results(list(range(50)))
    for thread in threads:
        thread.join(timeout=10)
    assert results == {i: i for i in range(50)}


def test_wait_and_as_completed_work_across_batches():
    first, second = BatchFutures(), BatchFutures()
    a, b = first.new(), second.new()
    plain = cf.Future()
    threading.Timer(0.05, lambda: first.set_results([1])).start()
    done, pending = cf.wait([a, b, plain], timeout=5, return_when=cf.FIRST_COMPLETED)
    assert done == {a} and pending == {b, plain}
    second.set_results([2])
    plain.set_result(3)
    assert sorted(f.result() for f in cf.as_completed([a, b, plain], timeout=5)) == [1, 2, 3]
