"""``ZmqBookieClient``: the :class:`~pybk.client.transport.BookieClient` that reaches a
bookie's :class:`~pybk.net.server.BookieServer` over ZeroMQ.

Connections.  Each client has one DEALER socket connected to its bookie.  Requests are
pipelined: each carries a request id (unique within its :class:`ClientLoop`) and replies
are matched by id, in whatever order they come (:mod:`pybk.net.wire`).

Threads.  A :class:`ClientLoop` is one I/O thread that owns the sockets of every client
made on it: it opens and closes them, follows their connections, times requests out and
receives every reply.  Callers on any thread send their requests themselves when they
can (a thread writes its request, or the ADD message of the adds queued, to the socket
when nobody else is using it, under the connection's lock, so a light load costs no
wake-up of the loop on the way out; see :class:`_Connection`), and else hand them to the
loop through a :class:`~pybk.net.mailbox.Mailbox`.  Share one loop between the
clients of a process (``ZmqBookieClient(..., loop=loop)``); a client made without one
gets its own.  The futures a client returns complete on the loop's thread, so their
callbacks must be short and must not wait for other requests (the ledger client's
callbacks are written that way, as they are for the bookie's journal thread).  The loop
handles the replies of a round last, just before it sleeps: a completion wakes the
thread waiting for it, which then finds the interpreter lock free rather than waiting
for it a second time (a thread switch each way) while the loop goes on.

Failures:

* Every request has a time limit: adds, explicit LACs and deletes ``addEntryTimeout``;
  reads, batch reads, LAC reads and INFO ``readTimeout``; a long poll its wait plus
  ``readTimeout``.
  A request not answered in time fails with Timeout; the connection stays.  A force or
  an explicit LAC held behind the adds queued before it (:meth:`_Connection.submit`),
  and the requests made after it, are timed from when they leave: at most the adds'
  own limit later.
* The connection: the DEALER queues messages only on a live connection
  (``ZMQ_IMMEDIATE``), and a socket monitor reports connection events.  When the
  connection drops (the bookie closed or crashed, or its heartbeat went silent for
  ``zmqHeartbeatTimeoutMs``) every request outstanding on it fails at once with
  BookieUnavailable, which makes the ledger client replace the bookie.  While the bookie
  is unreachable new requests fail at once the same way; ZeroMQ reconnects in the
  background (100 ms apart, backing off to ``zmqReconnectIntervalMaxMs``) and requests
  flow again once the bookie is back.  Requests made before the first connection is up
  wait for it (until their time limit, or until the connection is refused).
* Requests are never resent: after a failure, whether the bookie executed one is
  unknown, as after any timeout; the ledger protocol is built for that.
* Back-pressure: when ZeroMQ's send queue is full (the bookie reads slowly), requests
  wait in the client, in order, within their time limits.

Adds are batched: :meth:`ZmqBookieClient.add_then` queues an add, and the loop sends
what is queued for a bookie as one ADD message (of any ledgers, up to the body limit of
:mod:`pybk.net.wire`), which the bookie answers with one reply.  At most
``zmqAddMessagesInFlight`` ADD messages per bookie wait for their answer; adds made
meanwhile gather and leave together when one is answered (Nagle's idea, with the
bookie's group commit as the clock).  So messages grow with the load and the
per-message costs (system calls, thread wake-ups, ZeroMQ, Python) are paid per batch;
an add made on an idle client leaves at once, alone, sent by the caller's thread.

Catch-up reads ask for many entries in one READ_BATCH request
(:meth:`ZmqBookieClient.read_batch`; :mod:`pybk.client.reads` keeps several in flight).

Replies are received into one copy (``bytes``: what the ledger client keeps); frames
are sent without a copy from 1 MiB up (:mod:`pybk.net.frames`).
"""

from __future__ import annotations

import bisect
import enum
import itertools
import logging
import operator
import select
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Sequence

import zmq
from zmq.utils.monitor import recv_monitor_message

from pybk.client.transport import AddCallback, AddsDone, BookieClient, LedgerAdds
from pybk.errors import (
    BookieUnavailable,
    BookKeeperError,
    EntryTooLarge,
    MalformedMessage,
    Timeout,
    error_for_code,
)
from pybk.net import curve, wire
from pybk.net.deadlines import Deadlines
from pybk.net.frames import received, send_message
from pybk.net.mailbox import Mailbox
from pybk.net.wire import Op, Reply, Request
from pybk.settings import ClientSettings

log = logging.getLogger(__name__)

#: Replies read from one socket per wake-up before the loop serves the others.
_READ_BATCH = 256
#: The least an add takes in an ADD body besides its entry (a run of its own, empty key).
_LEAST_ADD_OVERHEAD = wire.RUN_HEADER.size + wire.RUN_BYTES_PER_ADD
#: The first reconnection attempt waits this long; later ones back off.
_RECONNECT_MS = 100
#: The loop sleeps at most this long, so that the deadline of a request another thread
#: sent (due later than this) needs no wake-up: the loop takes it at its next round.
_MAX_SLEEP_MS = 1000

_UP_EVENT = zmq.EVENT_HANDSHAKE_SUCCEEDED
_DOWN_EVENTS: dict[int, str] = {  # keyed by the monitor's event number
    zmq.EVENT_DISCONNECTED: "connection lost",
    zmq.EVENT_CONNECT_RETRIED: "connection refused or timed out",
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "ZeroMQ handshake failed",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "ZeroMQ handshake failed (protocol)",
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "ZeroMQ handshake failed (authentication)",
}
_MONITORED = _UP_EVENT | sum(_DOWN_EVENTS)
# Plain ints: an enum operand makes every test build a flag object in Python.
_EVENTS, _POLLIN, _POLLOUT = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.POLLOUT)

#: What each operation's future gives, from its success reply (adds: see _AddBatch).
_RESULTS: dict[Op, Callable[[Reply], object]] = {
    Op.READ: lambda reply: reply.body,
    Op.READ_LAC: lambda reply: reply.lac,
    Op.WRITE_LAC: lambda reply: None,
    Op.LONG_POLL: lambda reply: (reply.lac, reply.body),
    Op.INFO: lambda reply: wire.decode_info(reply.required_body()),
    Op.DELETE: lambda reply: None,
    Op.FORCE_LEDGER: lambda reply: reply.lac,  # asked with HELD: the entries held
}


class ClientLoop:
    """One I/O thread owning the DEALER sockets of many :class:`ZmqBookieClient`.

    Use as a context manager or call :meth:`close` (after, or instead of, closing its
    clients: closing the loop fails whatever they still have outstanding).
    """

    def __init__(self) -> None:
        self._context = zmq.Context(io_threads=1)
        self._mailbox = Mailbox()
        self._ids = itertools.count(1)
        # Descriptors only (a ZeroMQ socket's ZMQ_FD): a plain poll, a third of the cost
        # of zmq.Poller with sockets, which asks ZeroMQ about each at every poll.
        self._poller = select.poll()
        self._poller.register(self._mailbox.fileno(), select.POLLIN)
        self._handlers: dict[int, Callable[[], None]] = {}
        self._connections: set[_Connection] = set()
        self.deadlines: Deadlines[_Pending] = Deadlines(lambda p: not p.done)
        # Requests other threads sent, with their deadlines, for the loop to time
        # (appended there, taken here), and when the loop wakes at the latest.
        self._sent_elsewhere: deque[tuple[float, _Pending]] = deque()
        self._sleep_until = 0.0
        # Connections to serve at the next round without waiting for their descriptor.
        self._ready: list[_Connection] = []
        # Replies received this round, handled last, just before the loop sleeps (see
        # _run), and whether their handling started a request's timer.
        self._replies: list[tuple[_Connection, list[list[bytes]]]] = []
        self._timer_started = False
        self._stopping = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="pybk-zmq-client",
                                        daemon=True)
        self._thread.start()
        self._thread_id = self._thread.ident  # read at every send: a field, not a property

    def __enter__(self) -> "ClientLoop":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def context(self) -> zmq.Context:
        return self._context

    def next_request_id(self) -> int:
        return next(self._ids)  # atomic under the GIL: callers on any thread

    def post(self, work: Callable[[], None]) -> bool:
        """Run ``work`` on the loop's thread; False if the loop is closed."""
        return self._mailbox.post(work)

    def on_loop_thread(self) -> bool:
        return threading.get_ident() == self._thread_id

    def start_timer(self, pending: "_Pending") -> None:
        """Fail ``pending`` with Timeout once its time limit passes (any thread: a request
        sent by another thread is timed from the loop's next round, which comes before
        the deadline, or is woken for it)."""
        deadline = time.monotonic() + pending.timeout_s
        if self.on_loop_thread():
            self.deadlines.add(deadline, pending)
            self._timer_started = True
            return
        self._sent_elsewhere.append((deadline, pending))
        if deadline < self._sleep_until:  # read after the append: see _sleep_ms
            self.post(_nothing)

    def serve_soon(self, connection: "_Connection") -> None:
        """Have the loop serve ``connection``'s socket (read replies, send its backlog)
        though its descriptor may not say so: another use of the socket took the
        signal (ZeroMQ's descriptor is edge-triggered)."""
        if self.on_loop_thread():
            self._ready.append(connection)
        else:
            self.post(connection.serve)

    def run_and_wait(self, work: Callable[[], None]) -> None:
        """Run ``work`` on the loop's thread and wait for it (not at all once closed)."""
        if threading.current_thread() is self._thread:
            work()
            return
        done = threading.Event()

        def run() -> None:
            try:
                work()
            finally:
                done.set()

        if self.post(run):
            while not done.wait(0.1) and self._thread.is_alive():
                pass

    def close(self) -> None:
        """Close every connection (failing what is outstanding) and stop the thread."""
        if threading.current_thread() is self._thread:
            raise BookKeeperError("a ClientLoop cannot be closed from its own thread "
                                  "(from a future's callback); close it from another")
        if self._closed:
            return
        self._closed = True
        self.post(self._stop)
        self._thread.join()
        self._context.term()

    # -- on the loop's thread ---------------------------------------------------------

    def attach(self, connection: "_Connection",
               handlers: dict[int, Callable[[], None]]) -> bool:
        """Start polling a connection's descriptors (for POLLIN; a ZeroMQ socket's is its
        edge-triggered ``ZMQ_FD``, so its handler takes everything waiting); False if the
        loop is stopping."""
        if self._stopping:
            return False
        self._connections.add(connection)
        for socket, handler in handlers.items():
            self._handlers[socket] = handler
            self._poller.register(socket, select.POLLIN)
        return True

    def detach(self, connection: "_Connection", descriptors: list[int]) -> None:
        self._connections.discard(connection)
        for fd in descriptors:
            self._handlers.pop(fd, None)
            self._poller.unregister(fd)

    def _stop(self) -> None:
        self._stopping = True

    def handle_later(self, connection: "_Connection", replies: list[list[bytes]]) -> None:
        """Have ``connection`` handle ``replies`` at the end of this round (loop thread)."""
        self._replies.append((connection, replies))

    def handle_replies(self) -> None:
        """Handle the replies received so far (loop thread; before a connection fails
        what is outstanding, as the replies that came before still count)."""
        replies, self._replies = self._replies, []
        for connection, frames in replies:
            connection.handle_replies(frames)

    def _handle_replies(self, sleep_ms: int) -> int:
        """Handle the replies of this round; return how long the loop may sleep now
        (``sleep_ms``, unless their callbacks sent a request or left a socket to serve).
        """
        self._timer_started = False
        self.handle_replies()
        return self._sleep_ms() if self._ready or self._timer_started else sleep_ms

    def _sleep_ms(self) -> int:
        """How long the next poll may sleep, once the deadlines of requests sent by other
        threads are taken in.  ``_sleep_until`` is published before they are taken: a
        thread that appends one later reads it after its append (see
        :meth:`start_timer`),
        and so sees at most the time this round really sleeps until."""
        now = time.monotonic()
        self._sleep_until = now if self._ready else now + _MAX_SLEEP_MS / 1000
        sent = self._sent_elsewhere
        for _ in range(len(sent)):
            self.deadlines.add(*sent.popleft())
        if self._ready:
            return 0
        due = self.deadlines.timeout_ms(now)
        sleep_ms = _MAX_SLEEP_MS if due is None else min(due, _MAX_SLEEP_MS)
        self._sleep_until = now + sleep_ms / 1000
        return sleep_ms

    def _run(self) -> None:
        try:
            mailbox = self._mailbox.fileno()  # the poller reports it by number
            while not self._stopping:
                sleep_ms = self._sleep_ms()
                if self._replies:
                    # Last before sleeping: a reply's callback wakes the thread waiting
                    # for it, which then finds the interpreter lock free instead of
                    # waiting for it a second time while this thread goes on.
                    sleep_ms = self._handle_replies(sleep_ms)
                for fd, _ in self._poller.poll(sleep_ms):
                    if fd == mailbox:
                        self._mailbox.run_posted()
                    else:
                        handler = self._handlers.get(fd)
                        if handler is not None:  # None: detached earlier in this round
                            handler()
                ready, self._ready = self._ready, []
                for connection in ready:
                    connection.serve()
                due = self.deadlines.pop_due()
                if due and self._replies:
                    # The replies read this round came before the deadlines were looked
                    # at: they settle their requests rather than lose to the timer.
                    self.handle_replies()
                for pending in due:
                    pending.connection.expire(pending)
        except Exception:  # a bug here must fail requests, not leave them hanging
            log.exception("ZeroMQ client loop failed; closing its connections")
        finally:
            self._stopping = True
            self.handle_replies()
            self._mailbox.close()
            self._mailbox.run_posted()  # work posted before the close: it fails cleanly
            for connection in list(self._connections):
                connection.close()


class _Pending:
    """A request waiting for its reply; :meth:`settle` or :meth:`fail` it once (loop
    thread)."""

    __slots__ = ("request_id", "op", "frames", "timeout_s", "connection", "done")

    def __init__(self, request_id: int, op: Op, frames: list[bytes], timeout_s: float,
                 connection: "_Connection") -> None:
        self.request_id = request_id
        self.op = op
        self.frames = frames
        self.timeout_s = timeout_s
        self.connection = connection
        self.done = False

    def settle(self, reply: Reply) -> None:
        """Complete with a reply of status 0."""
        self.done = True
        self._succeed(reply)

    def fail(self, error: BaseException) -> None:
        if not self.done:
            self.done = True
            self._fail(error)

    def _succeed(self, reply: Reply) -> None:
        raise NotImplementedError

    def _fail(self, error: BaseException) -> None:
        raise NotImplementedError


class _Call(_Pending):
    """A request whose caller waits on a Future."""

    __slots__ = ("future",)

    def __init__(self, request_id: int, op: Op, frames: list[bytes], timeout_s: float,
                 connection: "_Connection", future: Future) -> None:
        super().__init__(request_id, op, frames, timeout_s, connection)
        self.future = future

    def _succeed(self, reply: Reply) -> None:
        self.future.set_result(_RESULTS[self.op](reply))

    def _fail(self, error: BaseException) -> None:
        self.future.set_exception(error)


class _ReadBatch(_Call):
    """A READ_BATCH request: its future gives an answer (bytes or error) per entry id
    answered, in the order asked (see :meth:`BookieClient.read_batch`)."""

    __slots__ = ("ledger_id", "entry_ids")

    def __init__(self, request_id: int, frames: list[bytes], timeout_s: float,
                 connection: "_Connection", future: Future, ledger_id: int,
                 entry_ids: Sequence[int]) -> None:
        super().__init__(request_id, Op.READ_BATCH, frames, timeout_s, connection, future)
        self.ledger_id = ledger_id
        self.entry_ids = entry_ids

    def _succeed(self, reply: Reply) -> None:
        connection = self.connection
        try:
            statuses, entries = wire.decode_read_answers(
                reply.required_body(), len(self.entry_ids), connection.max_entry_bytes)
        except BookKeeperError as e:
            self._fail(e)
            return
        self.future.set_result([
            entry if not status else error_for_code(
                status, f"bookie {connection.bookie_id}: ledger {self.ledger_id} entry "
                        f"{entry_id}")
            for entry_id, status, entry in zip(self.entry_ids, statuses, entries)])


class _AddBatch(_Pending):
    """One ADD message: ``reports``, its adds in message order as ``(sink, tokens)``
    groups (see :meth:`BookieClient.add_grouped`), and ``count``, how many adds in all."""

    __slots__ = ("reports", "count")

    def __init__(self, request_id: int, frames: list[bytes], timeout_s: float,
                 connection: "_Connection", reports: list[tuple[AddsDone, list]]) -> None:
        super().__init__(request_id, Op.ADD, frames, timeout_s, connection)
        self.reports = reports
        self.count = sum(len(tokens) for _sink, tokens in reports)

    def _succeed(self, reply: Reply) -> None:
        try:
            statuses = wire.decode_add_statuses(reply.required_body(), self.count)
        except BookKeeperError as e:
            self._fail(e)
            return
        bookie = self.connection.bookie_id
        self._finish(None if statuses is None else
                     [error_for_code(status, f"bookie {bookie}: {reply.message}")
                      if status else None for status in statuses])

    def _fail(self, error: BaseException) -> None:
        self._finish([error] * self.count)

    def _finish(self, errors: list[BaseException | None] | None) -> None:
        connection = self.connection
        with connection.lock:
            connection.add_batches_in_flight -= 1
        _report(self.reports, errors)
        connection.send_adds()  # the adds that gathered while this one was out


def _report(reports: list[tuple[AddsDone, list]],
            errors: list[BaseException | None] | None) -> None:
    """Call each sink with its tokens and their slice of ``errors`` (None: all durable);
    one faulty sink does not keep the others from running."""
    start = 0
    for sink, tokens in reports:
        end = start + len(tokens)
        try:
            sink(tokens, None if errors is None else errors[start:end])
        except Exception:
            log.exception("an add callback raised")
        start = end


def _nothing() -> None:
    """Posted work that only wakes the loop (to take a deadline in)."""


def _call_each(callbacks: Sequence[AddCallback],
               errors: Sequence[BaseException | None] | None) -> None:
    """The sink of :meth:`ZmqBookieClient.add_then`: its tokens are the callbacks."""
    for callback, error in zip(callbacks, itertools.repeat(None) if errors is None
                               else errors):
        try:
            callback(error)
        except Exception:
            log.exception("an add callback raised")


@dataclass(slots=True)
class _QueuedAdd:
    """An add waiting in its connection's queue for the next ADD message.

    One is made per add, on the caller's thread, so it is a slotted dataclass rather
    than a NamedTuple: with CPython 3.11 it is built in about 0.18 µs against 0.31 µs,
    and a field read costs a few ns against about 16 (a slot, not a descriptor).
    """

    #: What it shares with the other adds of its run: ledger, key, flags, sink.
    ledger_adds: _LedgerAdds
    entry_id: int
    entry: bytes
    #: What its sink is told it by.
    token: Any


#: The key that groups queued adds into runs.
_RUN_OF = operator.attrgetter("ledger_adds")


class _LedgerAdds:
    """What the adds of one run of an ADD message share, for one connection: ledger,
    master key, recovery and deferred-sync flags, and the sink that reports them.

    :meth:`add` is the ledger client's fast path (see :meth:`ZmqBookieClient.ledger_adds`):
    the ledger, key and sink are given once, and each add is one call that appends to the
    connection's queue.
    """

    __slots__ = ("connection", "ledger_id", "master_key", "recovery", "deferred", "sink",
                 "overhead")

    def __init__(self, connection: "_Connection", ledger_id: int, master_key: bytes,
                 recovery: bool, sink: AddsDone, deferred: bool = False) -> None:
        self.connection = connection
        self.ledger_id = ledger_id
        self.master_key = master_key
        self.recovery = recovery
        self.deferred = deferred
        self.sink = sink
        # The most an add takes in an ADD body besides its entry: a run of its own.
        self.overhead = wire.RUN_HEADER.size + len(master_key) + wire.RUN_BYTES_PER_ADD

    def same_run(self, ledger_id: int, master_key: bytes, recovery: bool,
                 sink: AddsDone, deferred: bool) -> bool:
        return (self.ledger_id == ledger_id and self.master_key == master_key
                and self.recovery == recovery and self.sink is sink
                and self.deferred == deferred)

    def add(self, entry_id: int, entry: bytes, token: Any, more: bool = False) -> bool:
        """Queue an add for the connection's next ADD message (any thread), reported to
        the sink by ``token``; with ``more``, leave it queued for the caller's next add
        (so that a group goes in one message: see :meth:`BookieClient.ledger_adds`).
        False, queuing nothing, when the connection is down or closed: the caller asks
        for the bookie's client again (it may have moved)."""
        connection = self.connection
        if connection.refusing:
            if connection.adds:  # adds kept by ``more`` (the caller's group): they fail
                connection.lead_adds()  # now, not unanswered (the caller may move on)
            return False
        # _Connection.queue, inlined: this runs once per add and bookie.
        connection.adds.append(_QueuedAdd(self, entry_id, entry, token))
        if not more and not connection.adds_posted \
                and connection.add_batches_in_flight < connection.add_batches_limit:
            connection.lead_adds()
        return True


class _State(enum.Enum):
    CONNECTING = "connecting"  # never connected yet: requests wait
    UP = "up"
    DOWN = "down"              # requests fail at once while ZeroMQ reconnects
    CLOSED = "closed"


class _Connection:
    """One DEALER socket to one bookie, and its outstanding requests.

    The loop's thread owns the connection's life (open, up, down, close) and reads every
    reply.  A thread queuing an add sends the ADD message itself when the socket is free
    (:meth:`lead_adds`), and a thread making another request sends it (:meth:`submit`),
    instead of waking the loop.  ``lock`` serialises every use of the socket (ZeroMQ
    sockets are not thread-safe; a lock's memory barrier makes passing one between
    threads safe) and of the sending state: the backlog, the ADD messages in
    flight, the state changes.  The loop never sleeps inside ZeroMQ on the socket: it
    polls the socket's descriptor (``ZMQ_FD``), which is edge-triggered, so whoever used
    the socket last checks ``ZMQ_EVENTS`` and has the loop serve it if replies wait.
    Only the loop's thread waits for the lock; other threads only try it (and post the
    work to the loop when it is taken), so no thread waits for another's callbacks.
    """

    def __init__(self, loop: ClientLoop, bookie_id: str, address: str,
                 settings: ClientSettings,
                 curve_keys: tuple[curve.KeyPair, bytes] | None = None) -> None:
        self.loop = loop
        self.bookie_id = bookie_id
        self.address = address
        self._settings = settings
        self._curve_keys = curve_keys  # this client's pair and the bookie's public key
        self._state = _State.CONNECTING
        self._down_reason = ""
        self.lock = threading.RLock()  # see the class docstring
        self._pending: dict[int, _Pending] = {}
        self._backlog: deque[_Pending] = deque()  # not yet taken by ZeroMQ
        # Requests other than adds that the loop is to send (see submit), in order, each
        # with whether it leaves after the adds queued before it.
        self.calls: deque[tuple[_Pending, bool]] = deque()
        # Adds from any thread, batched into ADD messages on the loop's thread.
        self.adds: deque[_QueuedAdd] = deque()
        self.adds_posted = False
        # How many adds have been taken from ``adds`` (lock held), and the requests held
        # until the adds queued before them have left, with the requests made after them
        # (see submit): each with the count of adds taken that releases it.
        self._adds_taken = 0
        self._after_adds: deque[tuple[int, _Pending]] = deque()
        self._last_ledger_adds: _LedgerAdds | None = None
        self.refusing = False  # down or closed: _LedgerAdds.add sends the caller back
        self._sending_adds = False
        self.add_batches_in_flight = 0
        # At the limit, a queued add does not wake the loop: the answer that brings the
        # count down sends what gathered (_AddBatch._finish), so a wake-up then would
        # find nothing it may send.  The add is appended before the count is read, so a
        # count seen stale was lowered by an answer whose send_adds takes the add.
        self.add_batches_limit = settings.zmqAddMessagesInFlight
        self._max_add_body = wire.max_add_body_bytes(settings.maxEntrySizeBytes)
        self.max_entry_bytes = settings.maxEntrySizeBytes
        self._socket: zmq.Socket | None = None
        self._fd = -1  # the socket's ZMQ_FD, which the loop polls
        self._monitor: zmq.Socket | None = None
        self._monitor_fd = -1  # the monitor socket's ZMQ_FD, which the loop polls

    @property
    def is_down(self) -> bool:
        return self._state is _State.DOWN

    def open(self) -> None:
        s = self._settings
        socket = self.loop.context.socket(zmq.DEALER)
        for option, value in (
                (zmq.IMMEDIATE, 1),   # queue only on a live connection; drop on loss
                (zmq.LINGER, 0),      # on close, outstanding requests fail anyway
                # Every reply answers a request held in _pending, so the replies queued
                # here are bounded by those: no high-water mark on receiving.
                (zmq.RCVHWM, 0),
                (zmq.MAXMSGSIZE, wire.zmq_max_message_bytes(s.maxEntrySizeBytes)),
                (zmq.HEARTBEAT_IVL, s.zmqHeartbeatIntervalMs),
                (zmq.HEARTBEAT_TIMEOUT, s.zmqHeartbeatTimeoutMs),
                (zmq.HEARTBEAT_TTL, s.zmqHeartbeatTimeoutMs),  # the bookie drops us too
                (zmq.CONNECT_TIMEOUT, s.zmqHeartbeatTimeoutMs),
                (zmq.RECONNECT_IVL, _RECONNECT_MS),
                (zmq.RECONNECT_IVL_MAX, s.zmqReconnectIntervalMaxMs)):
            socket.setsockopt(option, value)
        if self._curve_keys is not None:
            curve.connect_as_client(socket, *self._curve_keys)
        monitor = socket.get_monitor_socket(_MONITORED)
        fd = socket.getsockopt(zmq.FD)
        monitor_fd = monitor.getsockopt(zmq.FD)
        if not self.loop.attach(self, {fd: self.serve, monitor_fd: self._on_monitor}):
            _close_sockets(socket, monitor)
            self._state = _State.CLOSED
            self.refusing = True
            return
        self._socket, self._fd, self._monitor = socket, fd, monitor
        self._monitor_fd = monitor_fd
        # A ZMQ_FD signals new messages only once a receive found none: try one now.
        self._on_monitor()
        try:
            socket.connect(self.address)
        except zmq.ZMQError as e:  # a malformed address: nothing will ever connect
            self._went_down(f"cannot connect: {e}")

    def ledger_adds(self, ledger_id: int, master_key: bytes, recovery: bool,
                    sink: AddsDone, deferred: bool = False) -> _LedgerAdds:
        """The :class:`_LedgerAdds` of these (the last one made, when it matches: so a
        caller's consecutive adds share it, and form one run)."""
        last = self._last_ledger_adds
        if last is None or not last.same_run(ledger_id, master_key, recovery, sink,
                                             deferred):
            last = self._last_ledger_adds = _LedgerAdds(self, ledger_id, master_key,
                                                        recovery, sink, deferred)
        return last

    def queue(self, adds: _LedgerAdds, entry_id: int, entry: bytes, token: Any) -> None:
        """Queue an add for the next ADD message (any thread)."""
        self.adds.append(_QueuedAdd(adds, entry_id, entry, token))
        if not self.adds_posted and self.add_batches_in_flight < self.add_batches_limit:
            self.lead_adds()

    def lead_adds(self) -> None:
        """Send the queued adds from this thread if the connection is up and nobody is
        using its socket (no wake-up of the loop, no thread switch); else have the loop
        send them."""
        if self._state is _State.UP and self.lock.acquire(blocking=False):
            try:
                if self._state is _State.UP:  # may have changed before the lock
                    self.send_adds()
                    return
            finally:
                self.lock.release()
        self.post_adds()

    def post_adds(self) -> None:
        """Have the loop send the queued adds (an add queued while a post is due goes
        with it, so an add posts only when none is due)."""
        self.adds_posted = True
        if not self.loop.post(self.send_adds):
            # No send_adds will clear the flag: clear it before failing what is queued,
            # so that an add appended meanwhile is either taken below (it saw the flag
            # set before the clear) or fails through a post of its own (it saw it clear).
            self.adds_posted = False
            error = BookieUnavailable(f"the client of bookie {self.bookie_id} is closed")
            while self.adds:  # another thread failing them too may take the last one
                try:
                    add = self.adds.popleft()
                except IndexError:
                    break
                _report([(add.ledger_adds.sink, [add.token])], [error])

    def send_adds(self) -> None:
        """Send the queued adds in ADD messages, each as large as the body limit allows,
        while fewer than ``zmqAddMessagesInFlight`` of this connection's ADD messages
        wait for their answer; the rest wait for an answer, and then go together.  Any
        thread (see :meth:`lead_adds`)."""
        with self.lock:
            self.adds_posted = False  # before taking: an add queued from now on posts again
            if self._sending_adds:
                return  # re-entered from a message that failed at once: the loop below goes on
            self._sending_adds = True
            try:
                while self.adds and self.add_batches_in_flight < self.add_batches_limit:
                    runs, reports = self._take_batch()
                    if runs:
                        self._send_batch(runs, reports)
                    if self._after_adds:
                        self._send_after_adds()
            finally:
                self._sending_adds = False

    def _take_batch(self) -> tuple[list[wire.AddRun], list[tuple[AddsDone, list]]]:
        """The queued adds that fit one ADD message, as runs, and their ``(sink,
        tokens)`` groups in message order (failing entries over the maximum alone, at
        once)."""
        adds = self.adds
        max_entry = self._settings.maxEntrySizeBytes
        if len(adds) == 1 and len(adds[0].entry) <= max_entry:  # the light load's message
            add = adds.popleft()
            self._adds_taken += 1
            ledger_adds = add.ledger_adds
            return ([wire.AddRun(ledger_adds.ledger_id, [add.entry_id], [add.entry],
                                 ledger_adds.master_key, ledger_adds.recovery,
                                 ledger_adds.deferred)],
                    [(ledger_adds.sink, [add.token])])
        # Taken with popleft, never through an iterator of the deque: other threads
        # append to it, and an append after an iterator was made fails the iterator's
        # next step ("deque mutated during iteration"); the interpreter lock can pass to
        # another thread between the two.  Only the lock's holder takes from the left, so
        # the adds that do not fit go back there, in order, ahead of any appended
        # meanwhile.
        popleft = adds.popleft
        items = [popleft() for _ in range(min(len(adds), wire.MAX_ADDS_PER_MESSAGE))]
        # The most bytes each add takes in the body: its entry, and a run of its own.
        costs = [len(add.entry) + add.ledger_adds.overhead for add in items]
        oversized = max(costs) > max_entry + _LEAST_ADD_OVERHEAD and \
            max(len(add.entry) for add in items) > max_entry
        if oversized:  # they fail alone below, not in a message they would fail whole
            costs = [0 if len(add.entry) > max_entry else cost
                     for add, cost in zip(items, costs)]
        # The cut is found in C, with each add's most bytes (a few dozen more than it
        # takes inside a run); a legal add fits an empty message.
        ends = list(itertools.accumulate(costs, initial=0))
        cut = bisect.bisect_right(ends, self._max_add_body - wire.ADD_COUNT.size) - 1
        adds.extendleft(reversed(items[cut:]))
        del items[cut:]
        self._adds_taken += len(items)
        if oversized:
            legal = []
            for add in items:
                size = len(add.entry)
                if size <= max_entry:
                    legal.append(add)
                else:
                    _report([(add.ledger_adds.sink, [add.token])], [EntryTooLarge(
                        f"entry of {size} bytes is over the maximum of {max_entry}")])
            items = legal
        runs: list[wire.AddRun] = []
        reports: list[tuple[AddsDone, list]] = []
        for ledger_adds, grouped in itertools.groupby(items, _RUN_OF):
            group = list(grouped)
            entry_ids = [add.entry_id for add in group]
            entries: list[wire.Frame] = [add.entry for add in group]
            tokens = [add.token for add in group]
            last = runs[-1] if runs else None
            if last is not None and (
                    last.ledger_id, last.master_key, last.recovery, last.deferred) == (
                    ledger_adds.ledger_id, ledger_adds.master_key, ledger_adds.recovery,
                    ledger_adds.deferred):
                last.entry_ids.extend(entry_ids)
                last.entries.extend(entries)
            else:
                runs.append(wire.AddRun(ledger_adds.ledger_id, entry_ids, entries,
                                        ledger_adds.master_key, ledger_adds.recovery,
                                        ledger_adds.deferred))
            if reports and reports[-1][0] is ledger_adds.sink:
                reports[-1][1].extend(tokens)
            else:
                reports.append((ledger_adds.sink, tokens))
        return runs, reports

    def _send_batch(self, runs: list[wire.AddRun], reports: list[tuple[AddsDone, list]]
                    ) -> None:
        request_id = self.loop.next_request_id()
        try:
            frames = wire.encode_add_request(request_id, runs,
                                             self._settings.maxEntrySizeBytes)
        except BookKeeperError as e:
            frames = []
            error: BookKeeperError | None = e
        else:
            error = None
        batch = _AddBatch(request_id, frames, self._settings.addEntryTimeout, self,
                          reports)
        self.add_batches_in_flight += 1
        if error is not None:
            batch.fail(error)
        else:
            self.send(batch)

    def submit(self, call: _Pending, after_adds: bool = False) -> None:
        """Send a request from this thread when the connection is up, nobody is using its
        socket and no request submitted earlier waits for the loop or for adds (so
        requests leave in the order made): no wake-up of the loop, no thread switch.
        Else queue it for the loop, which sends what is queued in order (failing it at
        once if the loop is closed).

        ``after_adds``: the request leaves once every add queued on this connection
        before it has left in an ADD message (a FORCE_LEDGER or an explicit LAC is about
        those adds, and adds wait in the client while ``zmqAddMessagesInFlight`` ADD
        messages are out; the bookie handles a connection's messages in order, so the
        request then finds those adds stored or in its journal).  It always goes through
        the loop, which holds it (:meth:`_hold`), and the requests made after it wait
        behind it."""
        if not after_adds and not self.calls and self._state is _State.UP \
                and self.lock.acquire(blocking=False):
            try:
                # The state may have changed before the lock; a request held for adds
                # (moved there from ``calls`` under the lock) must not be overtaken.
                if self._state is _State.UP and not self._after_adds:
                    self.send(call)
                    return
            finally:
                self.lock.release()
        self.calls.append((call, after_adds))
        if not self.loop.post(self.send_calls):
            error = BookieUnavailable(f"the client of bookie {self.bookie_id} is closed")
            while self.calls:  # another thread failing them too may take the last one
                try:
                    self.calls.popleft()[0].fail(error)
                except IndexError:
                    break

    def send_calls(self) -> None:
        """Loop thread: send the requests queued by :meth:`submit`, in order (holding
        those that wait for adds, and those behind them)."""
        calls = self.calls
        with self.lock:
            for _ in range(len(calls)):
                try:
                    call, after_adds = calls.popleft()
                except IndexError:  # the loop closed: a submitting thread failed the rest
                    return
                if after_adds or self._after_adds:
                    self._hold(call, after_adds)
                else:
                    self.send(call)

    def _hold(self, call: _Pending, after_adds: bool) -> None:
        """Hold ``call`` behind the requests held already, and (``after_adds``) until
        the adds queued so far are taken (lock held; the count also takes in adds
        appended meanwhile by other threads, which only holds it a little longer; every
        add queued is taken, or failed, in time)."""
        if self._state is _State.CLOSED:  # _fail_all failed the held ones already
            call.fail(BookieUnavailable(f"the client of bookie {self.bookie_id} is closed"))
            return
        self._after_adds.append((self._adds_taken + len(self.adds) if after_adds else 0,
                                 call))
        self._send_after_adds()

    def _send_after_adds(self) -> None:
        """Send the held requests whose adds have been taken, in order (lock held)."""
        held = self._after_adds
        while held and held[0][0] <= self._adds_taken:
            self.send(held.popleft()[1])

    def send(self, pending: _Pending) -> None:
        """Send a request, or queue it until the connection is up (any thread; fails it
        at once when down or closed, which only the loop's thread meets)."""
        with self.lock:
            if self._state is _State.CLOSED:
                pending.fail(BookieUnavailable(f"the client of bookie {self.bookie_id} is "
                                               "closed"))
                return
            if self._state is _State.DOWN:
                pending.fail(BookieUnavailable(self._down_reason))
                return
            self._pending[pending.request_id] = pending
            self.loop.start_timer(pending)
            self._backlog.append(pending)
            if self._state is _State.UP:
                self._flush()

    def expire(self, pending: _Pending) -> None:
        if self._pending.pop(pending.request_id, None) is not None:
            pending.fail(Timeout(f"bookie {self.bookie_id} did not answer a "
                                   f"{pending.op.name} within {pending.timeout_s} s"))

    def close(self) -> None:
        """Loop thread: fail what is outstanding (after the replies already received) and
        close the sockets."""
        self.loop.handle_replies()
        with self.lock:
            if self._state is _State.CLOSED:
                return
            self._state = _State.CLOSED
            self.refusing = True
            self._fail_all(BookieUnavailable(f"the client of bookie {self.bookie_id} was "
                                             "closed"))
            if self._socket is not None:
                assert self._monitor is not None  # set with the socket
                self.loop.detach(self, [self._fd, self._monitor_fd])
                self._socket.disable_monitor()
                _close_sockets(self._socket, self._monitor)

    # -- socket events ----------------------------------------------------------------

    def serve(self) -> None:
        """Loop thread: handle the replies waiting, and hand ZeroMQ the backlog."""
        with self.lock:
            if self._state is _State.CLOSED:
                return
            replies = self._take_replies()
            if self._backlog and self._state is _State.UP:
                self._flush()
        if replies:
            self.loop.handle_later(self, replies)

    def handle_replies(self, replies: list[list[bytes]]) -> None:
        """Loop thread: complete the requests ``replies`` answer."""
        for frames in replies:
            self._on_reply(frames)

    def _on_monitor(self) -> None:
        assert self._monitor is not None  # attached by open(), with the socket
        while self._state is not _State.CLOSED:
            try:
                event = recv_monitor_message(self._monitor, zmq.NOBLOCK)["event"]
            except zmq.Again:
                return
            if event == _UP_EVENT:
                self._went_up()
            elif event in _DOWN_EVENTS:
                self._went_down(_DOWN_EVENTS[event])

    def _went_up(self) -> None:
        with self.lock:
            if self._state is _State.CLOSED:
                return
            if self._state is not _State.UP:
                log.info("connected to bookie %s at %s", self.bookie_id, self.address)
            self._state = _State.UP
            self.refusing = False
            self._flush()

    def _went_down(self, reason: str) -> None:
        """Loop thread: fail every outstanding request (the replies that arrived before
        the loss still count)."""
        with self.lock:
            if self._state is _State.CLOSED:
                return
            replies = self._take_replies()
        self.loop.handle_replies()
        self.handle_replies(replies)
        with self.lock:
            if self._state in (_State.DOWN, _State.CLOSED):
                return
            self._state = _State.DOWN
            self.refusing = True
            self._down_reason = f"bookie {self.bookie_id} at {self.address}: {reason}"
            log.warning("%s; failing %d outstanding requests", self._down_reason,
                        len(self._pending))
            self._fail_all(BookieUnavailable(self._down_reason))

    def _fail_all(self, error: BookKeeperError) -> None:
        pending, self._pending = self._pending, {}
        self._backlog.clear()
        for p in pending.values():
            p.fail(error)
        if self._state is _State.CLOSED:  # down: the queued adds still drain, and these
            held, self._after_adds = self._after_adds, deque()  # follow them (failing)
            for _, call in held:
                call.fail(error)

    # -- sending and receiving --------------------------------------------------------

    def _flush(self) -> None:
        """Hand queued requests to ZeroMQ until its send queue is full (lock held)."""
        backlog = self._backlog
        socket = self._socket
        assert socket is not None  # UP: open() connected it
        try:
            while backlog:
                pending = backlog[0]
                if not pending.done:  # done: timed out while queued here
                    send_message(socket, pending.frames)
                pending.frames = []
                backlog.popleft()
        except zmq.Again:
            pass  # full: the descriptor signals when ZeroMQ can take more
        except zmq.ZMQError as e:
            if self.loop.on_loop_thread():
                self._went_down(f"send failed: {e}")
            else:
                self.loop.post(partial(self._went_down, f"send failed: {e}"))
            return
        # The sends may have taken the descriptor's signal of waiting replies (or of
        # room for the backlog): then nothing else would wake the loop for them.
        events: int = socket.getsockopt(_EVENTS)  # type: ignore[assignment]  # an int
        if events & _POLLIN or backlog and events & _POLLOUT:
            self.loop.serve_soon(self)

    def _take_replies(self) -> list[list[bytes]]:
        """The replies waiting (at most ``_READ_BATCH``; the loop comes back for more),
        to handle once the lock is released (lock held)."""
        socket = self._socket
        if socket is None:
            return []
        replies = list(received(socket, _READ_BATCH))
        if len(replies) == _READ_BATCH:
            self.loop.serve_soon(self)
        return replies

    def _on_reply(self, frames: list[bytes]) -> None:
        try:
            reply = wire.decode_reply(frames, self._settings.maxEntrySizeBytes)
        except BookKeeperError as e:
            request_id = wire.peek_request_id(frames)
            log.warning("bad reply from bookie %s: %s", self.bookie_id, e)
            pending = self._pending.pop(request_id, None) if request_id is not None else None
            if pending is not None:
                pending.fail(e)
            return
        pending = self._pending.pop(reply.request_id, None)
        if pending is None:
            log.debug("bookie %s answered request %d after it timed out", self.bookie_id,
                      reply.request_id)
        elif reply.op != pending.op and not (reply.status and reply.op == wire.UNKNOWN_OP):
            pending.fail(MalformedMessage(f"bookie {self.bookie_id} answered a "
                                          f"{pending.op.name} request with operation "
                                          f"{reply.op}"))
        elif reply.status:
            pending.fail(error_for_code(reply.status,
                                        f"bookie {self.bookie_id}: {reply.message}"))
        else:
            pending.settle(reply)


class ZmqBookieClient(BookieClient):
    """Reaches the bookie ``bookie_id`` served at ``address`` (a ZeroMQ endpoint such as
    ``tcp://10.0.0.5:3181``).  Runs on ``loop`` if given, else on a loop of its own.
    Every method returns a Future (see the module docstring for time limits and
    failures); call :meth:`close` when done.

    ``server_key`` is the bookie's CURVE public key (the one it registered), which the
    connection pins when the settings' ``zmqCurveEnabled`` is on (:mod:`pybk.net.curve`);
    a handshake the bookie refuses (this client's key not allowed, another key than
    pinned) fails requests like a refused connection, with BookieUnavailable.  Raises
    BookieUnavailable if only one of the two has CURVE, InvalidConfiguration if the
    key file cannot be read."""

    def __init__(self, bookie_id: str, address: str, settings: ClientSettings | None = None,
                 *, loop: ClientLoop | None = None, server_key: bytes | None = None) -> None:
        self.bookie_id = bookie_id
        self.address = address
        self._settings = settings or ClientSettings()
        keys = curve.client_keys(self._settings.zmqCurveEnabled,
                                 self._settings.zmqCurveSecretKeyFile, bookie_id, server_key)
        self._own_loop = loop is None
        self._loop = loop or ClientLoop()
        self._connection = _Connection(self._loop, bookie_id, address, self._settings,
                                       # client_keys() gave keys: the bookie has its key
                                       None if keys is None or server_key is None
                                       else (keys, server_key))
        self._loop.post(self._connection.open)

    def __enter__(self) -> "ZmqBookieClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add(self, ledger_id: int, entry_id: int, entry: bytes, master_key: bytes,
            recovery: bool = False, *, deferred: bool = False) -> Future:
        future: Future = Future()
        future.set_running_or_notify_cancel()  # not cancellable: completion never races
        self.add_then(ledger_id, entry_id, entry, master_key,
                      lambda error: future.set_result(None) if error is None
                      else future.set_exception(error), recovery, deferred=deferred)
        return future

    def add_then(self, ledger_id: int, entry_id: int, entry: bytes, master_key: bytes,
                 callback: AddCallback, recovery: bool = False, *,
                 deferred: bool = False) -> None:
        """Queue the add for the bookie's next ADD message (sent now by this thread when
        the socket is free, else with every add ready when the loop or an answer sends
        them); ``callback`` runs on the loop's thread (for an entry over the maximum,
        refused before it leaves, on the thread that sends)."""
        connection = self._connection
        connection.queue(connection.ledger_adds(ledger_id, master_key, recovery, _call_each,
                                                deferred),
                         entry_id, entry, callback)

    def add_grouped(self, ledger_id: int, entry_id: int, entry: bytes, master_key: bytes,
                    token: Any, sink: AddsDone, recovery: bool = False, *,
                    deferred: bool = False) -> None:
        """Queue the add for the bookie's next ADD message; ``sink`` runs on the loop's
        thread, once per run of that message's adds that share it."""
        connection = self._connection
        connection.queue(connection.ledger_adds(ledger_id, master_key, recovery, sink,
                                                deferred),
                         entry_id, entry, token)

    def ledger_adds(self, ledger_id: int, master_key: bytes, sink: AddsDone,
                    recovery: bool = False, *, deferred: bool = False) -> LedgerAdds | None:
        """:meth:`add_grouped` for one ledger, key and sink: ``send(entry_id, entry,
        token, more=False)`` queues an add (with ``more``, for the same ADD message as the
        caller's next one), or returns False when the connection is down or closed."""
        return _LedgerAdds(self._connection, ledger_id, master_key, recovery, sink,
                           deferred).add

    def read(self, ledger_id: int, entry_id: int, fence: bool = False,
             master_key: bytes = b"") -> Future:
        return self._call(Op.READ, self._settings.readTimeout, ledger_id=ledger_id,
                          entry_id=entry_id, flags=wire.FENCE if fence else 0,
                          master_key=master_key if fence else b"")

    def read_batch(self, ledger_id: int, entry_ids: Sequence[int], max_bytes: int) -> Future:
        """One READ_BATCH request for (at most the first
        :func:`~pybk.net.wire.max_read_batch_ids` of) ``entry_ids``; the future
        completes on the loop's thread."""
        entry_ids = list(entry_ids[:wire.max_read_batch_ids(self._settings.maxEntrySizeBytes)])
        future: Future = Future()
        future.set_running_or_notify_cancel()  # not cancellable: completion never races
        request_id = self._loop.next_request_id()
        try:
            frames = wire.encode_request(
                Request(Op.READ_BATCH, request_id, ledger_id=ledger_id,
                        entry=wire.encode_read_batch(entry_ids, max_bytes)),
                self._settings.maxEntrySizeBytes)
        except BookKeeperError as e:
            future.set_exception(e)
            return future
        self._post(_ReadBatch(request_id, frames, self._settings.readTimeout,
                              self._connection, future, ledger_id, entry_ids))
        return future

    def read_lac(self, ledger_id: int) -> Future:
        return self._call(Op.READ_LAC, self._settings.readTimeout, ledger_id=ledger_id)

    def write_lac(self, ledger_id: int, lac: int, master_key: bytes) -> Future:
        return self._call(Op.WRITE_LAC, self._settings.addEntryTimeout, ledger_id=ledger_id,
                          lac=lac, master_key=master_key, after_adds=True)

    def delete_ledger(self, ledger_id: int) -> Future:
        return self._call(Op.DELETE, self._settings.addEntryTimeout, ledger_id=ledger_id)

    def force_ledger(self, ledger_id: int, first: int = 0, last: int = -1) -> Future:
        """One FORCE_LEDGER request (flag HELD), sent after the adds queued before it:
        completes once the bookie synced the ledger's adds, with how many of the entries
        ``first..last`` it holds (a bookie too old to know the request or the flag fails
        it with MalformedMessage)."""
        return self._call(Op.FORCE_LEDGER, self._settings.addEntryTimeout,
                          ledger_id=ledger_id, entry_id=first, lac=last, flags=wire.HELD,
                          after_adds=True)

    @property
    def is_down(self) -> bool:
        """Whether the connection dropped or could not be made, and has not come back (a
        hint read without locking: the bookie may have moved to another address)."""
        return self._connection.is_down

    def read_lac_long_poll(self, ledger_id: int, known_lac: int, entry_id: int,
                           timeout_s: float) -> Future:
        """Wait up to ``timeout_s`` (at most 60 s) for the bookie's LAC to pass
        ``known_lac``; the future gives ``(lac, entry)``, where ``entry`` is the bytes of
        ``entry_id`` if the LAC moved and the bookie holds it, else None."""
        timeout_ms = max(1, round(timeout_s * 1000))
        return self._call(Op.LONG_POLL, timeout_ms / 1000.0 + self._settings.readTimeout,
                          ledger_id=ledger_id, entry_id=entry_id, lac=known_lac,
                          timeout_ms=timeout_ms)

    def bookie_info(self) -> Future:
        """The bookie's free and total disk bytes and read-only state
        (:class:`pybk.net.wire.BookieInfo`)."""
        return self._call(Op.INFO, self._settings.readTimeout)

    def close(self) -> None:
        """Fail what is outstanding with BookieUnavailable and close the socket (and the
        loop, if it is this client's own)."""
        self._loop.run_and_wait(self._connection.close)
        if self._own_loop:
            self._loop.close()

    def _call(self, op: Op, timeout_s: float, after_adds: bool = False,
              **fields: Any) -> Future:
        """Send a request; ``after_adds``: once the adds queued before it have left
        (:meth:`_Connection.submit`)."""
        future: Future = Future()
        future.set_running_or_notify_cancel()  # not cancellable: completion never races
        request_id = self._loop.next_request_id()
        try:
            frames = wire.encode_request(Request(op, request_id, **fields),
                                         self._settings.maxEntrySizeBytes)
        except BookKeeperError as e:
            future.set_exception(e)
            return future
        self._connection.submit(_Call(request_id, op, frames, timeout_s, self._connection,
                                      future), after_adds)
        return future

    def _post(self, call: _Call) -> None:
        """Send ``call`` from this thread, or have the loop send it (see
        :meth:`_Connection.submit`; fails it at once if the loop is closed)."""
        self._connection.submit(call)


def _close_sockets(*sockets: zmq.Socket | None) -> None:
    for socket in sockets:
        if socket is not None:
            socket.close(linger=0)
