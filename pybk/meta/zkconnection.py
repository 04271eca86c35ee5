"""A connection to ZooKeeper with pybk's settings and retry policy: what the ZooKeeper
metadata store (:mod:`pybk.meta.zookeeper`) and the move of the logs of pybk's former
layout (:mod:`pybk.meta.migrate`) run their ZooKeeper operations through.

:class:`ZooKeeperSettings` are the settings (``zkTimeout``, the operation timeout and
retry pauses, and security); :class:`Connection` is a kazoo client
(:func:`pybk.meta.zkclient.connect`) whose :meth:`~Connection.call` runs one operation,
retrying through connection loss and session expiry until ``zkOperationTimeoutMs`` has
passed (then :class:`~pybk.errors.MetadataUnavailable`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Callable

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError, RolledBackError
from kazoo.retry import KazooRetry

from pybk.errors import InvalidConfiguration, MetadataError
from pybk.meta import paths, zkclient
from pybk.meta.zkaddress import ZooKeeperAddress

if TYPE_CHECKING:
    from pybk.settings import ServerSettings

# Ancestors made by a create can be deleted under it again by another client; like
# kazoo's ensure_path, try again then, at most this many times in all.
CREATE_ATTEMPTS_MAX = 10


@dataclass(frozen=True)
class ZooKeeperSettings:
    """How the store talks to ZooKeeper; BookKeeper's names where it has them."""

    #: The session timeout in ms (BookKeeper's ``zkTimeout``): a store silent for longer
    #: loses its session and ephemeral records.  Opening waits this long for a session,
    #: and one request this long for its answer.
    zkTimeout: int = 10_000
    #: pybk's: how long one call keeps retrying through connection loss before it
    #: raises MetadataUnavailable.  Long enough to ride out a ZooKeeper restart or a
    #: leader election.
    zkOperationTimeoutMs: int = 30_000
    #: First and longest pause between retries, in ms.  BookKeeper starts at 1,000;
    #: pybk at 100 so that a client resumes soon after ZooKeeper is back.
    zkRetryBackoffStartMs: int = 100
    zkRetryBackoffMaxMs: int = 2_000
    #: BookKeeper's ``zkEnableSecurity``: authenticate with the digest ``user:password``
    #: of ``zkDigestAuthFile`` and create every znode with an ACL that lets only that
    #: user change it (:func:`pybk.meta.zkclient.digest_security`).
    zkEnableSecurity: bool = False
    #: A file holding ``user:password`` (one line), for ``zkEnableSecurity``.
    zkDigestAuthFile: str = ""
    #: With ``zkEnableSecurity``: everyone may read the znodes created (true), or only
    #: the ``zkDigestAuthFile`` user (false).
    zkWorldReadable: bool = True

    @classmethod
    def of(cls, settings: "ServerSettings") -> "ZooKeeperSettings":
        """The ZooKeeper settings among a process's settings (a ServerSettings: its
        ``zkTimeout``, operation timeout, retry pauses and the ``zk*`` security settings)."""
        return cls(zkTimeout=settings.zkTimeout,
                   zkOperationTimeoutMs=settings.zkOperationTimeoutMs,
                   zkRetryBackoffStartMs=settings.zkRetryBackoffStartMs,
                   zkRetryBackoffMaxMs=settings.zkRetryBackoffMaxMs,
                   zkEnableSecurity=settings.zkEnableSecurity,
                   zkDigestAuthFile=settings.zkDigestAuthFile,
                   zkWorldReadable=settings.zkWorldReadable)

    def __post_init__(self) -> None:
        if self.zkEnableSecurity and not self.zkDigestAuthFile:
            raise InvalidConfiguration("setting zkDigestAuthFile is empty: "
                                       "zkEnableSecurity needs a file holding user:password")
        for f in fields(self):
            if f.type != "int":
                continue
            value = getattr(self, f.name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise InvalidConfiguration(f"setting {f.name}={value!r} is invalid: it must "
                                           "be a whole number of milliseconds over 0")
        if self.zkRetryBackoffStartMs > self.zkRetryBackoffMaxMs:
            raise InvalidConfiguration(
                f"setting zkRetryBackoffStartMs={self.zkRetryBackoffStartMs} is invalid: it "
                f"must be at most zkRetryBackoffMaxMs={self.zkRetryBackoffMaxMs}")


class Connection:
    """A kazoo client with the store's retry policy: :meth:`call` runs one operation."""

    def __init__(self, address: ZooKeeperAddress, settings: ZooKeeperSettings,
                 on_event: zkclient.EventCallback) -> None:
        self.address = address
        self.settings = settings
        self.attempt_timeout_s = settings.zkTimeout / 1000
        self.retry = KazooRetry(max_tries=-1, delay=settings.zkRetryBackoffStartMs / 1000,
                                backoff=2, max_delay=settings.zkRetryBackoffMaxMs / 1000,
                                deadline=settings.zkOperationTimeoutMs / 1000,
                                ignore_expire=True)
        security = (zkclient.digest_security(settings.zkDigestAuthFile,
                                             settings.zkWorldReadable)
                    if settings.zkEnableSecurity else None)
        self.client: KazooClient = zkclient.connect(address.connect_string,
                                                    self.attempt_timeout_s,
                                                    self.attempt_timeout_s, on_event,
                                                    security)

    @property
    def session_id(self) -> int | None:
        """The session's id; None between an expired session and the next."""
        client_id = self.client.client_id
        return client_id[0] if client_id else None

    def call(self, what: str, operation: Callable[[KazooClient, bool], Any]) -> Any:
        return zkclient.call(self.client, self.retry, self.attempt_timeout_s, operation,
                             f"{self.address}: {what}")

    def wait(self, async_result: Any) -> Any:
        return zkclient.result(async_result, self.attempt_timeout_s)

    def read(self, zk_path: str) -> tuple[bytes, Any] | None:
        """``(data, stat)`` of a node, or None if there is none (retried)."""
        def op(client: KazooClient, _retrying: bool) -> tuple[bytes, Any] | None:
            try:
                return self.wait(client.get_async(zk_path))
            except NoNodeError:
                return None

        return self.call(f"read {zk_path}", op)

    def create_with_ancestors(self, client: KazooClient, nodes: list[tuple[str, bytes]],
                              ephemeral: bool = False) -> None:
        """Create ``nodes`` (path, data; parents before children; the last one
        ``ephemeral``) and their missing ancestors, in one ZooKeeper transaction.  Raises
        :class:`NodeExistsAt` (a NodeExistsError) naming the index of a node that exists,
        kazoo's other errors as they come."""
        given = {path for path, _data in nodes}
        ancestors = [a for a in dict.fromkeys(a for path, _data in nodes
                                              for a in paths.ancestors(path))
                     if a not in given]
        for _ in range(CREATE_ATTEMPTS_MAX):
            found = [client.exists_async(a) for a in ancestors]  # in flight together
            missing = [a for a, result in zip(ancestors, found) if self.wait(result) is None]
            txn = client.transaction()
            for ancestor in missing:
                txn.create(ancestor, b"")
            for i, (path, data) in enumerate(nodes):
                txn.create(path, data, ephemeral=ephemeral and i == len(nodes) - 1)
            results = self.wait(txn.commit_async())
            failed = next((i for i, r in enumerate(results) if isinstance(r, Exception)
                           and not isinstance(r, RolledBackError)), None)
            if failed is None:
                return
            failure = results[failed]
            ancestor_made = failed < len(missing) and isinstance(failure, NodeExistsError)
            if ancestor_made or isinstance(failure, NoNodeError):
                continue  # another client made or removed an ancestor meanwhile
            if isinstance(failure, NodeExistsError):
                raise NodeExistsAt(failed - len(missing))
            raise failure
        raise MetadataError(f"could not create {nodes[-1][0]}: its ancestors kept changing "
                            f"under it ({CREATE_ATTEMPTS_MAX} attempts)")

    def close(self) -> None:
        zkclient.close(self.client)


class NodeExistsAt(NodeExistsError):
    """A node of a :meth:`Connection.create_with_ancestors` exists: the one at ``index``."""

    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.index = index
