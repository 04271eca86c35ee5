"""``LedgerAdmission``: a cluster bookie's check of adds to ledgers it does not know.

A bookie that forgot a ledger (deleted, then garbage-collected) or lost it (wiped and
started again at the same address) cannot tell a stale writer's add from a new ledger's
first add.  Its node guards such adds (:meth:`pybk.storage.Bookie.guard_unknown_ledgers`,
the argument is in docs/DESIGN.md, "Stale writers"): a plain add to an unknown ledger
whose id is at or below the guard's floor (an id taken from the cluster's generator when
the node started) or covered by the bookie's tombstones (of the ids it forgot) waits for
this check of the ledger's metadata, which takes the add only if

* the ledger's metadata exists (else LedgerFenced: it was deleted, the writer is stale),
* it is OPEN (else LedgerFenced: a recoverer fenced or closed it),
* this bookie is in its last fragment's ensemble (else BookKeeperError: the writer
  replaces this bookie, as after any failed add).

Guarantees: a check reads the metadata as new as every change completed before it began
(a ZooKeeper ``sync`` first): no fence or close done before it is missed; every check runs on
the thread ``pybk-ledger-admission``, never on the server's or the journal's thread
(ZooKeeper is never awaited on the data path); the checks of one ledger in flight at
once share one metadata read; a check never blocks the caller.  Each check ends within
the store's operation timeout (MetadataUnavailable refuses the add: the writer replaces
the bookie); :meth:`LedgerAdmission.close` cancels the checks not started, which refuses
their adds.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from pybk.errors import BookieUnavailable, BookKeeperError, LedgerFenced, NoSuchLedger
from pybk.meta.interface import MetadataStore
from pybk.meta.ledger_metadata import LedgerState
from pybk.meta.ledgers import LedgerManager

log = logging.getLogger(__name__)


class LedgerAdmission:
    """The check a :class:`~pybk.cluster.node.BookieNode` gives its bookie: call it with
    a ledger id for a Future that completes with None (take the add) or the error to
    refuse it with.  :attr:`bookie_id` must be set before adds are admitted (until then
    they are refused: the bookie is not registered yet)."""

    def __init__(self, store: MetadataStore) -> None:
        self._ledgers = LedgerManager(store)
        #: The bookie's id in the cluster, once the node resolved it.
        self.bookie_id: str | None = None
        self._lock = threading.Lock()
        self._checks: dict[int, Future] = {}
        self._executor = ThreadPoolExecutor(max_workers=1,
                                            thread_name_prefix="pybk-ledger-admission")
        # Its thread starts now, not at the first check: a check never waits for it,
        # and the node's threads are all there once it serves.
        self._executor.submit(_nothing)

    def __call__(self, ledger_id: int) -> Future:
        with self._lock:
            check = self._checks.get(ledger_id)
            if check is not None:
                return check
            check = self._checks[ledger_id] = self._executor.submit(self._check, ledger_id)
        # Outside the lock: a check already done runs this at once, on this thread.
        check.add_done_callback(lambda _done: self._forget(ledger_id))
        return check

    def _forget(self, ledger_id: int) -> None:
        with self._lock:
            self._checks.pop(ledger_id, None)

    def _check(self, ledger_id: int) -> None:
        bookie_id = self.bookie_id
        if bookie_id is None:
            raise BookieUnavailable("the bookie is starting: it takes adds to ledgers it "
                                    "does not know once registered")
        try:
            # The latest: a lagging ZooKeeper server could still show a closed ledger open.
            metadata = self._ledgers.read(ledger_id, latest=True).metadata
        except NoSuchLedger:
            log.info("refused an add to ledger %d: it has no metadata (deleted); the writer "
                     "is stale", ledger_id)
            raise LedgerFenced(f"ledger {ledger_id} was deleted: this bookie no longer "
                               "holds it, and its writer no longer owns it") from None
        if metadata.state is not LedgerState.OPEN:
            log.info("refused an add to ledger %d: it is %s; the writer is stale", ledger_id,
                     metadata.state.value)
            raise LedgerFenced(f"ledger {ledger_id} is {metadata.state.value}: a recovering "
                               "client fenced it, and this bookie does not hold it")
        if bookie_id not in metadata.fragments[-1].ensemble:
            raise BookKeeperError(f"ledger {ledger_id}'s last ensemble "
                                  f"{list(metadata.fragments[-1].ensemble)} does not name "
                                  f"bookie {bookie_id}: it takes no adds to it")

    def close(self) -> None:
        """Refuse the checks not started and wait for the one running (it ends within
        the store's operation timeout)."""
        self._executor.shutdown(wait=True, cancel_futures=True)


def _nothing() -> None:
    """The first task of the admission's executor: it starts the thread."""
