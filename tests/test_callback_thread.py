"""Where the callbacks of a WAL's append futures run: on pybk's callback thread, in
order, never on the bookie's journal thread (where a slow one would hold up every
append)."""

from __future__ import annotations

import threading

import pytest

import pybk
from pybk.testing import WAIT_S

pytestmark = pytest.mark.timeout(60)



def test_a_slow_callback_does_not_stall_another_threads_append(tmp_path):
    with pybk.open(tmp_path / "wal") as wal:
        in_callback, release = threading.Event(), threading.Event()

        def slow(_future) -> None:
            in_callback.set()
            release.wait(timeout=2 * WAIT_S)

        appended = []
        other = threading.Thread(target=lambda: appended.append(wal.append(b"another")))
        try:
            wal.append_async(b"with a slow callback").add_done_callback(slow)
            assert in_callback.wait(timeout=WAIT_S)
            other.start()
            other.join(timeout=WAIT_S)
            assert appended, "an append waited for another append's callback"
        finally:
            release.set()
            if other.is_alive() or other.ident is not None:
                other.join(timeout=3 * WAIT_S)


def test_callbacks_run_in_append_order_on_pybks_callback_thread(tmp_path):
    seen = []
    all_seen = threading.Event()
    count = 2000

    def record(future) -> None:
        seen.append((future.result(), threading.current_thread().name))
        if len(seen) == count:
            all_seen.set()

    with pybk.open(tmp_path / "wal") as wal:
        for i in range(count):
            wal.append_async(b"record %d" % i).add_done_callback(record)
        assert all_seen.wait(timeout=WAIT_S)
    names = {name for _, name in seen}
    # A callback added to a future that is already done runs at once on the caller's
    # thread (as with any Future); every other one on the callback thread.
    assert names <= {"pybk-callbacks", threading.current_thread().name}, names
    assert "pybk-callbacks" in names
    on_callback_thread = [position for position, name in seen if name == "pybk-callbacks"]
    assert on_callback_thread == sorted(on_callback_thread)


def test_a_callback_may_append_and_wait(tmp_path):
    """The callback thread is not one an append waits for, so a callback may call the
    blocking ``append`` (before, on the journal thread, it would have waited for
    itself)."""
    with pybk.open(tmp_path / "wal") as wal:
        appended = []
        done = threading.Event()

        def append_more(_future) -> None:
            try:
                appended.append(wal.append(b"from a callback"))
            finally:
                done.set()

        first = wal.append_async(b"first")
        first.add_done_callback(append_more)
        assert done.wait(timeout=WAIT_S)
        assert len(appended) == 1 and appended[0] > first.result()
        assert [data for _, data in wal.read()] == [b"first", b"from a callback"]
