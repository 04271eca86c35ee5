"""Under-replication metadata: which ledgers lack replicas, who repairs them, who audits.

BookKeeper's layout (``ZkLedgerUnderreplicationManager``, ``AuditorElector``) under the
cluster root, on any :class:`~pybk.meta.interface.MetadataStore` (so an operator who
knows BookKeeper finds it where they expect on ZooKeeper, and the embedded store keeps
the same records).  Every record's text is what BookKeeper writes, except the backlog,
which is pybk's own:

``/ledgers/underreplication/LAYOUT``
    ``type: "BASIC"\\nversion: 1\\n`` (``LedgerRereplicationLayoutFormat`` in Protocol
    Buffers' text format, :mod:`pybk.meta.textformat`).  Written by the first manager
    opened on the cluster; a manager refuses another layout with MalformedMetadata.
``/ledgers/underreplication/ledgers/<4 x 4 hex digits>/urL<id, 10 digits or more>``
    A *mark*: the ledger is under-replicated.  (The ``ledgers`` record itself, empty,
    is written again after marks are made, so that workers can watch it.)  The four
    levels are the ledger id's four 16-bit parts, high first, in lower-case hex (ledger
    ``0x7afebeef0000feed`` under ``7afe/beef/0000/feed``), so no record has more than
    65,536 children.  The data is
    ``UnderreplicatedLedgerFormat``: a ``replica: "<bookie id>"`` line per missing replica
    (the bookies whose copies are gone), then ``ctime: <ms since the epoch>`` (when it
    was marked or last given another replica).  Marking a marked ledger adds the new
    replicas with a compare-and-set on the mark's version, so concurrent marks merge.
``/ledgers/underreplication/locks/urL<id>``
    A *claim*: an ephemeral record, ``bookieId: "<owner>"`` (``LockDataFormat``), held by
    the replication worker that repairs the ledger; it ends with the worker's session,
    so a dead worker's ledgers are claimed again by others.
``/ledgers/underreplication/disable``
    Present (empty): automatic re-replication is off; auditors mark nothing, workers
    claim nothing (``pybk autorecovery disable``).
``/ledgers/underreplication/lostBookieRecoveryDelay``
    The cluster's ``lostBookieRecoveryDelay`` in seconds, as decimal text: how long a
    bookie may be gone before its ledgers are marked.  The first auditor writes its
    setting here if it is absent; from then on this record is the cluster's value.
    Writing it again with the same value asks the auditor to audit now
    (:meth:`UnderreplicationManager.trigger_audit`).
``/ledgers/underreplication/auditorelection/V_<10 digits>``
    Ephemeral sequential *votes*, ``bookieId: "<candidate>"`` (``AuditorVoteFormat``);
    the lowest number is the auditor.  The ``auditorelection`` record's own data names
    the last elected auditor (as BookKeeper writes it, for people; the votes decide).
``/ledgers/underreplication/backlog`` (pybk's)
    What the auditor last measured of the repair work left: a sealed record
    (:mod:`pybk.meta.sealed`, magic ``PBKB``, version 1) whose body is
    ``{"auditor": str, "time_ms": int, "ledgers": int, "entries": int,
    "min_replicas": int or null}``: who measured it and when (ms since the epoch), how
    many ledgers are marked, how many acknowledged entries lack a replica, and the
    fewest live replicas any acknowledged entry of the cluster has (null when it has
    none); see :mod:`pybk.autorecovery.auditor` for how they are counted.

Guarantees, from the store's compare-and-set: a mark is never lost to a concurrent mark
(they merge); of several workers claiming one ledger exactly one gets it; clearing a
mark (:meth:`UnderreplicationManager.mark_replicated`) deletes it only at the version
the worker claimed, so a ledger marked again meanwhile (another bookie lost) stays
marked; of the votes, the lowest live one is the only auditor.
"""

from __future__ import annotations

import logging
import random
import re
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

from pybk.errors import BadVersion, MalformedMetadata, MetadataError, NodeExists, NoNode
from pybk.meta import paths, textformat
from pybk.meta.interface import ANY_VERSION, MetadataStore, sequence_number
from pybk.meta.sealed import seal, typed, unseal
from pybk.meta.watches import Watch

log = logging.getLogger(__name__)

UNDERREPLICATION = f"{paths.LEDGERS}/underreplication"
LAYOUT = f"{UNDERREPLICATION}/LAYOUT"
MARKS = f"{UNDERREPLICATION}/ledgers"
LOCKS = f"{UNDERREPLICATION}/locks"
DISABLE = f"{UNDERREPLICATION}/disable"
LOST_BOOKIE_RECOVERY_DELAY = f"{UNDERREPLICATION}/lostBookieRecoveryDelay"
ELECTION = f"{UNDERREPLICATION}/auditorelection"
BACKLOG = f"{UNDERREPLICATION}/backlog"

LAYOUT_TYPE = "BASIC"
LAYOUT_VERSION = 1
VOTE_PREFIX = "V_"
_MARK_NAME = re.compile(r"urL([0-9]{10,})\Z")
_HEX_LEVEL = re.compile(r"[0-9a-f]{4}\Z")
_LEVELS = 4
# A mark that keeps changing under a marker (other auditors, other bookies lost) is
# merged again; this bounds the attempts of one call.
_MARK_ATTEMPTS_MAX = 100
_BACKLOG_MAGIC = b"PBKB"
_BACKLOG_VERSION = 1
_BACKLOG_KEYS = frozenset({"auditor", "time_ms", "ledgers", "entries", "min_replicas"})


def mark_path(ledger_id: int) -> str:
    """Where the mark of ``ledger_id`` lives (see the module docstring)."""
    paths.check_ledger_id(ledger_id)
    levels = "/".join(f"{ledger_id >> shift & 0xFFFF:04x}" for shift in (48, 32, 16, 0))
    return f"{MARKS}/{levels}/urL{ledger_id:010d}"


def lock_path(ledger_id: int) -> str:
    """Where the claim of ``ledger_id`` lives."""
    return f"{LOCKS}/urL{paths.check_ledger_id(ledger_id):010d}"


@dataclass(frozen=True)
class UnderreplicatedLedger:
    """A mark: the ledger, its missing replicas, when it was marked (ms since the epoch,
    None if the marker did not say) and the mark record's version."""

    ledger_id: int
    replicas: tuple[str, ...]
    ctime_ms: int | None
    version: int


@dataclass(frozen=True)
class Claim:
    """A worker's hold on a marked ledger, with the mark as it was when claimed."""

    mark: UnderreplicatedLedger

    @property
    def ledger_id(self) -> int:
        return self.mark.ledger_id


@dataclass(frozen=True)
class Vote:
    """One auditor election vote: its record's name, number and candidate."""

    name: str
    number: int
    bookie_id: str

    @property
    def path(self) -> str:
        return paths.join(ELECTION, self.name)


@dataclass(frozen=True)
class Backlog:
    """The repair work left, as the auditor ``auditor`` measured it at ``time_ms``."""

    auditor: str
    time_ms: int
    ledgers: int
    entries: int
    min_replicas: int | None

    def to_bytes(self) -> bytes:
        return seal(_BACKLOG_MAGIC, _BACKLOG_VERSION, {
            "auditor": self.auditor, "time_ms": self.time_ms, "ledgers": self.ledgers,
            "entries": self.entries, "min_replicas": self.min_replicas})

    @classmethod
    def from_bytes(cls, data: bytes) -> "Backlog":
        body = unseal(data, _BACKLOG_MAGIC, _BACKLOG_VERSION, _BACKLOG_KEYS,
                      "under-replication backlog")
        try:
            return cls(auditor=typed("auditor", body["auditor"], str),
                       time_ms=typed("time_ms", body["time_ms"], int),
                       ledgers=typed("ledgers", body["ledgers"], int),
                       entries=typed("entries", body["entries"], int),
                       min_replicas=typed("min_replicas", body["min_replicas"], int,
                                          nullable=True))
        except ValueError as e:
            raise MalformedMetadata(f"under-replication backlog: {e}") from None


class UnderreplicationManager:
    """Marks, claims, the enable flag, the recovery delay, the auditor election and the
    backlog, kept in ``store`` (see the module docstring).  ``owner`` names this process
    in the claims it takes.  Opening one checks the layout record (and writes it on a
    cluster that has none).  Thread-safe, as the store is."""

    def __init__(self, store: MetadataStore, owner: str = "") -> None:
        self.store = store
        self.owner = owner
        self._check_layout()

    def _check_layout(self) -> None:
        data = textformat.encode([("type", LAYOUT_TYPE), ("version", LAYOUT_VERSION)])
        try:
            self.store.create(LAYOUT, data)
            return
        except NodeExists:
            pass
        found = textformat.decode(self.store.get(LAYOUT)[0], {"type": str, "version": int},
                                  what=LAYOUT)
        if found.get("type") != [LAYOUT_TYPE] or found.get("version") != [LAYOUT_VERSION]:
            raise MalformedMetadata(f"{LAYOUT} names under-replication layout "
                                    f"{found.get('type')}:{found.get('version')}; pybk "
                                    f"knows {LAYOUT_TYPE}:{LAYOUT_VERSION} only")

    # -- marks --------------------------------------------------------------------------

    def mark_underreplicated(self, ledger_id: int, replicas: Iterable[str],
                             with_time: bool = True,
                             announce: bool = True) -> UnderreplicatedLedger:
        """Mark the ledger as missing ``replicas`` (bookie ids), or add them to its mark;
        return the mark as written (or as found, when it named them all already).
        ``with_time`` records the time of marking (BookKeeper's
        ``storeSystemtimeAsLedgerUnderreplicatedMarkTime``).  ``announce`` tells the
        watchers of :meth:`watch_marks` when the mark changed; one marking many ledgers
        passes False and calls :meth:`announce_marks` once at the end."""
        mark, changed = self._mark(ledger_id, replicas, with_time)
        if announce and changed:
            self.announce_marks()
        return mark

    def _mark(self, ledger_id: int, replicas: Iterable[str],
              with_time: bool) -> tuple[UnderreplicatedLedger, bool]:
        """The mark as written or found, and whether this call changed it."""
        wanted = tuple(dict.fromkeys(paths.check_name(r) for r in replicas))
        if not wanted:
            raise MetadataError(f"marking ledger {ledger_id} under-replicated needs at least "
                                "one missing replica")
        path = mark_path(ledger_id)
        for _ in range(_MARK_ATTEMPTS_MAX):
            found = self.get(ledger_id)
            ctime = _now_ms() if with_time else None
            if found is None:
                try:
                    version = self.store.create(path, _mark_bytes(wanted, ctime))
                except NodeExists:
                    continue  # marked meanwhile: merge with it
                return UnderreplicatedLedger(ledger_id, wanted, ctime, version), True
            added = [r for r in wanted if r not in found.replicas]
            if not added:
                return found, False
            replicas_now = found.replicas + tuple(added)
            if not with_time:
                ctime = found.ctime_ms
            try:
                version = self.store.set(path, _mark_bytes(replicas_now, ctime), found.version)
            except (BadVersion, NoNode):
                continue  # changed or cleared meanwhile: read it again
            return UnderreplicatedLedger(ledger_id, replicas_now, ctime, version), True
        raise MetadataError(f"could not mark ledger {ledger_id}: its mark changed under "
                            f"{_MARK_ATTEMPTS_MAX} attempts in a row")

    def announce_marks(self) -> None:
        """Tell the watchers of :meth:`watch_marks` that marks were made: write the
        ``ledgers`` record again (its data stays empty, as BookKeeper has it; its version
        moves)."""
        try:
            self.store.set(MARKS, b"", ANY_VERSION)
        except NoNode:
            try:
                self.store.create(MARKS, b"")
            except NodeExists:
                pass  # made meanwhile, which its watchers hear too

    def watch_marks(self, callback: Callable[[], None]) -> Watch:
        """Call ``callback()`` after marks were made (announced, see
        :meth:`mark_underreplicated`), until cancelled: what a replication worker waits
        on when it finds nothing to claim.  (Marks live four levels below the
        ``ledgers`` record, where no watch of the store reaches.)"""
        return self.store.watch(MARKS, lambda _path: callback())

    def get(self, ledger_id: int) -> UnderreplicatedLedger | None:
        """The ledger's mark, or None if it is not marked."""
        path = mark_path(ledger_id)
        try:
            data, version = self.store.get(path)
        except NoNode:
            return None
        found = textformat.decode(data, {"replica": str, "ctime": int}, ("replica",), path)
        replicas = tuple(str(replica) for replica in found.get("replica", ()))
        ctimes = [int(ctime) for ctime in found.get("ctime", ())]
        # BookKeeper writes -1 for "not recorded" (UNASSIGNED_CTIME)
        ctime = ctimes[0] if ctimes and ctimes[0] >= 0 else None
        return UnderreplicatedLedger(ledger_id, replicas, ctime, version)

    def ledger_ids(self, shuffle_last: bool = False) -> Iterator[int]:
        """The ids of the marked ledgers, ascending (``shuffle_last``: in random order
        within each parent, so that workers polling together try different ones first).
        Marks made or cleared while this runs may or may not be seen."""
        yield from self._walk(MARKS, _LEVELS, shuffle_last)

    def _walk(self, path: str, levels: int, shuffle_last: bool) -> Iterator[int]:
        names = _children(self.store, path)
        if levels == 0:
            ids = [int(m.group(1)) for m in map(_MARK_NAME.match, names) if m]
            if shuffle_last:
                random.shuffle(ids)
            yield from ids
            return
        for name in names:
            if _HEX_LEVEL.match(name):
                yield from self._walk(paths.join(path, name), levels - 1, shuffle_last)

    def underreplicated(self, predicate: Callable[[tuple[str, ...]], bool] | None = None
                        ) -> Iterator[UnderreplicatedLedger]:
        """The marks, by ledger id, whose missing replicas satisfy ``predicate`` (all
        when None); read one at a time, so the list may be long."""
        for ledger_id in self.ledger_ids():
            mark = self.get(ledger_id)
            if mark is not None and (predicate is None or predicate(mark.replicas)):
                yield mark

    # -- claims ---------------------------------------------------------------------------

    def claim(self, ledger_id: int) -> Claim | None:
        """Claim the marked ledger for repair; None if it is not marked or another
        worker holds it.  Hold it until :meth:`mark_replicated` or :meth:`release`."""
        mark = self.get(ledger_id)
        if mark is None:
            return None
        data = textformat.encode([("bookieId", self.owner)] if self.owner else [])
        try:
            self.store.create(lock_path(ledger_id), data, ephemeral=True)
        except NodeExists:
            return None
        # Read again under the claim: the version a versioned clear will expect must be
        # one no mark changed after (a mark merged before the claim counts).
        mark = self.get(ledger_id)
        if mark is None:  # cleared by a worker that held it until just now
            self._release(ledger_id)
            return None
        return Claim(mark)

    def claim_next(self) -> Claim | None:
        """Claim some marked ledger no other worker holds (None if there is none).  Does
        not look at the enable flag: a worker checks :meth:`is_enabled` first."""
        held = set(_children(self.store, LOCKS))
        for ledger_id in self.ledger_ids(shuffle_last=True):
            if paths.split(lock_path(ledger_id))[1] in held:
                continue
            claim = self.claim(ledger_id)
            if claim is not None:
                return claim
        return None

    def claimed(self) -> dict[int, str]:
        """The claimed ledgers and who holds each ("" if the holder gave no name)."""
        holders = {}
        for name in _children(self.store, LOCKS):
            match = _MARK_NAME.match(name)
            if match is None:
                continue
            try:
                data = self.store.get(paths.join(LOCKS, name))[0]
            except NoNode:
                continue
            holder = textformat.decode(data, {"bookieId": str}, what=name).get("bookieId")
            holders[int(match.group(1))] = str(holder[0]) if holder else ""
        return holders

    def release(self, claim: Claim) -> None:
        """Give the claim up, leaving the mark (another worker may take it)."""
        self._release(claim.ledger_id)

    def mark_replicated(self, claim: Claim) -> bool:
        """The claimed ledger is repaired: clear its mark if it is still at the claimed
        version, then release the claim.  False if the mark changed meanwhile (it stays,
        and the ledger is repaired again) or was gone."""
        try:
            self.store.delete(mark_path(claim.ledger_id), claim.mark.version)
            cleared = True
        except (BadVersion, NoNode):
            cleared = False
        finally:
            self._release(claim.ledger_id)
        if cleared:
            self._remove_empty_levels(claim.ledger_id)
        return cleared

    def _release(self, ledger_id: int) -> None:
        try:
            self.store.delete(lock_path(ledger_id), ANY_VERSION)
        except NoNode:
            pass

    def _remove_empty_levels(self, ledger_id: int) -> None:
        """Delete the hex levels above a cleared mark that hold nothing else (a level
        that gets a child meanwhile is kept: deleting a record with children fails)."""
        level = paths.split(mark_path(ledger_id))[0]
        for _ in range(_LEVELS):
            try:
                self.store.delete(level, ANY_VERSION)
            except (NoNode, MetadataError):
                return  # not empty (another mark), or gone: leave the rest
            level = paths.split(level)[0]

    # -- the enable flag ------------------------------------------------------------------

    def disable(self) -> None:
        """Turn automatic re-replication off (harmless if it is off)."""
        try:
            self.store.create(DISABLE, b"")
            log.info("automatic re-replication disabled")
        except NodeExists:
            pass

    def enable(self) -> None:
        """Turn automatic re-replication on again (harmless if it is on)."""
        try:
            self.store.delete(DISABLE, ANY_VERSION)
            log.info("automatic re-replication enabled")
        except NoNode:
            pass

    def is_enabled(self) -> bool:
        return not self.store.exists(DISABLE)

    def watch_enabled(self, callback: Callable[[bool], None]) -> Watch:
        """Call ``callback(enabled)`` after every change of the flag, until cancelled."""
        return self.store.watch(DISABLE, lambda _path: callback(self.is_enabled()))

    # -- the lost bookie recovery delay ----------------------------------------------------

    def initialize_lost_bookie_recovery_delay(self, seconds: int) -> None:
        """Write the delay if the cluster has none yet (an auditor's setting)."""
        try:
            self.store.create(LOST_BOOKIE_RECOVERY_DELAY, _delay_bytes(seconds))
        except NodeExists:
            pass

    def lost_bookie_recovery_delay(self, default: int = 0) -> int:
        """The cluster's delay in seconds, or ``default`` if it has none."""
        return self.lost_bookie_recovery_delay_record(default)[0]

    def lost_bookie_recovery_delay_record(self, default: int = 0) -> tuple[int, int | None]:
        """The cluster's delay and its record's version (``(default, None)`` if it has
        none): every write makes a new version, also one of the same value."""
        try:
            data, version = self.store.get(LOST_BOOKIE_RECOVERY_DELAY)
        except NoNode:
            return default, None
        text = data.decode("utf-8", "replace").strip()
        if not text.isdigit():
            raise MalformedMetadata(f"{LOST_BOOKIE_RECOVERY_DELAY} holds {text!r}, not a "
                                    "number of seconds")
        return int(text), version

    def set_lost_bookie_recovery_delay(self, seconds: int) -> None:
        """Set the cluster's delay; running auditors take it at once."""
        data = _delay_bytes(seconds)
        try:
            self.store.set(LOST_BOOKIE_RECOVERY_DELAY, data, ANY_VERSION)
        except NoNode:
            try:
                self.store.create(LOST_BOOKIE_RECOVERY_DELAY, data)
            except NodeExists:
                self.store.set(LOST_BOOKIE_RECOVERY_DELAY, data, ANY_VERSION)

    def trigger_audit(self, default: int = 0) -> None:
        """Make the auditor audit the missing bookies now, whatever the delay: write the
        delay again with its value (BookKeeper's ``triggerAudit``; see
        :mod:`pybk.autorecovery.auditor`)."""
        self.set_lost_bookie_recovery_delay(self.lost_bookie_recovery_delay(default))

    def watch_lost_bookie_recovery_delay(self, callback: Callable[[], None]) -> Watch:
        """Call ``callback()`` after every change of the delay, until cancelled."""
        return self.store.watch(LOST_BOOKIE_RECOVERY_DELAY, lambda _path: callback())

    # -- the auditor election ---------------------------------------------------------------

    def vote(self, candidate: str) -> Vote:
        """Cast an ephemeral vote for ``candidate`` (it lasts as long as this session)."""
        created = self.store.create_sequential(
            paths.join(ELECTION, VOTE_PREFIX), _vote_bytes(candidate), ephemeral=True)
        name = paths.split(created)[1]
        return Vote(name, sequence_number(name), candidate)

    def votes(self) -> list[Vote]:
        """The live votes, lowest number (the auditor) first."""
        votes = []
        for name in _children(self.store, ELECTION):
            if not name.startswith(VOTE_PREFIX):
                continue
            try:
                data = self.store.get(paths.join(ELECTION, name))[0]
                number = sequence_number(name)
            except (NoNode, MalformedMetadata):
                continue  # gone meanwhile, or not a vote
            candidate = textformat.decode(data, {"bookieId": str}, what=name).get("bookieId")
            votes.append(Vote(name, number, str(candidate[0]) if candidate else ""))
        return sorted(votes, key=lambda vote: vote.number)

    def auditor(self) -> str | None:
        """Who the auditor is (the candidate of the lowest vote), or None if nobody
        stands."""
        votes = self.votes()
        return votes[0].bookie_id if votes else None

    def withdraw(self, vote: Vote) -> None:
        """Remove the vote (harmless if it is gone)."""
        try:
            self.store.delete(vote.path, ANY_VERSION)
        except NoNode:
            pass

    def record_auditor(self, candidate: str) -> None:
        """Write the elected auditor into the election record (for people, as BookKeeper
        does; :meth:`auditor` reads the votes)."""
        self.store.set(ELECTION, _vote_bytes(candidate), ANY_VERSION)

    # -- the backlog ------------------------------------------------------------------------

    def publish_backlog(self, backlog: Backlog) -> None:
        data = backlog.to_bytes()
        try:
            self.store.set(BACKLOG, data, ANY_VERSION)
        except NoNode:
            try:
                self.store.create(BACKLOG, data)
            except NodeExists:
                self.store.set(BACKLOG, data, ANY_VERSION)

    def backlog(self) -> Backlog | None:
        """The backlog last published, or None if no auditor published one."""
        try:
            return Backlog.from_bytes(self.store.get(BACKLOG)[0])
        except NoNode:
            return None


def _mark_bytes(replicas: Iterable[str], ctime_ms: int | None) -> bytes:
    fields: list[tuple[str, str | int]] = [("replica", r) for r in replicas]
    if ctime_ms is not None:
        fields.append(("ctime", ctime_ms))
    return textformat.encode(fields)


def _vote_bytes(candidate: str) -> bytes:
    return textformat.encode([("bookieId", candidate)])


def _delay_bytes(seconds: int) -> bytes:
    if not isinstance(seconds, int) or isinstance(seconds, bool) or seconds < 0:
        raise MetadataError(f"lostBookieRecoveryDelay {seconds!r} is not a whole number of "
                            "seconds, 0 or more")
    return str(seconds).encode()


def _children(store: MetadataStore, path: str) -> list[str]:
    try:
        return store.children(path)
    except NoNode:
        return []


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
