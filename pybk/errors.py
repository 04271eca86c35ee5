"""The exceptions pybk raises: one hierarchy, named after BookKeeper's error kinds.

Every error derives from :class:`BookKeeperError`, so ``except pybk.errors.BookKeeperError``
catches all of them.  Each message says what was wrong and, where it helps, what to do.
The ``code`` attribute carries BookKeeper's numeric return code (``BKException.Code``) so
that a wire protocol can carry an error and rebuild the same exception on the other side
(see :func:`error_for_code`).
"""

from __future__ import annotations


class BookKeeperError(Exception):
    """Base of every pybk error."""

    code: int = -999  # BKException.Code.UnexpectedConditionException
    #: On the error of a failed ``LedgerHandle.add_entries``: the ids of that call's
    #: entries that were acknowledged before it failed and that the closed ledger keeps
    #: (for DEFERRED_SYNC: up to the durable LAC; empty: none); None elsewhere.
    acknowledged: range | None = None


class InvalidConfiguration(BookKeeperError, ValueError):
    """A setting has a value pybk cannot use; the message names the setting."""

    code = -1000  # pybk's own; raised on the caller's side, never sent over the wire


class NoSuchLedger(BookKeeperError):
    """The ledger does not exist (never created here, or deleted)."""

    code = -7  # NoSuchLedgerExistsException


class NoSuchBookie(BookKeeperError):
    """An admin command named a bookie the cluster does not know: not registered, no
    cookie, and no ledger names it."""

    code = -1007  # pybk's own; raised on the caller's side, never sent over the wire


class NoSuchEntry(BookKeeperError):
    """The ledger exists but does not hold the requested entry."""

    code = -13  # NoSuchEntryException


class EntryMaybeLost(NoSuchEntry):
    """The bookie does not hold the entry, and cannot say it never had it: the ledger
    was created before the bookie's disks joined the cluster (its *join floor*,
    docs/DESIGN.md "Stale writers"), so an earlier instance at its id, whose disks were
    replaced, may have acknowledged it.  Readers move on to another bookie as for
    NoSuchEntry; recovery does not count it as the entry being absent."""

    code = -1008  # pybk's own


class LedgerFenced(BookKeeperError):
    """The ledger was fenced by a recovering reader; normal adds are refused.

    For a writer this means "outcome unknown": the add may or may not survive recovery.
    """

    code = -101  # LedgerFencedException


class Unauthorized(BookKeeperError):
    """The master key (or password) does not match the one the ledger was created with."""

    code = -102  # UnauthorizedAccessException


class BookieReadOnly(BookKeeperError):
    """The bookie is read-only (a disk is over its usage threshold); reads still work."""

    code = -104  # WriteOnReadOnlyBookieException


class DiskFull(BookKeeperError):
    """A write failed because a disk is full."""

    code = -1001  # pybk's own: a bookie-side write failure


class InvalidCookie(BookKeeperError):
    """A directory's cookie is missing or does not match: the disks were swapped or wiped."""

    code = -1002  # pybk's own: a start-up error


class EntryTooLarge(BookKeeperError, ValueError):
    """An entry is larger than the configured maximum entry size."""

    code = -1004  # pybk's own


class MalformedEntry(BookKeeperError, ValueError):
    """An entry's bytes do not start with the header the bookie expects."""

    code = -1003  # pybk's own


class MalformedMessage(BookKeeperError, ValueError):
    """A network message does not decode: bad magic, an unsupported protocol version, an
    unknown operation, a truncated or oversized frame, or fields that break the format
    (:mod:`pybk.net.wire`).  The peer is broken or speaks another protocol."""

    code = -1006  # pybk's own


class BookieClosed(BookKeeperError):
    """The bookie was closed (or shut itself down) and takes no more requests."""

    code = -1005  # pybk's own


class CorruptData(BookKeeperError):
    """Stored bytes failed their checksum: the disk returned something pybk never wrote."""

    code = -1  # ReadException: the bookie could not read valid bytes


class Timeout(BookKeeperError):
    """An operation did not finish within its time limit."""

    code = -23  # TimeoutException


class InvalidLedgerMetadata(BookKeeperError, ValueError):
    """Ledger metadata breaks a rule: E >= Qw >= Qa >= 1, fragments non-empty and in entry
    order, each ensemble of E distinct bookies, last entry only when closed.  The message
    names the rule."""

    code = -14  # IncorrectParameterException


class BadVersion(BookKeeperError):
    """A compare-and-set lost: the record's version is not the expected one (someone else
    changed it first).  Re-read the record and decide again."""

    code = -17  # MetadataVersionException


class MetadataError(BookKeeperError):
    """The metadata store cannot serve the request: it is closed, its directory is in use
    by another instance, a path or record is not acceptable, or the store failed."""

    code = -18  # MetaStoreException


class MetadataUnavailable(MetadataError):
    """The metadata service cannot be reached: ZooKeeper did not answer within the
    configured time (unreachable at start, or a connection loss that outlasted the
    retries).  The operation's outcome is unknown; retry once the service is back."""

    code = -16  # ZKException


class ZooKeeperServerError(MetadataError):
    """A throwaway ZooKeeper server (:mod:`pybk.testing.zookeeper_server`) cannot run:
    Java or ZooKeeper's jars are missing, or the server did not come up in time.  The
    message says what to install, or ends with the server's log."""


class NodeExists(BookKeeperError):
    """A record was to be created at a path that already holds one."""

    code = -20  # LedgerExistException


class NoNode(BookKeeperError):
    """No record exists at the path (never created, or deleted)."""

    code = -25  # NoSuchLedgerExistsOnMetadataServerException


class MalformedMetadata(MetadataError, ValueError):
    """Stored metadata bytes cannot be decoded: wrong magic, an unknown format version, a
    checksum mismatch, a truncated record or fields of the wrong shape."""

    code = -107  # MetadataSerializationException


class DigestMismatch(BookKeeperError):
    """No copy of an entry passed its digest check: the data was damaged, or the password
    (for MAC digests) is not the writer's."""

    code = -5  # DigestMatchException


class NotEnoughBookies(BookKeeperError):
    """Too few writable bookies to form (or repair) an ensemble."""

    code = -6  # NotEnoughBookiesException


class BookieUnavailable(BookKeeperError):
    """A bookie cannot be reached."""

    code = -8  # BookieHandleNotAvailableException


class LedgerRecoveryError(BookKeeperError):
    """Recovery could not decide the ledger's end (too few bookies answered); retry it."""

    code = -10  # LedgerRecoveryException


class LedgerClosed(BookKeeperError):
    """The ledger is closed: it takes no more entries."""

    code = -11  # LedgerClosedException


class ClientClosed(BookKeeperError):
    """The BookKeeper client was closed: it creates, opens, deletes and lists no more
    ledgers.  Make a new client."""

    code = -19  # BKClientClosedException; never sent over the wire


class TooManyRequests(BookKeeperError):
    """The client has ``throttle`` adds outstanding and this one could not wait for one
    of them to finish (``throttleBlocking``): slow down, or raise the setting."""

    code = -108  # TooManyRequestsException; never sent over the wire


class ReadOnlyLedger(BookKeeperError):
    """The handle was opened for reading and refuses writes."""

    code = -100  # IllegalOpException


class InvalidEntryId(BookKeeperError, ValueError):
    """An entry id given by the caller (:class:`~pybk.client.ledger_adv.LedgerHandleAdv`)
    cannot be taken: negative, or further past the LAC than ``advWindowEntries``."""

    code = -14  # IncorrectParameterException; never sent over the wire


class InvalidLedgerId(BookKeeperError, ValueError):
    """A ledger id given by the caller is not an integer in [0, 2^63): no ledger can
    have it."""

    code = -14  # IncorrectParameterException; never sent over the wire


class DuplicateEntryId(InvalidEntryId):
    """An entry id given by the caller was added already: it is at or below the LAC, or
    an add of it is outstanding."""

    code = -114  # DuplicateEntryIdException; never sent over the wire


class LedgerExists(BookKeeperError):
    """A ledger with the id the caller chose exists already (``create_ledger_adv``)."""

    code = -20  # LedgerExistException; never sent over the wire


class DirectoryLocked(BookKeeperError):
    """A bookie's or an embedded metadata store's directory is held by another opener (in
    this or another process): its lock file's ``flock`` is taken.  Never crosses the
    wire."""


# -- logs (pybk.log); these never cross the wire ---------------------------------------


class NoSuchLog(BookKeeperError):
    """No log has that name."""

    code = -1100


class LogFenced(LedgerFenced):
    """Another writer opened the log: this one can append no more (reopen to go on)."""


class LogClosed(LedgerClosed):
    """The log writer (or the WAL) is closed."""


class InvalidRecord(BookKeeperError, ValueError):
    """A record given to an append cannot be held by a log: its timestamp, key or
    headers are outside the bounds of the record batch format (:mod:`pybk.log.batch`
    names them)."""


class RecordsTruncated(BookKeeperError):
    """Records a reader was to read are gone: truncation removed them (a planned range's
    segment deleted while it was read, a streaming query's position truncated away)."""


class JobFinished(BookKeeperError):
    """A job writing ledgers for a log (:mod:`pybk.log.jobs`) was committed, aborted or
    given up as an orphan already: it takes no more ledgers and commits nothing."""


class TooManyLedgers(BookKeeperError, ValueError):
    """A commit names more ledgers than one compare-and-set of the log's head may add
    (:data:`pybk.log.metadata.COMMIT_LEDGERS_MAX`)."""


#: The errors a status code rebuilds (:func:`error_for_code`): those a bookie's reply may
#: carry.  Errors raised only on the client's or the caller's side (InvalidConfiguration,
#: ClientClosed, TooManyRequests, DirectoryLocked, InvalidEntryId, DuplicateEntryId,
#: LedgerExists and the logs') are not among them: their codes never come back from a
#: bookie.
_WIRE_ERRORS = (
    NoSuchLedger,
    NoSuchEntry,
    EntryMaybeLost,
    LedgerFenced,
    Unauthorized,
    BookieReadOnly,
    DiskFull,
    EntryTooLarge,
    MalformedEntry,
    MalformedMessage,
    BookieClosed,
    CorruptData,
    Timeout,
    InvalidLedgerMetadata,
    BadVersion,
    MetadataError,
    MetadataUnavailable,
    NodeExists,
    NoNode,
    MalformedMetadata,
    InvalidCookie,
    DigestMismatch,
    NotEnoughBookies,
    BookieUnavailable,
    LedgerRecoveryError,
    LedgerClosed,
    ReadOnlyLedger,
)
_BY_CODE = {cls.code: cls for cls in _WIRE_ERRORS}
assert len(_BY_CODE) == len(_WIRE_ERRORS), "two error classes share a code"


def error_for_code(code: int, message: str) -> BookKeeperError:
    """Rebuild the exception for a BookKeeper return code (unknown codes give the base class)."""
    return _BY_CODE.get(code, BookKeeperError)(message)
