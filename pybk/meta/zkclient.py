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

Bounded waits: :func:`connect` gives up after its timeout (:class:`MetadataUnavailable`,
naming the last connection failure), at once if no host name resolves, and as soon as
every host refused the connection :data:`REFUSED_ROUNDS` times in a row (nothing listens
there: kazoo would knock on the closed ports until the timeout); and :func:`call` runs one
operation under a deadline, retrying through connection loss and session expiry with
kazoo's :class:`~kazoo.retry.KazooRetry`.  Once a session was made, kazoo reconnects as
long as the client lives, refused or not (a ZooKeeper restarting refuses for a while).

Security: :func:`connect` takes the digest credentials to authenticate with and the ACL
of the znodes the client creates (:func:`digest_security`, for ``zkEnableSecurity``).

Logging: kazoo logs every failed connection attempt and state change as a warning (a
dozen lines while ZooKeeper is unreachable for ten seconds).  pybk's clients log through
:class:`_KazooLog` instead, under ``pybk.meta.kazoo``, which passes kazoo's errors on
and turns everything else into DEBUG: the store reports what matters itself (its
session states to listeners, and MetadataUnavailable with the reason).
"""

from __future__ import annotations

import logging
import socket
import threading
from collections import namedtuple
from typing import Any, Callable, NamedTuple

from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionDropped, ConnectionLoss, KazooException
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol import connection as _kazoo_connection
from kazoo.protocol.serialization import ReplyHeader, Watch, int_struct, write_string
from kazoo.protocol.states import EVENT_TYPE_MAP, KazooState
from kazoo.retry import ForceRetryError, KazooRetry, RetryFailedError
from kazoo.security import ACL, make_acl, make_digest_acl

from pybk.errors import InvalidConfiguration, MetadataUnavailable

log = logging.getLogger(__name__)

EventCallback = Callable[[int, str], None]  # (zxid, or -1 before ZooKeeper 3.9; path)

_ADD_WATCH_OPCODE = 106  # ZooDefs.OpCode.addWatch
_REMOVE_WATCHES_OPCODE = 18  # ZooDefs.OpCode.removeWatches
_PERSISTENT = 0  # ZooDefs.AddWatchModes.persistent
_WATCHER_TYPE_ANY = 3  # Watcher.WatcherType.Any

#: Rounds of connection attempts in which every host refused after which :func:`connect`
#: gives up: a server that is starting or restarting gets a few chances (kazoo backs off
#: 0.1 s, then 0.2 s, between rounds), a port where nothing listens costs no more.
REFUSED_ROUNDS = 3


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


class _Opening:
    """How :func:`connect`'s wait for the first session ends: with a session, or with
    every host having refused :data:`REFUSED_ROUNDS` rounds of connection attempts in a
    row.  Told by kazoo's connection thread; read by the thread in :func:`connect`."""

    def __init__(self) -> None:
        self.settled = threading.Event()
        self.refused_rounds = 0
        #: Connection attempts refused in those rounds.
        self.refused = 0

    def on_state(self, state: KazooState) -> None:
        if state == KazooState.CONNECTED:
            self.settled.set()

    def round_ended(self, attempts: list[tuple[str, bool]]) -> None:
        """A round over the hosts ended without a session; ``attempts``: each host tried
        and whether it refused the connection."""
        if attempts and all(refused for _, refused in attempts):
            self.refused_rounds += 1
            self.refused += len(attempts)
            if self.refused_rounds >= REFUSED_ROUNDS:
                self.settled.set()
        else:  # a host that accepted, timed out or dropped: maybe a slow server
            self.refused_rounds = self.refused = 0


class _ConnectionHandler(_kazoo_connection.ConnectionHandler):
    """kazoo's connection handler, reporting every watch notification first, and how
    each round of connection attempts ended to :attr:`opening` while it is set."""

    on_event: EventCallback | None = None
    opening: _Opening | None = None
    #: This round's attempts (kazoo's connection thread only): ``host:port``, refused.
    _attempts: list[tuple[str, bool]]

    def _connect_loop(self, retry: KazooRetry) -> Any:
        attempts: list[tuple[str, bool]] = []
        self._attempts = attempts
        try:
            return super()._connect_loop(retry)
        except ForceRetryError:  # a round over the hosts without a session
            opening = self.opening
            if opening is not None:
                opening.round_ended(attempts)
            raise

    def _connect(self, host: str, hostip: str, port: int) -> Any:
        refused = False
        try:
            return super()._connect(host, hostip, port)
        except ConnectionDropped as e:  # kazoo's wrapper of the socket's error
            refused = isinstance(e.__context__, ConnectionRefusedError)
            raise
        finally:  # a session, a time-out, a dropped connection: not refused
            self._attempts.append((f"{host}:{port}", refused))

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


class _KazooLog(logging.LoggerAdapter):
    """kazoo's logger for a pybk client: errors as kazoo logs them, everything else at
    DEBUG (see the module docstring).  Remembers the last warning that carries details,
    why the last connection attempt failed ("Connection dropped: ... refused")."""

    def __init__(self) -> None:
        super().__init__(logging.getLogger("pybk.meta.kazoo"), {})
        self.last_failure: str | None = None

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        if level == logging.WARNING and args:  # those without are "Transition to ..."
            self.last_failure = str(msg) % args
        super().log(level if level >= logging.ERROR else min(level, logging.DEBUG), msg,
                    *args, **kwargs)

    warn = logging.LoggerAdapter.warning  # kazoo still calls the deprecated name


class Security(NamedTuple):
    """How a client authenticates (kazoo's ``auth_data``) and the ACL of what it creates."""

    auth_data: list[tuple[str, str]]
    default_acl: list[ACL]


def digest_security(auth_file: str, world_readable: bool) -> Security:
    """ZooKeeper digest authentication as the ``user:password`` in ``auth_file``, and
    ACLs giving that user every right on what it creates (ZooKeeper stores only a salted
    hash of the password in them) and everyone else the right to read if
    ``world_readable``, none otherwise.  InvalidConfiguration naming
    ``zkDigestAuthFile`` if the file cannot be read or holds no ``user:password``."""
    try:
        with open(auth_file, encoding="utf-8") as f:
            credentials = f.read().strip()
    except OSError as e:
        raise InvalidConfiguration(f"setting zkDigestAuthFile={auth_file!r}: "
                                   f"{e.strerror or e}") from None
    user, colon, password = credentials.partition(":")
    if not user or not colon or not password or "\n" in credentials:
        raise InvalidConfiguration(f"setting zkDigestAuthFile={auth_file!r}: the file must "
                                   "hold one line, user:password")
    acl = [make_digest_acl(user, password, all=True)]
    if world_readable:
        acl.append(make_acl("world", "anyone", read=True))
    return Security([("digest", credentials)], acl)


def connect(connect_string: str, session_timeout_s: float, connect_timeout_s: float,
            on_event: EventCallback, security: Security | None = None) -> KazooClient:
    """A started kazoo client whose watch notifications go to ``on_event`` too, and that
    authenticates and sets ACLs as ``security`` says (None: neither, ZooKeeper's open
    ACL).

    Raises MetadataUnavailable, with nothing left running: at once if no host of
    ``connect_string`` resolves; once every host refused the connection
    :data:`REFUSED_ROUNDS` times in a row (nothing listens there), naming them; or if no
    server accepted a session within ``connect_timeout_s`` (a server that does not
    answer, or answers only some of the time), naming the last failure."""
    _check_hosts_resolve(connect_string)
    kazoo_log = _KazooLog()
    client = KazooClient(hosts=connect_string, timeout=session_timeout_s,
                         connection_retry=KazooRetry(max_tries=-1, max_delay=1.0),
                         logger=kazoo_log,
                         # kazoo authenticates every new connection with these, and
                         # gives every create without an ACL of its own this one.
                         auth_data=security.auth_data if security else None,
                         default_acl=security.default_acl if security else None)
    handler = _ConnectionHandler(client, client._conn_retry.copy(), logger=client.logger)
    handler.on_event = on_event
    handler.opening = opening = _Opening()
    client._connection = handler
    client.add_listener(opening.on_state)
    client.start_async()
    opening.settled.wait(connect_timeout_s)
    handler.opening = None  # connected: from now on kazoo reconnects, refused or not
    client.remove_listener(opening.on_state)
    if client.connected:
        return client
    close(client)
    if opening.refused_rounds >= REFUSED_ROUNDS:
        raise MetadataUnavailable(
            f"no ZooKeeper server listens at {connect_string}: the connection was refused "
            f"({opening.refused} attempts): is ZooKeeper running there, on that port?")
    last = f" (last: {kazoo_log.last_failure})" if kazoo_log.last_failure else ""
    raise MetadataUnavailable(f"no ZooKeeper server at {connect_string} accepted a "
                              f"session within {connect_timeout_s:g} s{last}: is "
                              "ZooKeeper running there, and reachable?")


def _check_hosts_resolve(connect_string: str) -> None:
    """Raise MetadataUnavailable if no host of ``connect_string`` resolves: waiting
    would not help, since kazoo would retry the same names until the timeout.  Hosts
    that do not resolve while others do are logged; kazoo skips them."""
    hosts = [part.strip().rpartition(":") for part in connect_string.split(",")]
    failures: list[tuple[str, str]] = []
    for host, _, port in hosts:
        try:
            socket.getaddrinfo(host.strip("[]"), int(port), 0, 0, socket.IPPROTO_TCP)
        except (socket.gaierror, UnicodeError) as e:
            failures.append((host, str(e)))
    if len(failures) == len(hosts):
        reasons = "; ".join(f"{host}: {why}" for host, why in failures)
        raise MetadataUnavailable(f"no ZooKeeper host of {connect_string} resolves "
                                  f"({reasons}): check the address")
    for host, why in failures:
        log.warning("ZooKeeper host %s does not resolve (%s); connecting to the others",
                    host, why)


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
