"""The kazoo client of pybk's ZooKeeper store: kazoo plus ZooKeeper's persistent watches.

ZooKeeper 3.6 added persistent watches (``addWatch``, opcode 106, mode 0): a watch that
stays after it fires and reports every change of its node (created, data changed,
deleted, children changed) in commit order.  pybk's watch contract is exactly that, but
kazoo 2.11 cannot set one, and one-shot watches re-armed after each event miss the
changes made in between.  This module adds them, reaching into kazoo as little as it
can, in one place:

* :class:`AddWatch` and :class:`RemoveWatches` are request records serialized like
  kazoo's own (jute: the path as a length-prefixed string, then an int).
* :func:`connect` installs a ``ConnectionHandler`` subclass that, before kazoo's own
  dispatch, hands every watch notification to a callback *on kazoo's connection
  thread* (so the callback must only queue work), together with the zxid from the
  notification's header: ZooKeeper 3.9 puts there the transaction that fired the event
  (older servers send -1), which tells two events of one transaction apart from two
  transactions.

ZooKeeper drops a connection's watches when the connection closes, and kazoo does not
set them again on reconnect: the store re-adds its persistent watches itself.

Bounded waits: :func:`connect` gives up after its timeout (:class:`MetadataUnavailable`),
and :func:`call` runs one operation under a deadline, retrying through connection loss
and session expiry with kazoo's :class:`~kazoo.retry.KazooRetry`.
"""

from __future__ import annotations

import logging
from collections import namedtuple
from typing import Any, Callable

from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss, KazooException
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol import connection as _kazoo_connection
from kazoo.protocol.serialization import ReplyHeader, Watch, int_struct, write_string
from kazoo.protocol.states import EVENT_TYPE_MAP
from kazoo.retry import KazooRetry, RetryFailedError

from pybk.errors import MetadataUnavailable

log = logging.getLogger(__name__)

EventCallback = Callable[[int, str], None]  # (zxid, or -1 before ZooKeeper 3.9; path)

_ADD_WATCH_OPCODE = 106  # ZooDefs.OpCode.addWatch
_REMOVE_WATCHES_OPCODE = 18  # ZooDefs.OpCode.removeWatches
_PERSISTENT = 0  # ZooDefs.AddWatchModes.persistent
_WATCHER_TYPE_ANY = 3  # Watcher.WatcherType.Any


class _PathAndInt(namedtuple("_PathAndInt", "path value")):
    """A request of a path and an int, the shape of addWatch and removeWatches."""

    type: int  # the opcode

    def serialize(self) -> bytearray:
        return bytearray(write_string(self.path) + int_struct.pack(self.value))

    @classmethod
    def deserialize(cls, _buffer: bytes, _offset: int) -> bool:
        return True  # the reply has no body


class AddWatch(_PathAndInt):
    """addWatch: a watch of mode ``value`` (persistent: 0) on ``path``."""

    type = _ADD_WATCH_OPCODE


class RemoveWatches(_PathAndInt):
    """removeWatches: drop this session's watches of type ``value`` on ``path``."""

    type = _REMOVE_WATCHES_OPCODE


class _ConnectionHandler(_kazoo_connection.ConnectionHandler):
    """kazoo's connection handler, reporting every watch notification first."""

    on_event: EventCallback | None = None

    def _read_watch_event(self, buffer: bytes, offset: int) -> None:
        header, _ = ReplyHeader.deserialize(buffer, 0)  # buffer starts at the header
        event, _ = Watch.deserialize(buffer, offset)
        on_event = self.on_event
        if on_event is not None and event.type in EVENT_TYPE_MAP:
            try:
                on_event(header.zxid, event.path)
            except Exception:  # a failure here would kill kazoo's connection thread
                log.exception("handling the ZooKeeper event %r failed", event)
        super()._read_watch_event(buffer, offset)


def connect(connect_string: str, session_timeout_s: float, connect_timeout_s: float,
            on_event: EventCallback) -> KazooClient:
    """A started kazoo client whose watch notifications go to ``on_event`` too.

    Raises MetadataUnavailable, with nothing left running, if no server accepted a
    session within ``connect_timeout_s``."""
    client = KazooClient(hosts=connect_string, timeout=session_timeout_s,
                         connection_retry=KazooRetry(max_tries=-1, max_delay=1.0))
    handler = _ConnectionHandler(client, client._conn_retry.copy(), logger=client.logger)
    handler.on_event = on_event
    client._connection = handler
    try:
        client.start(timeout=connect_timeout_s)
    except KazooTimeoutError:  # kazoo has stopped and closed the client
        raise MetadataUnavailable(f"no ZooKeeper server at {connect_string} accepted a "
                                  f"session within {connect_timeout_s:g} s: is ZooKeeper "
                                  "running there, and reachable?") from None
    return client


def call(client: KazooClient, retry: KazooRetry, attempt_timeout_s: float,
         operation: Callable[[KazooClient, bool], Any], what: str) -> Any:
    """Run ``operation(client, retrying)`` until it returns, retrying through connection
    loss and session expiry within ``retry``'s deadline; ``retrying`` is true from the
    second attempt on, when an earlier attempt may have taken effect without its answer
    arriving.  ``operation`` waits on kazoo's async results with :func:`result`.

    Raises MetadataUnavailable when the deadline passes; other kazoo errors (NoNodeError,
    BadVersionError, ...) reach the caller."""
    attempts = 0

    def attempt() -> Any:
        nonlocal attempts
        attempts += 1
        return operation(client, attempts > 1)

    try:
        return retry.copy()(attempt)
    except RetryFailedError:
        raise MetadataUnavailable(f"{what}: ZooKeeper did not answer within "
                                  f"{retry.deadline:g} s ({attempts} attempts)") from None


def result(async_result: Any, timeout_s: float) -> Any:
    """The value of a kazoo async result, waiting at most ``timeout_s``; no answer in
    time counts as a connection loss (the request's outcome is unknown)."""
    try:
        return async_result.get(timeout=timeout_s)
    except KazooTimeoutError:
        raise ConnectionLoss(f"no answer within {timeout_s:g} s") from None


def add_persistent_watch(client: KazooClient, path: str) -> Any:
    """Send an addWatch (persistent) for ``path``; returns the async result."""
    async_result = client.handler.async_result()
    client._call(AddWatch(path, _PERSISTENT), async_result)
    return async_result


def remove_watches(client: KazooClient, path: str) -> Any:
    """Send a removeWatches (any type) for ``path``; returns the async result."""
    async_result = client.handler.async_result()
    client._call(RemoveWatches(path, _WATCHER_TYPE_ANY), async_result)
    return async_result


def close(client: KazooClient) -> None:
    """Stop the client (ending its session) and release its threads and sockets."""
    try:
        client.stop()
    except KazooException:
        log.debug("stopping a kazoo client failed", exc_info=True)
    client.close()
