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


class InvalidConfiguration(BookKeeperError, ValueError):
    """A setting has a value pybk cannot use; the message names the setting."""

    code = -100


class NoSuchLedger(BookKeeperError):
    """The ledger does not exist (never created here, or deleted)."""

    code = -7


class NoSuchEntry(BookKeeperError):
    """The ledger exists but does not hold the requested entry."""

    code = -13


class LedgerFenced(BookKeeperError):
    """The ledger was fenced by a recovering reader; normal adds are refused.

    For a writer this means "outcome unknown": the add may or may not survive recovery.
    """

    code = -101


class Unauthorized(BookKeeperError):
    """The master key (or password) does not match the one the ledger was created with."""

    code = -102


class BookieReadOnly(BookKeeperError):
    """The bookie is read-only (a disk is over its usage threshold); reads still work."""

    code = -104


class DiskFull(BookKeeperError):
    """A write failed because a disk is full."""

    code = -105


class InvalidCookie(BookKeeperError):
    """A directory's cookie is missing or does not match: the disks were swapped or wiped."""

    # A start-up error that never travels over the wire: it keeps the base code.


class EntryTooLarge(BookKeeperError, ValueError):
    """An entry is larger than the configured maximum entry size."""

    code = -106


class MalformedEntry(BookKeeperError, ValueError):
    """An entry's bytes do not start with the header the bookie expects."""

    code = -2


class BookieClosed(BookKeeperError):
    """The bookie was closed (or shut itself down) and takes no more requests."""

    code = -3


class CorruptData(BookKeeperError):
    """Stored bytes failed their checksum: the disk returned something pybk never wrote."""

    code = -5


class Timeout(BookKeeperError):
    """An operation did not finish within its time limit."""

    code = -23


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


_BY_CODE = {
    cls.code: cls
    for cls in (
        NoSuchLedger,
        NoSuchEntry,
        LedgerFenced,
        Unauthorized,
        BookieReadOnly,
        DiskFull,
        EntryTooLarge,
        MalformedEntry,
        BookieClosed,
        CorruptData,
        Timeout,
        InvalidConfiguration,
        InvalidLedgerMetadata,
        BadVersion,
        MetadataError,
        NodeExists,
        NoNode,
        MalformedMetadata,
    )
}


def error_for_code(code: int, message: str) -> BookKeeperError:
    """Rebuild the exception for a BookKeeper return code (unknown codes give the base class)."""
    return _BY_CODE.get(code, BookKeeperError)(message)
