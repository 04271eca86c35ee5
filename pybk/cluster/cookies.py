"""Where a bookie's directories meet the cluster: the cluster's copy of a bookie's cookie
made from the cookie its directories hold, and ``pybk updatecookie``.

The directories' cookie is the storage engine's (:mod:`pybk.storage.cookie`); the
cluster's copy, its record format and the start-up check are the metadata layer's
(:mod:`pybk.meta.cookies`).  This module, above both, joins them.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

from pybk.errors import InvalidConfiguration, InvalidCookie
from pybk.meta.cookies import Cookie, cookie_path, known_cookie
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
