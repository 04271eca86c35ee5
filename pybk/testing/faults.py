"""Fault injection on the path every transport takes: :class:`FaultyBookieClient` wraps
a :class:`~pybk.client.transport.BookieClient` (in-process or ZeroMQ) and fails, delays,
drops or holds back its operations as its :class:`Faults` say, so that tests drive
quorum, fencing and recovery deterministically.

Faults reach the single adds (``add``) and the batched adds a ledger really sends
(``ledger_adds``, ``add_grouped``), one decision per add, so a test of the protocol
exercises the path the ZeroMQ transport uses.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Sequence

from pybk.client.transport import AddsDone, BookieClient, LedgerAdds, chain, failed_future
from pybk.errors import BookieUnavailable, BookKeeperError


@dataclass
class Faults:
    """What to do to the operations of one bookie (tests set these while running).

    ``fail``: operation names ("add", "read", "read_batch", "read_lac", "write_lac",
    "delete_ledger") that fail at once with ``error``; ``drop``: names whose futures
    never complete (a lost reply); ``hold``: names whose operation reaches the bookie but
    whose reply is kept back until :meth:`release` (delivered as it was, or replaced by
    an error: a late answer); ``delay_s``: seconds before any reply; ``unreachable``:
    every call fails with BookieUnavailable.  ``only_entries`` limits fail/drop/hold of
    add and read to those ids.  "read_batch" is a batch read as one request (its reply
    held, failed or dropped whole, whatever its ids); "read" faults reach the reads of a
    batch read one by one instead.
    """

    fail: set[str] = field(default_factory=set)
    drop: set[str] = field(default_factory=set)
    hold: set[str] = field(default_factory=set)
    delay_s: float = 0.0
    unreachable: bool = False
    only_entries: set[int] | None = None
    error: Callable[[], BookKeeperError] = lambda: BookKeeperError("injected failure")
    _held: list[tuple[str, int | None, Future, Future]] = field(default_factory=list,
                                                                repr=False)
    _held_lock: threading.Condition = field(default_factory=threading.Condition,
                                            repr=False)

    def applying(self, name: str, entry_id: int | None) -> str | None:
        """The fault that operation ``name`` (of entry ``entry_id``, if it has one) meets
        now: "unreachable", "fail", "drop", "hold", or None (``delay_s`` aside)."""
        if self.unreachable:
            return "unreachable"
        if entry_id is not None and self.only_entries is not None \
                and entry_id not in self.only_entries:
            return None
        for fault, names in (("fail", self.fail), ("drop", self.drop), ("hold", self.hold)):
            if name in names:
                return fault
        return None

    def held(self) -> list[tuple[str, int | None]]:
        """The replies held back now, oldest first: ``(operation, entry id or None)``."""
        with self._held_lock:
            return [(name, entry_id) for name, entry_id, _, _ in self._held]

    def wait_held(self, count: int, timeout: float = 10.0) -> None:
        """Wait until at least ``count`` replies are held (TimeoutError after
        ``timeout`` seconds)."""
        with self._held_lock:
            if not self._held_lock.wait_for(lambda: len(self._held) >= count, timeout):
                raise TimeoutError(f"{len(self._held)} replies held after {timeout} s, "
                                   f"not {count}")

    def wait_answered(self, timeout: float = 10.0) -> None:
        """Wait until the bookie answered every operation held now (their replies are in,
        still held back), so that :meth:`release` delivers them on the caller's thread
        (TimeoutError after ``timeout`` seconds)."""
        with self._held_lock:
            replies = [reply for _, _, reply, _ in self._held]
        if futures_wait(replies, timeout).not_done:
            raise TimeoutError(f"the bookie did not answer a held operation in {timeout} s")

    def release(self, error: BookKeeperError | None = None,
                entries: set[int] | None = None) -> int:
        """Deliver the held replies (of ``entries`` only, if given), oldest first: as the
        bookie gave them, or failed with ``error``.  Returns how many were released."""
        with self._held_lock:
            chosen = [h for h in self._held if entries is None or h[1] in entries]
            self._held = [h for h in self._held if h not in chosen]
        for _name, _entry_id, reply, target in chosen:
            if error is None:
                chain(reply, target)
            else:
                def fail(_reply: Future, target: Future = target) -> None:
                    target.set_exception(error)
                reply.add_done_callback(fail)
        return len(chosen)

    def _keep(self, name: str, entry_id: int | None, reply: Future) -> Future:
        held: Future = Future()
        with self._held_lock:
            self._held.append((name, entry_id, reply, held))
            self._held_lock.notify_all()
        return held

    def _forget(self, reply: Future) -> None:
        """Drop the held reply ``reply`` (its request was never sent after all)."""
        with self._held_lock:
            self._held = [h for h in self._held if h[2] is not reply]


class _Sent(NamedTuple):
    """An add sent through :class:`_FaultyAdds`: the caller's token, and for an add whose
    reply is held, the future its answer goes to instead of the caller's sink."""

    token: Any
    held_reply: Future | None


class _FaultyAdds:
    """The adds of one caller's sink (:meth:`BookieClient.ledger_adds` or
    :meth:`BookieClient.add_grouped`) through a :class:`FaultyBookieClient`'s faults:
    :meth:`before_send` decides each add's fault as it is sent, and :meth:`answer`, the
    sink given to the inner client, passes the inner client's answers on (held ones to
    :meth:`Faults.release`, the rest to the caller's sink, after ``delay_s``)."""

    def __init__(self, client: "FaultyBookieClient", sink: AddsDone) -> None:
        self._client = client
        self._sink = sink

    def before_send(self, entry_id: int, token: Any) -> _Sent | None:
        """What to send the inner client for this add, or None if the fault answered it
        (failed) or drops it."""
        faults = self._client.faults
        fault = faults.applying("add", entry_id)
        if fault in ("unreachable", "fail"):
            error = faults.error() if fault == "fail" else BookieUnavailable(
                f"bookie {self._client.bookie_id} is unreachable")
            self._sink((token,), (error,))
            return None
        if fault == "drop":
            return None  # never answered: the caller's timeout must handle it
        if fault != "hold":
            return _Sent(token, None)
        reply: Future = Future()
        faults._keep("add", entry_id, reply).add_done_callback(
            lambda released: self._sink((token,), None if released.exception() is None
                                        else (released.exception(),)))
        return _Sent(token, reply)

    def unsent(self, sent: _Sent) -> None:
        """``sent`` was not taken by the inner client (its connection is down)."""
        if sent.held_reply is not None:
            self._client.faults._forget(sent.held_reply)

    def answer(self, sent: Sequence[_Sent],
               errors: Sequence[BaseException | None] | None) -> None:
        tokens: list[Any] = []
        passed_errors: list[BaseException | None] = []
        for i, add in enumerate(sent):
            error = None if errors is None else errors[i]
            if add.held_reply is None:
                tokens.append(add.token)
                passed_errors.append(error)
            elif error is None:
                add.held_reply.set_result(None)
            else:
                add.held_reply.set_exception(error)
        if not tokens:
            return
        answers = (tokens, None if errors is None else passed_errors)
        delay_s = self._client.faults.delay_s
        if delay_s > 0:
            _after(delay_s, lambda: self._sink(*answers))
        else:
            self._sink(*answers)


class FaultyBookieClient(BookieClient):
    """Wraps a client and applies :class:`Faults` to its operations, on every path an
    add takes: :meth:`add`, and the batched :meth:`ledger_adds` and :meth:`add_grouped`
    that a ledger uses (their faults decided per add, their answers passed through with
    the inner client's status per add)."""

    def __init__(self, inner: BookieClient, faults: Faults | None = None) -> None:
        self.inner = inner
        self.bookie_id = inner.bookie_id
        self.faults = faults or Faults()
        self._grouped: dict[AddsDone, _FaultyAdds] = {}  # per caller's sink (few: tests)

    def _apply(self, name: str, entry_id: int | None, call: Callable[[], Future]) -> Future:
        faults = self.faults
        fault = faults.applying(name, entry_id)
        if fault == "unreachable":
            return failed_future(BookieUnavailable(f"bookie {self.bookie_id} is unreachable"))
        if fault == "fail":
            return failed_future(faults.error())
        if fault == "drop":
            return Future()  # never completes: the caller's timeout must handle it
        if fault == "hold":
            return faults._keep(name, entry_id, call())
        if faults.delay_s <= 0:
            return call()
        delayed: Future = Future()

        def forward() -> None:
            chain(call(), delayed)

        _after(faults.delay_s, forward)
        return delayed

    def ledger_adds(self, ledger_id: int, master_key: bytes, sink: AddsDone,
                    recovery: bool = False, *, deferred: bool = False) -> LedgerAdds | None:
        """The inner client's sender, each add through the faults (so fault-driven tests
        take the path a ledger's adds really take: the transport's batched sends and its
        replies with a status per add)."""
        adds = _FaultyAdds(self, sink)
        send = self.inner.ledger_adds(ledger_id, master_key, adds.answer, recovery,
                                      deferred=deferred)
        if send is None:
            return None

        def faulty_send(entry_id: int, entry: bytes, token: Any, more: bool = False) -> bool:
            faults = self.faults
            if more and (faults.unreachable or "add" in faults.fail | faults.drop):
                # A later add of the group may be failed or dropped here, never reaching
                # the transport to send the group: each add leaves at once.
                more = False
            sent = adds.before_send(entry_id, token)
            if sent is None:
                return True  # answered by the fault, or dropped
            if send(entry_id, entry, sent, more):
                return True
            adds.unsent(sent)
            return False
        return faulty_send

    def add_grouped(self, ledger_id: int, entry_id: int, entry: bytes, master_key: bytes,
                    token: Any, sink: AddsDone, recovery: bool = False, *,
                    deferred: bool = False) -> None:
        """The inner client's grouped add through the faults; adds given the same
        ``sink`` share one wrapper, so the inner client still groups their answers."""
        adds = self._grouped.get(sink)
        if adds is None:
            adds = self._grouped[sink] = _FaultyAdds(self, sink)
        sent = adds.before_send(entry_id, token)
        if sent is not None:
            self.inner.add_grouped(ledger_id, entry_id, entry, master_key, sent, adds.answer,
                                   recovery, deferred=deferred)

    def add(self, ledger_id: int, entry_id: int, entry: bytes, master_key: bytes,
            recovery: bool = False, *, deferred: bool = False) -> Future:
        return self._apply("add", entry_id, lambda: self.inner.add(
            ledger_id, entry_id, entry, master_key, recovery, deferred=deferred))

    def read(self, ledger_id: int, entry_id: int, fence: bool = False,
             master_key: bytes = b"") -> Future:
        return self._apply("read", entry_id, lambda: self.inner.read(
            ledger_id, entry_id, fence, master_key))

    def read_batch(self, ledger_id: int, entry_ids: Sequence[int], max_bytes: int) -> Future:
        """The inner client's batch read, through the "read_batch" faults as one request;
        one read after the other, each through the faults, while a fault applies to
        reads."""
        faults = self.faults
        if faults.applying("read_batch", None) in ("fail", "drop", "hold"):
            return self._apply("read_batch", None, lambda: self.inner.read_batch(
                ledger_id, entry_ids, max_bytes))
        if faults.unreachable or faults.delay_s > 0 \
                or "read" in faults.fail | faults.drop | faults.hold:
            return super().read_batch(ledger_id, entry_ids, max_bytes)
        return self.inner.read_batch(ledger_id, entry_ids, max_bytes)

    def read_lac(self, ledger_id: int) -> Future:
        return self._apply("read_lac", None, lambda: self.inner.read_lac(ledger_id))

    def write_lac(self, ledger_id: int, lac: int, master_key: bytes) -> Future:
        return self._apply("write_lac", None, lambda: self.inner.write_lac(
            ledger_id, lac, master_key))

    def delete_ledger(self, ledger_id: int) -> Future:
        return self._apply("delete_ledger", None, lambda: self.inner.delete_ledger(ledger_id))

    def force_ledger(self, ledger_id: int, first: int = 0, last: int = -1) -> Future:
        return self._apply("force_ledger", None,
                           lambda: self.inner.force_ledger(ledger_id, first, last))


def _after(seconds: float, fn: Callable[[], None]) -> None:
    timer = threading.Timer(seconds, fn)
    timer.name = "pybk-fault-delay"
    timer.daemon = True
    timer.start()
