"""The auditor election: of all the processes that stand, exactly one audits.

BookKeeper's ``AuditorElector``: each candidate casts an ephemeral sequential vote
(``underreplication/auditorelection/V_<n>``,
:meth:`~pybk.meta.underreplication.UnderreplicationManager.vote`); the lowest live vote
is the auditor.  Every other candidate watches the vote just below its own, so the death
of one candidate wakes one other, not all (no herd).  When the auditor's process dies its
session ends, its vote with it, and the next candidate takes over.

At most one auditor at a time: a candidate audits only while its vote is the lowest *and*
its session is connected.  When the connection drops (``SUSPENDED``) it stops auditing
at once, since its session, and so its vote, may be expiring, after which another
candidate is elected; when connected again in the same session it looks again (its vote
may still be the lowest), and after an expiry it votes anew.  A store whose session
cannot break (the embedded store) never suspends.

Threads: one, ``pybk-auditor-election``, casts votes, reads them and calls
``on_elected`` and ``on_deposed`` (which must return soon: ``on_deposed`` stops the
auditor); watch callbacks and session changes only wake it.  A failed store call is
logged and tried again after :data:`RETRY_S`.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from pybk.errors import BookKeeperError
from pybk.meta.interface import SessionState
from pybk.meta.underreplication import UnderreplicationManager, Vote
from pybk.meta.watches import Watch

log = logging.getLogger(__name__)

#: Seconds before a failed election step is tried again.
RETRY_S = 1.0
#: How long :meth:`AuditorElection.close` waits for the election thread to stop.  The
#: thread may be in a store call that lasts up to ``zkOperationTimeoutMs`` while
#: ZooKeeper is down; a close must not wait for that (closing the store ends the call).
#: The thread withdraws the vote as it ends; a vote left behind ends with the session.
CLOSE_WAIT_S = 2.0


class AuditorElection:
    """Stands ``candidate`` for auditor in the cluster of ``manager`` until
    :meth:`close`: calls ``on_elected()`` when it becomes the auditor and
    ``on_deposed()`` when it stops being it (also at close)."""

    def __init__(self, manager: UnderreplicationManager, candidate: str,
                 on_elected: Callable[[], None], on_deposed: Callable[[], None]) -> None:
        self.manager = manager
        self.candidate = candidate
        self._on_elected = on_elected
        self._on_deposed = on_deposed
        self._wake = threading.Condition()
        self._changed = True
        self._stop = False
        self._connected = True
        self._expired = False
        self._vote: Vote | None = None
        self._watch: Watch | None = None
        self._elected = False
        manager.store.add_session_listener(self._on_session)
        self._thread = threading.Thread(target=self._run, name="pybk-auditor-election",
                                        daemon=True)
        self._thread.start()

    @property
    def is_auditor(self) -> bool:
        return self._elected

    def _poke(self, _path: object = None) -> None:
        with self._wake:
            self._changed = True
            self._wake.notify_all()

    def _on_session(self, state: SessionState) -> None:
        with self._wake:
            self._connected = state is SessionState.CONNECTED
            self._expired |= state is SessionState.EXPIRED
            self._changed = True
            self._wake.notify_all()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._changed and not self._stop:
                    self._wake.wait()
                if self._stop:
                    break
                self._changed = False
                connected, expired = self._connected, self._expired
                self._expired = False
            if expired:
                self._vote = None  # it ended with the session
            if not connected:
                self._depose("the connection to the metadata store is lost")
                continue
            try:
                self._step()
            except BookKeeperError as e:
                log.warning("auditor election of %s: %s; trying again in %.0f s",
                            self.candidate, e, RETRY_S)
                with self._wake:
                    self._changed = True
                    if not self._stop:
                        self._wake.wait(RETRY_S)
        self._depose("it is closing")
        self._cancel_watch()
        if self._vote is not None:
            try:
                self.manager.withdraw(self._vote)
            except BookKeeperError as e:  # it ends with the session anyway
                log.info("auditor election: withdrawing the vote of %s: %s",
                         self.candidate, e)

    def _step(self) -> None:
        """Vote if needed, then audit if the vote is the lowest, else watch the one
        below."""
        if self._vote is None:
            self._vote = self.manager.vote(self.candidate)
            log.info("auditor election: %s voted (%s)", self.candidate, self._vote.name)
        votes = self.manager.votes()
        names = [vote.name for vote in votes]
        if self._vote.name not in names:
            self._depose("its vote is gone")
            self._vote = None
            self._poke()
            return
        mine = names.index(self._vote.name)
        if mine == 0:
            self._cancel_watch()
            if not self._elected and not self._stop:
                self.manager.record_auditor(self.candidate)
                self._elected = True
                log.warning("auditor election: %s is the auditor", self.candidate)
                self._on_elected()
            return
        self._depose(f"{votes[0].bookie_id} is the auditor")
        below = votes[mine - 1]
        self._cancel_watch()
        # Watched before it is looked at again, so that its end is not missed.
        self._watch = self.manager.store.watch(below.path, self._poke)
        if not self.manager.store.exists(below.path):
            self._poke()

    def _depose(self, why: str) -> None:
        if self._elected:
            self._elected = False
            log.warning("auditor election: %s is no longer the auditor: %s",
                        self.candidate, why)
            self._on_deposed()

    def _cancel_watch(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Stop standing: the thread stops auditing if elected (``on_deposed``) and
        withdraws the vote; waits for that at most ``wait_s``."""
        with self._wake:
            if self._stop:
                return
            self._stop = True
            self._wake.notify_all()
        self.manager.store.remove_session_listener(self._on_session)
        if self._thread is not threading.current_thread():
            self._thread.join(wait_s)
            if self._thread.is_alive():
                log.warning("auditor election of %s: still waiting on the metadata store; "
                            "its vote ends with the session", self.candidate)
