"""``BookieServer``: one :class:`pybk.storage.Bookie` served over ZeroMQ.

The protocol is :mod:`pybk.net.wire`.  One server thread owns a ROUTER socket bound
at the server's address and does all socket I/O and dispatch.

Adds: on each wake-up the server thread reads every request that is ready (up to
``_READ_BATCH``), queues the adds in the journal without waking the journal thread, and
then, when no commit is running, commits them itself (one write, one ``fdatasync``) and
answers them all (:meth:`pybk.storage.Bookie.commit_queued`): no thread hand-off and no
mailbox wake-up for a lone writer, nor for a full server whose reads alternate with its
commits.  When a commit is already running (the journal thread's, or a blocking caller's
of an in-process bookie), the adds ride on the journal thread's next group instead.

Work that completes on other threads (adds committed by the journal thread, a fence, an
explicit LAC, a delete on the server's delete thread, a long poll whose LAC moved) comes
back through a :class:`~pybk.net.mailbox.Mailbox`, and its reply leaves from the
server thread.

Guarantees:

* ADD, WRITE_LAC and DELETE are answered once durable in the journal (after the
  ``fdatasync`` that covers them, whichever thread issued it); a fencing READ reads only
  once the fence is durable.  The adds of one ADD message go to the bookie together
  (:meth:`pybk.storage.Bookie.add_entries_async`: one lock, one journal submission) and
  are answered together, each with its own status.  A body of at least
  ``_BODY_VIEW_MIN_BYTES`` is not copied out of its ZeroMQ message: its entries reach the
  journal's write and the write cache as views of it (the bookie copies them when some
  add of the message fails, so no body is held for a part of it).
* Each client may have many requests in flight; replies go out in completion order and
  are matched by request id.
* Bounded work: with ``maxAddsInProgressLimit`` journal-bound requests (adds, explicit
  LACs, deletes; not the adds waiting for the metadata check of a ledger the bookie does
  not know, which the bookie bounds itself: ``ADDS_AWAITING_ADMISSION_MAX``) or
  ``maxReadsInProgressLimit`` waiting reads (long polls, fencing reads) in progress, the
  server stops reading requests.  They then wait in ZeroMQ's
  per-client queue, which has no high-water mark: libzmq never stops reading a
  client's connection, because libzmq 4.3.5 aborts the process when a client resets a
  connection it had stopped reading (see ``BookieServer.__init__``).  So the requests
  waiting are bounded by what the clients have outstanding (a pybk client: at most
  ``zmqAddMessagesInFlight`` ADD messages per bookie, and the other requests its
  callers wait for), not by the server; CURVE keeps strangers out.  Plain reads, LAC
  reads and INFO are answered before the next request is read, so they hold nothing.
* Replies that ZeroMQ cannot take yet (a client's send queue is at its high-water
  mark: it does not read) wait in the server, in order, per client, and the server
  goes on reading: one client that does not read its replies does not stall the
  others, and a client that vanished with requests unread has its connection's
  queues released once the server read them (until then ZeroMQ refuses its replies).
  A pybk client that stops (a stopped or partitioned process) is dropped by its
  heartbeat's time to live, ``zmqHeartbeatTimeoutMs``, and its replies with it.
* A request that does not decode gets an error reply (MalformedMessage, EntryTooLarge)
  if it carries a request id, and is dropped with a log line otherwise; a frame over
  :func:`~pybk.net.wire.zmq_max_message_bytes` makes ZeroMQ drop the connection
  before buffering it.  Nothing a client sends stops the server thread.
* Long polls never block the thread: each is parked with a LAC watcher
  (:meth:`pybk.storage.Bookie.watch_lac`) and a deadline.
* ``ROUTER_MANDATORY`` is set, so a reply to a client that went away is an error the
  server sees (it drops the reply) instead of a silent loss.
* With ``zmqCurveEnabled`` the socket is a CURVE server: only clients whose public key
  is in ``zmqCurveAllowedClientKeysDirectory`` complete the handshake
  (:mod:`pybk.net.curve`); the others never get a request in.
* :meth:`BookieServer.close` stops answering requests (while replies wait, those that
  come are read and dropped: a vanished client's replies go only once its requests are
  read), answers parked long polls with the current LAC, waits (up to a time limit) for
  requests in progress to complete and their replies to leave, then closes the socket,
  lingering a moment so the last replies go out.

Entry reads run on the server thread: they are served from the write cache or the page
cache in microseconds; a read that has to wait for the disk holds up the requests behind
it for that long.  A READ_BATCH is answered at once too, with as many of its entries as
fit its byte budget (the client bounds how many it asks for in one request).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Callable

import zmq
from zmq.auth.thread import ThreadAuthenticator

from pybk.errors import BookKeeperError, NoSuchEntry
from pybk.net import curve, wire
from pybk.net.deadlines import Deadlines
from pybk.net.frames import received, send_message
from pybk.net.mailbox import Mailbox
from pybk.net.wire import Op, Reply, Request
from pybk.stats import ServerStats
from pybk.storage import Bookie

log = logging.getLogger(__name__)

#: Requests read per wake-up before the server looks at its mailbox again (fairness
#: between new requests and completions).
_READ_BATCH = 256
#: Request bodies of at least this many bytes are kept as views of their ZeroMQ message,
#: not copied (:func:`pybk.net.frames.recv_message`): an ADD's entries then go from the
#: socket to the journal's write and the write cache without a copy.  Only bodies larger
#: than libzmq's receive arena (``ZMQ_IN_BATCH_SIZE``, 8 KiB): a smaller message may be
#: a slice of an arena shared with others, which a view would keep whole.  (A copy costs
#: about what a view does at 2 KiB, and 3x less at 64 bytes, measured here.)
_BODY_VIEW_MIN_BYTES = 8192 + 1
#: How long the socket may keep sending the last replies after close.
_CLOSE_LINGER_MS = 1000
#: While ZeroMQ refuses replies (a client's queue is full), retry this often.
_RETRY_SEND_MS = 1
#: Requests timed as reads (BookKeeper's READ_ENTRY_REQUEST); fencing reads, which wait
#: for the fence, are READ_ENTRY_FENCE_REQUEST.
_TIMED_READS = (Op.READ, Op.READ_BATCH)
#: The other requests timed, by BookKeeper's name (pybk.stats.SERVER_REQUESTS; adds are
#: timed per entry, deletes not at all).
_TIMED_REQUESTS = {Op.READ_LAC: "READ_LAC_REQUEST", Op.WRITE_LAC: "WRITE_LAC_REQUEST",
                   Op.FORCE_LEDGER: "FORCE_LEDGER_REQUEST",
                   Op.LONG_POLL: "READ_ENTRY_LONG_POLL_REQUEST",
                   Op.INFO: "GET_BOOKIE_INFO_REQUEST"}


class _LongPoll:
    """A long-poll read parked until the LAC passes the reader's or its deadline."""

    __slots__ = ("identity", "request", "watcher", "done")

    def __init__(self, identity: bytes, request: Request) -> None:
        self.identity = identity
        self.request = request
        self.watcher: Callable[[], object] = _nothing
        self.done = False


class _Parked:
    """How many adds of one ADD message the bookie parked for its guard's check (set on
    the server thread before the message's adds can complete there)."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


class BookieServer:
    """Serves ``bookie`` on a ROUTER socket bound at ``address`` (e.g.
    ``tcp://0.0.0.0:3181``, or ``tcp://127.0.0.1:*`` for any free port: see
    :attr:`address`).  Serving starts at once; use as a context manager or call
    :meth:`close`.  The bookie is not closed with the server."""

    def __init__(self, bookie: Bookie, address: str) -> None:
        settings = bookie.settings
        self._bookie = bookie
        self._max_entry = settings.maxEntrySizeBytes
        self._max_adds = settings.maxAddsInProgressLimit
        self._max_reads = settings.maxReadsInProgressLimit
        self._context = zmq.Context(io_threads=1)
        self._socket = self._context.socket(zmq.ROUTER)
        self._authenticator: ThreadAuthenticator | None = None
        #: The CURVE public key clients must pin (None: CURVE is off).
        self.public_key: bytes | None = None
        try:
            if settings.zmqCurveEnabled:
                self._authenticator, self.public_key = curve.serve(
                    self._context, self._socket, settings.zmqCurveSecretKeyFile,
                    settings.zmqCurveAllowedClientKeysDirectory)
            self._socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
            # No high-water mark on receiving, so that libzmq's I/O thread never stops
            # reading a client's connection because the queue of its requests is full.
            # libzmq 4.3.5 (and its master to date) aborts the process when a client
            # resets a connection whose reading stopped so while the bytes read but
            # not processed yet hold a heartbeat PING: once the queue drains, the
            # connection's engine processes them and answers the PING on the failed
            # connection (Assertion failed: !_io_error, stream_engine_base.cpp:310;
            # zeromq/libzmq#4364, open; the patch proposed in #4852 was not merged).
            # So any client could crash the bookie.  The
            # requests not read yet are bounded by what the clients have outstanding
            # instead (see the module's docstring).
            self._socket.setsockopt(zmq.RCVHWM, 0)
            self._socket.setsockopt(zmq.MAXMSGSIZE,
                                    wire.zmq_max_message_bytes(self._max_entry))
            self._socket.setsockopt(zmq.LINGER, _CLOSE_LINGER_MS)
            self._socket.bind(address)
            #: The bound endpoint, with the port ZeroMQ chose for ``*``.
            self.address: str = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)
        except BaseException:
            self._socket.close(linger=0)
            self._stop_authenticator()
            self._context.term()
            raise
        self._mailbox = Mailbox()
        self._deleter = ThreadPoolExecutor(max_workers=1,
                                           thread_name_prefix="pybk-server-delete")
        # Its thread starts now rather than at the first DELETE: a server's threads are
        # all there from its start to its close (docs/THREADS.md), whoever watches them.
        self._deleter.submit(int)
        self._handlers: dict[Op, Callable[[bytes, Request], Reply | None]] = {
            Op.ADD: self._add, Op.READ: self._read, Op.READ_LAC: self._read_lac,
            Op.WRITE_LAC: self._write_lac, Op.LONG_POLL: self._long_poll,
            Op.INFO: self._info, Op.DELETE: self._delete, Op.READ_BATCH: self._read_batch,
            Op.FORCE_LEDGER: self._force_ledger,
        }
        # Requests decoded, by operation, since the start: written by the server thread
        # only; every key is there from the start, so a copy on another thread never sees
        # the dict change size (docs/THREADS.md, fields that rely on the GIL).
        self._served: dict[Op, int] = dict.fromkeys(Op, 0)
        # Owned by the server thread:
        # (client, request id) -> (BookKeeper's name, time read) of the timed requests
        # answered later (fencing reads, long polls, writes of the LAC, forces).
        self._answered_later: dict[tuple[bytes, int], tuple[str, float]] = {}
        self._adds_in_progress = 0
        self._reads_in_progress = 0
        # Replies ZeroMQ could not take yet, by client, in order.
        self._unsent: dict[bytes, deque[list[bytes]]] = {}
        self._polls: Deadlines[_LongPoll] = Deadlines(lambda poll: not poll.done)
        self._stop_deadline: float | None = None
        self._closed = False
        self._ident: int | None = None  # the server thread's, once it runs
        #: Figures for :mod:`pybk.http.metrics`, updated by the server thread.
        self.stats = ServerStats()
        self._thread = threading.Thread(target=self._run, name="pybk-bookie-server",
                                        daemon=True)
        self._thread.start()
        log.info("bookie server listening on %s", self.address)

    @property
    def adds_in_progress(self) -> int:
        """Adds (and other writes) read and not answered yet (read without a lock)."""
        return self._adds_in_progress

    @property
    def reads_in_progress(self) -> int:
        """Fencing reads and long polls read and not answered yet (read without a lock)."""
        return self._reads_in_progress

    def requests_served(self) -> dict[str, int]:
        """Requests decoded since the server started, by operation (``add``, ``read``,
        ...): a rate is the difference of two readings over their interval."""
        return {op.name.lower(): count for op, count in self._served.copy().items()}

    def __enter__(self) -> "BookieServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self, timeout_s: float = 10.0) -> None:
        """Finish the requests in progress (for up to ``timeout_s``), answer parked long
        polls, then close the socket.  Requests not yet read are not answered: their
        clients see the connection drop."""
        if self._closed:
            return
        self._closed = True
        self._mailbox.post(partial(self._begin_stop, time.monotonic() + timeout_s))
        self._thread.join()
        self._deleter.shutdown(wait=True)
        self._mailbox.close()
        self._stop_authenticator()
        self._context.term()  # returns once the socket is gone: the address is free
        log.info("bookie server on %s closed", self.address)

    def _stop_authenticator(self) -> None:
        if self._authenticator is not None:
            self._authenticator.stop()  # its ZAP socket lives on the context

    # -- the server thread ----------------------------------------------------------

    def _run(self) -> None:
        self._ident = threading.get_ident()
        socket = self._socket
        poller = zmq.Poller()
        mailbox = self._mailbox.fileno()
        poller.register(mailbox, zmq.POLLIN)
        reading = False
        try:
            while self._stop_deadline is None or not self._finished():
                want = self._may_read()
                if want != reading:
                    poller.register(socket, zmq.POLLIN if want else 0)
                    reading = want
                # Nothing due (the usual case): sleep until a request or a posted work.
                due = self._unsent or self._reads_in_progress \
                    or self._stop_deadline is not None
                events = dict(poller.poll(self._poll_timeout_ms() if due else None))
                if mailbox in events:
                    self._mailbox.run_posted()
                if socket in events:
                    if self._stop_deadline is None:
                        self._read_requests()
                    else:
                        self._drop_requests()
                if self._reads_in_progress:  # long polls among them may be due
                    for poll in self._polls.pop_due():
                        self._finish_long_poll(poll)
                if self._unsent:
                    self._retry_unsent()
        except Exception:  # a bug here must not leave clients hanging on a live socket
            log.exception("bookie server on %s failed; closing its socket", self.address)
        finally:
            socket.close()

    def _may_read(self) -> bool:
        # Replies unsent do not stop the reading: a client that vanished with requests
        # unread keeps its reply queue (full, so its replies wait here) until this
        # thread has read those requests, and one client that does not read its
        # replies must not stall the others.
        if self._stop_deadline is not None:
            return bool(self._unsent)  # closing: see _drop_requests
        return (self._adds_in_progress < self._max_adds
                and self._reads_in_progress < self._max_reads)

    def _finished(self) -> bool:
        if self._stop_deadline is None:
            return False
        idle = not (self._adds_in_progress or self._reads_in_progress or self._unsent)
        if not idle and time.monotonic() >= self._stop_deadline:
            log.warning("bookie server on %s closing with %d adds and %d reads in "
                        "progress and %d replies unsent", self.address,
                        self._adds_in_progress, self._reads_in_progress,
                        sum(map(len, self._unsent.values())))
            return True
        return idle

    def _poll_timeout_ms(self) -> int | None:
        if self._unsent:
            return _RETRY_SEND_MS
        timeouts = [self._polls.timeout_ms()]
        if self._stop_deadline is not None:
            timeouts.append(max(0, math.ceil((self._stop_deadline - time.monotonic())
                                             * 1000)))
        return min((t for t in timeouts if t is not None), default=None)

    def _begin_stop(self, deadline: float) -> None:
        self._stop_deadline = deadline
        for poll in self._polls.pop_due(math.inf):
            self._finish_long_poll(poll)

    def _read_requests(self) -> None:
        # The adds of these requests are queued without waking the journal thread and
        # committed by this thread in one group once they are all read, unless a commit
        # is running already (then they are the journal thread's next group).  That
        # saves two thread hand-offs per message (to the journal thread and back).
        handle = self._handle
        for frames in received(self._socket, _READ_BATCH, _BODY_VIEW_MIN_BYTES):
            identity = frames[0]
            assert isinstance(identity, bytes), "a message's first frame is received as bytes"
            handle(identity, frames[1:])
            if not self._may_read():
                self.stats.paused += 1
                break
        self._bookie.commit_queued()

    def _drop_requests(self) -> None:
        """Closing: requests are no longer answered, but they are still read (and
        dropped) while replies wait, so that a client that vanished with requests
        unread releases its queues and the replies waiting for it go (see
        :meth:`_may_read`) instead of holding the close until its deadline."""
        for _ in received(self._socket, _READ_BATCH):
            pass

    def _handle(self, identity: bytes, frames: list[wire.Frame]) -> None:
        self.stats.messages_in += 1
        self.stats.bytes_in += sum(map(len, frames))
        try:
            request = wire.decode_request(frames, self._max_entry)
        except BookKeeperError as e:
            request_id = wire.peek_request_id(frames)
            log.warning("bad request from client %s (%s): %s", identity.hex(),
                        f"request id {request_id}" if request_id is not None
                        else "no request id: dropped", e)
            if request_id is not None:
                self._send(identity, wire.error_reply(wire.UNKNOWN_OP, request_id, e))
            return
        self._served[request.op] += 1
        started = time.monotonic()
        answered = self._answer(identity, request,
                                partial(self._handlers[request.op], identity, request))
        op = request.op
        if op is Op.ADD:
            return  # timed per entry when answered (_finish_adds)
        if op in _TIMED_READS and not request.flags & wire.FENCE:
            self.stats.read_request.observe_since(started, answered is not False)
            return
        name = "READ_ENTRY_FENCE_REQUEST" if op is Op.READ else _TIMED_REQUESTS.get(op)
        if name is None:
            return
        if answered is None:  # answered later, through _answer again
            self._answered_later[(identity, request.request_id)] = (name, started)
        else:
            self.stats.requests[name].observe_since(started, answered)

    def _answer(self, identity: bytes, request: Request,
                compute: Callable[[], Reply | None]) -> bool | None:
        """Send what ``compute`` returns, or the error it raises: whether it succeeded
        (None: the answer comes later, through this method again)."""
        try:
            reply = compute()
        except Exception as e:
            if not isinstance(e, BookKeeperError):
                log.exception("request %s failed unexpectedly", request._replace(entry=None))
            reply = wire.error_reply(request.op, request.request_id, e)
        if reply is None:
            return None
        self._send(identity, reply)
        ok = reply.status == 0
        if self._answered_later:  # a request timed from its reading (_handle)
            timed = self._answered_later.pop((identity, request.request_id), None)
            if timed is not None:
                self.stats.requests[timed[0]].observe_since(timed[1], ok)
        return ok

    # -- sending ----------------------------------------------------------------------

    def _send(self, identity: bytes, reply: Reply) -> None:
        try:
            frames = wire.encode_reply(reply, self._max_entry)
        except BookKeeperError as e:  # e.g. an entry stored before maxEntrySizeBytes shrank
            frames = wire.encode_reply(wire.error_reply(reply.op, reply.request_id, e),
                                       self._max_entry)
        self._send_frames(identity, frames)

    def _send_frames(self, identity: bytes, frames: list[bytes]) -> None:
        message = [identity, *frames]
        waiting = self._unsent.get(identity)
        if waiting is not None:
            waiting.append(message)  # behind the replies ZeroMQ could not take yet
        elif not self._try_send(message):
            self._unsent[identity] = deque((message,))

    def _try_send(self, message: list[bytes]) -> bool:
        """False if ZeroMQ cannot take the message yet; True once sent or dropped."""
        try:
            send_message(self._socket, message)
        except zmq.Again:
            return False
        except zmq.ZMQError as e:
            # EHOSTUNREACH: the client disconnected; its requests' outcome is its problem
            log.debug("reply to client %s dropped: %s", message[0].hex(), e)
            return True
        self.stats.messages_out += 1
        self.stats.bytes_out += sum(map(len, message))
        return True

    def _retry_unsent(self) -> None:
        """Send each client's waiting replies in order, up to the first that ZeroMQ
        still refuses (one try per client that does not read)."""
        for identity, waiting in list(self._unsent.items()):
            while waiting and self._try_send(waiting[0]):
                waiting.popleft()
            if not waiting:
                del self._unsent[identity]

    # -- requests ---------------------------------------------------------------------

    def _add(self, identity: bytes, r: Request) -> None:
        runs = wire.decode_adds(r.required_body(), self._max_entry)
        for run in runs:
            self._adds_in_progress += len(run.entry_ids)
        # Adds waiting for the guard's check of their ledger (bounded by the bookie)
        # leave the count at once: a stalled check must not pause reading.
        parked = _Parked()

        def on_parked(count: int) -> None:
            parked.count = count
            self._adds_in_progress -= count
        # The answer needs the request without its body: adds that wait for the guard
        # hold their callback, and must not hold the message through it (they hold
        # copies of their own entries, bounded by ADDS_AWAITING_ADMISSION_MAX).
        r = r._replace(entry=None)
        self._bookie.add_entries_async(runs, partial(self._adds_done, identity, r,
                                                     time.monotonic(), parked), wake=False,
                                       on_parked=on_parked)

    def _adds_done(self, identity: bytes, r: Request, started: float, parked: "_Parked",
                   errors: list[BaseException | None]) -> None:
        """An ADD message's adds are durable or failed.  When this server's thread led
        the journal group (see :meth:`_read_requests`) the reply leaves at once; from
        the journal's thread it goes through the mailbox."""
        if threading.get_ident() == self._ident:
            self._finish_adds(identity, r, started, parked, errors)
        else:
            self._mailbox.post(partial(self._finish_adds, identity, r, started, parked,
                                       errors))

    def _finish_adds(self, identity: bytes, r: Request, started: float, parked: "_Parked",
                     errors: list[BaseException | None]) -> None:
        count = len(errors)
        self._adds_in_progress -= count - parked.count
        if not any(errors):  # the usual answer, encoded without the general checks
            self.stats.add_request.success.observe_since(started, count)
            self._send_frames(identity, wire.encode_adds_durable(r.request_id, count))
            return
        statuses = [0] * count
        message = ""
        failed = 0
        for i, error in enumerate(errors):
            if error is not None:
                statuses[i] = wire.error_code(error)
                message = message or f"{type(error).__name__}: {error}"
                failed += 1
        if failed:
            self.stats.add_request.observe_since(started, False, failed)
        if failed < len(statuses):
            self.stats.add_request.observe_since(started, True, len(statuses) - failed)
        self._send(identity, Reply(r.op, r.request_id, message=message,
                                   body=wire.encode_add_statuses(statuses)))

    def _write_lac(self, identity: bytes, r: Request) -> None:
        written = self._bookie.set_explicit_lac(r.ledger_id, r.lac, r.master_key)
        written.add_done_callback(_outcome(self._later(identity, r, self._finish_write)))
        self._adds_in_progress += 1

    def _force_ledger(self, identity: bytes, r: Request) -> None:
        # Without HELD there is no range (its fields are 0) and no count to look up.
        forced = self._bookie.force(r.ledger_id, r.entry_id, r.lac) if r.flags & wire.HELD \
            else self._bookie.force(r.ledger_id)
        forced.add_done_callback(
            lambda done: self._mailbox.post(partial(self._finish_force, identity, r, done)))
        self._adds_in_progress += 1

    def _delete(self, identity: bytes, r: Request) -> None:
        # Bookie.delete_ledger blocks until durable: not on this thread.
        deleted = self._deleter.submit(self._bookie.delete_ledger, r.ledger_id)
        deleted.add_done_callback(_outcome(self._later(identity, r, self._finish_write)))
        self._adds_in_progress += 1

    def _finish_write(self, identity: bytes, r: Request, error: BaseException | None) -> None:
        self._adds_in_progress -= 1
        self._answer(identity, r, partial(_success_or_raise, r, error))

    def _finish_force(self, identity: bytes, r: Request, forced: Future) -> None:
        self._adds_in_progress -= 1
        self._answer(identity, r, partial(_forced_reply, r, forced))

    def _read(self, identity: bytes, r: Request) -> Reply | None:
        if not r.flags & wire.FENCE:
            return self._entry_reply(r)
        fenced = self._bookie.fence(r.ledger_id, r.master_key)
        fenced.add_done_callback(lambda done: self._mailbox.post(
            partial(self._finish_fenced_read, identity, r, done)))
        self._reads_in_progress += 1
        return None

    def _finish_fenced_read(self, identity: bytes, r: Request, fenced: Future) -> None:
        self._reads_in_progress -= 1
        self._answer(identity, r, partial(self._fenced_entry_reply, r, fenced))

    def _fenced_entry_reply(self, r: Request, fenced: Future) -> Reply:
        """The entry, once the fence is durable; if the bookie did not hold the ledger
        before this fence, NoSuchLedger (BookKeeper's answer), or EntryMaybeLost for a
        ledger older than its disks (:meth:`pybk.storage.Bookie.not_held_error`)."""
        if not fenced.result():  # raises the fence's error
            raise self._bookie.not_held_error(r.ledger_id)
        return self._entry_reply(r)

    def _entry_reply(self, r: Request) -> Reply:
        return Reply(r.op, r.request_id, body=self._bookie.read_entry(r.ledger_id,
                                                                      r.entry_id))

    def _read_batch(self, identity: bytes, r: Request) -> Reply:
        """Answer the entry ids in order until the next entry would pass the request's
        byte budget or the body limit (the first is always answered)."""
        entry_ids, max_bytes = wire.decode_read_batch(r.required_body())
        room = wire.max_add_body_bytes(self._max_entry) - wire.READ_ANSWERS_COUNT.size
        read_entry, ledger_id = self._bookie.read_entry, r.ledger_id
        statuses: list[int] = []
        entries: list[bytes] = []
        entry_bytes = 0
        for entry_id in entry_ids:
            try:
                data, status = read_entry(ledger_id, entry_id), 0
            except BookKeeperError as e:
                data, status = b"", e.code
            entry_bytes += len(data)
            room -= wire.READ_ANSWER_BYTES + len(data)
            if statuses and (entry_bytes > max_bytes or room < 0):
                break  # the client asks again for the rest
            statuses.append(status)
            entries.append(data)
        return Reply(r.op, r.request_id, body=wire.encode_read_answers(statuses, entries,
                                                                       self._max_entry))

    def _read_lac(self, identity: bytes, r: Request) -> Reply:
        return Reply(r.op, r.request_id, lac=self._bookie.read_lac(r.ledger_id))

    def _info(self, identity: bytes, r: Request) -> Reply:
        free, total = self._bookie.disk_space()
        info = wire.BookieInfo(free, total, self._bookie.is_read_only)
        return Reply(r.op, r.request_id, body=wire.encode_info(info))

    def _later(self, identity: bytes, r: Request,
               finish: Callable[[bytes, Request, BaseException | None], None]
               ) -> Callable[[BaseException | None], None]:
        """A completion callback for another thread: it posts ``finish`` to this one."""
        def done(error: BaseException | None) -> None:
            self._mailbox.post(partial(finish, identity, r, error))
        return done

    # -- long polls -------------------------------------------------------------------

    def _long_poll(self, identity: bytes, r: Request) -> Reply | None:
        poll = _LongPoll(identity, r)
        poll.watcher = partial(self._mailbox.post, partial(self._finish_long_poll, poll))
        if not self._bookie.watch_lac(r.ledger_id, r.lac, poll.watcher):
            return self._long_poll_reply(r)  # the LAC is already past the reader's
        self._reads_in_progress += 1
        self._polls.add(time.monotonic() + r.timeout_ms / 1000.0, poll)
        return None

    def _finish_long_poll(self, poll: _LongPoll) -> None:
        if poll.done:
            return  # answered already (woken, then timed out, or the other way round)
        poll.done = True
        self._reads_in_progress -= 1
        self._bookie.unwatch_lac(poll.request.ledger_id, poll.watcher)
        self._answer(poll.identity, poll.request, partial(self._long_poll_reply,
                                                          poll.request))

    def _long_poll_reply(self, r: Request) -> Reply:
        lac = self._bookie.read_lac(r.ledger_id)
        entry = None
        if lac > r.lac:
            try:
                entry = self._bookie.read_entry(r.ledger_id, r.entry_id)
            except NoSuchEntry:
                pass  # striped elsewhere, or not here yet: the reader asks another bookie
        return Reply(r.op, r.request_id, lac=lac, body=entry)


def _outcome(callback: Callable[[BaseException | None], None]) -> Callable[[Future], None]:
    """A Future's done-callback that passes its exception (or None) to ``callback``."""
    return lambda future: callback(future.exception())


def _success_or_raise(r: Request, error: BaseException | None) -> Reply:
    if error is not None:
        raise error
    return Reply(r.op, r.request_id)


def _forced_reply(r: Request, forced: Future) -> Reply:
    """A FORCE_LEDGER's answer: with the flag HELD, how many entries of the range asked
    about the bookie holds (wire.py)."""
    error = forced.exception()
    if error is not None:
        raise error
    return Reply(r.op, r.request_id, lac=forced.result() if r.flags & wire.HELD else 0)


def _nothing() -> None:
    """The watcher of a long poll not registered yet."""
