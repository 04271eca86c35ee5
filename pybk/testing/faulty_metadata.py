"""A metadata store that holds back or slows down writes, for tests of the protocol.

:class:`FaultyMetadataStore` wraps any :class:`~pybk.meta.interface.MetadataStore` and
passes every call through, except that record writes (``set``, ``create``, ``delete``,
``set_and_delete`` named by the record it sets, and ``create_many``, as one write named
by its first path under ``prefix``) can be
*held*: the calling thread blocks inside the call, as it would behind a slow or
restarting ZooKeeper, until the test releases that write, which then reaches the real
store.  Releasing held writes one by one decides the order in which they land, which is
how tests reproduce races between metadata updates (a close against an ensemble change,
two recoverers).  ``delay_s`` slows every write down instead.  ``fail_when`` makes
chosen writes fail with :class:`~pybk.errors.MetadataUnavailable` before they reach the
store, as a process that dies (or loses its connection) there leaves them.

Only writes under ``prefix`` (default: every path) are affected; reads never are.
:attr:`~FaultyMetadataStore.calls` counts the calls on records under ``prefix`` (reads
and writes), and past :attr:`~FaultyMetadataStore.calls_max` each one raises
:class:`CallsExceeded`: a test bounds the work of a walk over records with it, where an
unbounded walk would run for hours.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from pybk.errors import MetadataUnavailable
from pybk.meta.interface import MetadataStore


class CallsExceeded(AssertionError):
    """More calls on the records under a :class:`FaultyMetadataStore`'s prefix than its
    ``calls_max``."""


@dataclass
class HeldWrite:
    """One write waiting in a :class:`FaultyMetadataStore`."""

    operation: str  # "set", "create", "create_many", "delete" or "set_and_delete"
    path: str
    expected_version: int | None
    _go: threading.Event = field(default_factory=threading.Event, repr=False)
    _landed: threading.Event = field(default_factory=threading.Event, repr=False)


class FaultyMetadataStore:
    """Wraps ``store``; set :attr:`hold_writes` (or :attr:`delay_s`) while running."""

    def __init__(self, store: MetadataStore, prefix: str = "") -> None:
        self._store = store
        self.prefix = prefix
        #: While true, writes under ``prefix`` wait in :meth:`held` until released.
        self.hold_writes = False
        #: Seconds every write under ``prefix`` takes in addition.
        self.delay_s = 0.0
        #: Called with the operation and path of each write under ``prefix``: when it
        #: returns true, the write raises MetadataUnavailable without reaching the store.
        self.fail_when: Callable[[str, str], bool] | None = None
        #: Calls (reads and writes) on records under ``prefix`` so far.
        self.calls = 0
        #: When set, every call under ``prefix`` past this many raises CallsExceeded.
        self.calls_max: int | None = None
        self._held: list[HeldWrite] = []
        self._changed = threading.Condition()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    # -- the reads ------------------------------------------------------------------

    def get(self, path: str) -> tuple[bytes, int]:
        self._count(path)
        return self._store.get(path)

    def exists(self, path: str) -> bool:
        self._count(path)
        return self._store.exists(path)

    def children(self, path: str) -> list[str]:
        self._count(path)
        return self._store.children(path)

    def _count(self, path: str) -> None:
        if not path.startswith(self.prefix):
            return
        self.calls += 1
        if self.calls_max is not None and self.calls > self.calls_max:
            raise CallsExceeded(f"more than {self.calls_max} metadata calls under "
                                f"{self.prefix!r} (this one on {path})")

    # -- the writes -----------------------------------------------------------------

    def set(self, path: str, data: bytes, expected_version: int) -> int:
        return self._write("set", path, expected_version,
                           lambda: self._store.set(path, data, expected_version))

    def set_and_delete(self, path: str, data: bytes, expected_version: int,
                       delete_path: str) -> int:
        return self._write("set_and_delete", path, expected_version,
                           lambda: self._store.set_and_delete(path, data, expected_version,
                                                              delete_path))

    def create(self, path: str, data: bytes, ephemeral: bool = False) -> int:
        return self._write("create", path, None,
                           lambda: self._store.create(path, data, ephemeral))

    def create_many(self, records: Sequence[tuple[str, bytes]]) -> None:
        under = [path for path, _data in records if path.startswith(self.prefix)]
        return self._write("create_many", under[0] if under else "", None,
                           lambda: self._store.create_many(records))

    def delete(self, path: str, expected_version: int) -> None:
        return self._write("delete", path, expected_version,
                           lambda: self._store.delete(path, expected_version))

    def _write(self, operation: str, path: str, expected_version: int | None,
               call: Callable[[], Any]) -> Any:
        if not path.startswith(self.prefix):
            return call()
        self._count(path)
        if self.fail_when is not None and self.fail_when(operation, path):
            raise MetadataUnavailable(f"injected: the {operation} of {path} failed before "
                                      "it reached the store")
        if self.delay_s > 0:
            time.sleep(self.delay_s)
        if not self.hold_writes:
            return call()
        write = HeldWrite(operation, path, expected_version)
        with self._changed:
            self._held.append(write)
            self._changed.notify_all()
        write._go.wait()
        try:
            return call()
        finally:
            write._landed.set()

    # -- the test's side ------------------------------------------------------------

    def held(self) -> list[HeldWrite]:
        """The writes waiting now, in the order they were made."""
        with self._changed:
            return list(self._held)

    def wait_held(self, count: int, timeout: float = 10.0) -> list[HeldWrite]:
        """Wait until at least ``count`` writes wait (TimeoutError after ``timeout``
        seconds); return them."""
        with self._changed:
            if not self._changed.wait_for(lambda: len(self._held) >= count, timeout):
                raise TimeoutError(f"{len(self._held)} metadata writes held after "
                                   f"{timeout} s, not {count}")
            return list(self._held)

    def release(self, write: HeldWrite, timeout: float = 10.0) -> None:
        """Let ``write`` reach the store, and wait until it did (succeeded or failed)."""
        with self._changed:
            self._held.remove(write)
        write._go.set()
        if not write._landed.wait(timeout):
            raise TimeoutError(f"the released {write.operation} of {write.path} did not "
                               f"land within {timeout} s")

    def release_all(self) -> None:
        """Stop holding writes and let every held one through, oldest first."""
        self.hold_writes = False
        for write in self.held():
            self.release(write)
