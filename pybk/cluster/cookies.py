"""Where a bookie's directories meet the cluster: the cluster's copy of a bookie's cookie
made from the cookie its directories hold, the check of the two at every start of a
bookie node, and ``pybk updatecookie``.

The directories' cookie is the storage engine's (:mod:`pybk.storage.cookie`); the
cluster's copy and its record format are the metadata layer's (:mod:`pybk.meta.cookies`).
This module, above both, joins them.

The start-up check (:func:`check_cluster_cookie`, called by
:class:`pybk.cluster.node.BookieNode`) finds, for the bookie's id:

* no cookie: the bookie writes its own, create-if-absent, so of two bookies racing for
  one id exactly one wins; the other then finds the winner's cookie below;
* a cookie equal to the bookie's (same instance id, same directories): it starts;
* any other cookie: it refuses to start with :class:`~pybk.errors.InvalidCookie`
  naming the bookie id and what differs.

Directories moved on purpose get both copies rewritten by :func:`update_cookies`
(``pybk updatecookie``, BookKeeper's command of that name), which first checks that the
directories are one bookie's and that the cluster knows that bookie's instance.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

from pybk.errors import InvalidConfiguration, InvalidCookie, MalformedMetadata, NodeExists
from pybk.meta.cookies import Cookie, cookie_path
from pybk.settings import ServerSettings
from pybk.storage.cookie import (
    BookieCookie,
    locked_directories,
    rebind_directories,
    resolve_bookie_id,
    write_cookies,
)

if TYPE_CHECKING:
    from pybk.meta.interface import MetadataStore

log = logging.getLogger(__name__)


def cluster_cookie(bookie_id: str, local: BookieCookie) -> Cookie:
    """The cluster's cookie of a bookie serving as ``bookie_id`` whose directories hold
    ``local`` (:func:`pybk.storage.cookie.directory_cookie`)."""
    return Cookie(bookie_id, local.instance_id, local.journal_directory,
                  local.ledger_directories)


def update_cookies(settings: ServerSettings, store: "MetadataStore | None" = None) -> BookieCookie:
    """Accept a bookie's directories moved on purpose to where ``settings`` name them
    (BookKeeper's ``updatecookie``): rewrite their cookies bound to the new paths, and
    the cluster's copy in ``store``.  Returns the cookie they now hold.

    Checked before anything is written: no bookie runs on the directories (their lock),
    they are one bookie's (:func:`pybk.storage.cookie.rebind_directories`), and, if the
    bookie has an id (recorded in its cookies, or ``bookieId`` for directories that
    recorded none, as format 1 cookies), ``store`` is given and does not know the id
    for another instance.  The directories are rewritten first, then the cluster's copy
    (compare-and-set); after a crash in between, running it again finishes the job.
    Raises InvalidCookie, InvalidConfiguration (a bookie of a cluster and no ``store``),
    BookKeeperError (the directories are in use), MetadataError (the store failed)."""
    with locked_directories(settings):
        local = rebind_directories(settings)
        bookie_id = resolve_bookie_id(settings, local.bookie_id)
        found = None
        if bookie_id is not None:
            if store is None:
                raise InvalidConfiguration(
                    f"the directories of {settings.journalDirectory} serve as bookie "
                    f"{bookie_id} in a cluster: give the cluster (metadataServiceUri, pybk "
                    "updatecookie --zk) so that its copy of the cookie is updated too")
            found = known_cookie(store, bookie_id)
        if found is not None:
            if found[0].instance_id != local.instance_id:
                raise InvalidCookie(
                    f"bookie {bookie_id}: its cookie {cookie_path(found[0].bookie_id)} in "
                    f"{store} is of instance {found[0].instance_id}, but these directories "
                    f"are of instance {local.instance_id}: they are not the disks the "
                    "cluster knows under this id; nothing was changed")
            # Known to the cluster under this id: the directories keep it.
            local = dataclasses.replace(local, bookie_id=found[0].bookie_id)
        write_cookies(settings, local)
        if found is not None and store is not None:
            wanted = cluster_cookie(found[0].bookie_id, local)
            if found[0] != wanted:
                store.write_cookie(wanted, found[1])
                log.info("bookie %s: its cookie %s in %s now names %s", wanted.bookie_id,
                         cookie_path(wanted.bookie_id), store, local.describe_paths())
    return local


def check_cluster_cookie(store: "MetadataStore", cookie: Cookie) -> bool:
    """The start-up check of the module docstring for a bookie whose directories hold
    ``cookie``: True if it wrote the cluster's cookie (the id was new), False if the
    cluster's matched.  Raises InvalidCookie if the cluster knows the id with another
    cookie (or an unreadable one), MetadataError if the store fails."""
    path = cookie_path(cookie.bookie_id)
    found = known_cookie(store, cookie.bookie_id)
    if found is None:
        try:
            store.write_cookie(cookie)
        except NodeExists:  # another bookie with this id wrote one first
            found = known_cookie(store, cookie.bookie_id)
            if found is None:
                raise InvalidCookie(f"bookie {cookie.bookie_id}: its cookie {path} in "
                                    f"{store} was created and removed again while it "
                                    "started; is another bookie using this id? Try again"
                                    ) from None
        else:
            log.info("bookie %s: wrote its cookie %s in %s", cookie.bookie_id, path, store)
            return True
    differences = found[0].differences(cookie)
    if not differences:
        return False
    if found[0].instance_id != cookie.instance_id:
        advice = ("the cluster knows this id for another bookie instance: these directories "
                  "were formatted again (new or wiped disks) or belong to another bookie, "
                  "and ledgers may still count on data the id's former disks held. Start "
                  "these disks under another bookie id (bookieId); or, if the former data "
                  "is gone for good and its ledgers were re-replicated, remove the cookie "
                  "(MetadataStore.remove_cookie) and start again")
    else:
        advice = ("the same bookie instance now names other directories than when it "
                  "joined the cluster: correct journalDirectory and ledgerDirectories, or, "
                  "if the directories were moved on purpose, run pybk updatecookie with "
                  "the new settings (pybk.cluster.cookies.update_cookies)")
    raise InvalidCookie(f"bookie {cookie.bookie_id} refuses to start: its cookie {path} in "
                        f"{store} does not match its directories ({'; '.join(differences)})"
                        f": {advice}")


def known_cookie(store: "MetadataStore", bookie_id: str) -> tuple[Cookie, int] | None:
    """The cluster's cookie of ``bookie_id`` and its version, None if it has none;
    InvalidCookie if the record is not a cookie, MetadataError if the store fails."""
    try:
        return store.read_cookie(bookie_id)
    except MalformedMetadata as e:
        raise InvalidCookie(f"bookie {bookie_id}: its cookie {cookie_path(bookie_id)} in "
                            f"{store} is not a pybk bookie cookie ({e}); remove it if it "
                            "is stale") from e
