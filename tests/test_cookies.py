"""Cookies stop a bookie from starting on missing, swapped or wiped directories; an
embedded WAL's directory can be copied, moved or opened through a symlink."""

from __future__ import annotations

import json
import os
import shutil

import pytest

import pybk
from clusterutil import address  # noqa: F401 (fixture)
from conftest import KEY, entry
from pybk.errors import InvalidCookie
from pybk.storage import Bookie, format_bookie
from pybk.storage.cookie import format_directories

pytestmark = pytest.mark.timeout(60)


def _formatted(settings_factory, **overrides):
    settings = settings_factory(**overrides)
    format_bookie(settings)
    return settings


def test_format_then_start(settings_factory):
    settings = _formatted(settings_factory)
    with Bookie(settings) as bookie:
        bookie.add_entry(1, 0, entry(1, 0), KEY)


def test_format_refuses_a_used_bookie_unless_forced(settings_factory):
    settings = _formatted(settings_factory)
    with Bookie(settings) as bookie:
        bookie.add_entry(1, 0, entry(1, 0), KEY)
    with pytest.raises(InvalidCookie, match="already holds"):
        format_bookie(settings)
    format_bookie(settings, force=True)
    with Bookie(settings) as bookie:
        assert not bookie.ledger_exists(1)


def test_missing_directory_is_named(settings_factory):
    settings = _formatted(settings_factory)
    shutil.rmtree(settings.ledgerDirectories[1])
    with pytest.raises(InvalidCookie, match=f"{settings.ledgerDirectories[1]} does not exist"):
        Bookie(settings)


def test_wiped_directory_is_named(settings_factory):
    settings = _formatted(settings_factory)
    shutil.rmtree(settings.ledgerDirectories[0])
    os.makedirs(settings.ledgerDirectories[0])
    with pytest.raises(InvalidCookie, match=f"{settings.ledgerDirectories[0]} has no cookie"):
        Bookie(settings)


def test_swapped_directories_are_refused(settings_factory):
    settings = _formatted(settings_factory)
    first, second = settings.ledgerDirectories
    swapped = settings.replace(ledgerDirectories=(second, first))
    with pytest.raises(InvalidCookie, match=f"{second} is the bookie's ledger directory 1, "
                                            "but the settings name it as its ledger "
                                            "directory 0: were directories swapped"):
        Bookie(swapped)


def test_directory_of_another_bookie_is_refused(settings_factory, tmp_path):
    settings = _formatted(settings_factory)
    other = settings.replace(journalDirectory=str(tmp_path / "other-journal"),
                             ledgerDirectories=(str(tmp_path / "other-ledgers"),))
    format_bookie(other)
    # Put the other bookie's ledger disk in place of this bookie's second one.
    shutil.rmtree(settings.ledgerDirectories[1])
    shutil.copytree(other.ledgerDirectories[0], settings.ledgerDirectories[1])
    with pytest.raises(InvalidCookie, match=f"{settings.ledgerDirectories[1]} belongs to another"):
        Bookie(settings)


def test_unreadable_cookie_is_named(settings_factory):
    settings = _formatted(settings_factory)
    with open(os.path.join(settings.journalDirectory, "current", "COOKIE"), "w") as f:
        f.write("{not json")
    with pytest.raises(InvalidCookie, match="unreadable"):
        Bookie(settings)


def test_a_malformed_cookie_is_named(settings_factory):
    settings = _formatted(settings_factory)
    with open(os.path.join(settings.ledgerDirectories[0], "current", "COOKIE"), "w") as f:
        json.dump({"format": 2, "instance_id": "x"}, f)
    with pytest.raises(InvalidCookie, match="is malformed .*exactly the keys"):
        Bookie(settings)


# -- directories not bound to paths (an embedded WAL's) ------------------------------------

def _write_wal(directory, count: int = 300) -> list:
    """A closed WAL of ``count`` records in several segments; its records."""
    with pybk.open(directory) as wal:
        records = [(wal.append(b"record %d " % i * 20), b"record %d " % i * 20)
                   for i in range(count // 2)]
    with pybk.open(directory) as wal:  # a second segment, after a restart
        records += [(wal.append(b"again %d " % i * 20), b"again %d " % i * 20)
                    for i in range(count - len(records))]
    return records


def test_a_copied_or_moved_wal_directory_opens_with_every_record(tmp_path):
    records = _write_wal(tmp_path / "wal")
    shutil.copytree(tmp_path / "wal", tmp_path / "copy")  # a copy (or a restored backup)
    os.rename(tmp_path / "wal", tmp_path / "moved")
    for directory in ("copy", "moved"):
        with pybk.open(tmp_path / directory) as wal:
            assert list(wal.read()) == records
            later = wal.append(b"written in " + directory.encode())
        with pybk.open(tmp_path / directory) as wal:
            assert list(wal.read()) == records + [(later, b"written in " +
                                                   directory.encode())]


def test_a_wal_opens_through_a_symlink(tmp_path):
    records = _write_wal(tmp_path / "wal")
    os.symlink(tmp_path / "wal", tmp_path / "link")
    with pybk.open(tmp_path / "link") as wal:
        assert list(wal.read()) == records
        later = wal.append(b"through the link")
    with pybk.open(tmp_path / "wal") as wal:  # and by its own path again
        assert list(wal.read()) == records + [(later, b"through the link")]


def test_unbound_directories_are_still_checked_by_their_roles(settings_factory, tmp_path):
    settings = settings_factory()
    format_directories(settings, bind_paths=False)
    first, second = settings.ledgerDirectories
    with pytest.raises(InvalidCookie, match=f"{second} is the bookie's ledger directory 1, "
                                            "but the settings name it as its ledger "
                                            "directory 0: were directories swapped"):
        Bookie(settings.replace(ledgerDirectories=(second, first)))
    with pytest.raises(InvalidCookie, match="formatted with 2 ledger directories, the "
                                            "settings name 1"):
        Bookie(settings.replace(ledgerDirectories=(first,)))
    other = settings.replace(journalDirectory=str(tmp_path / "j2"),
                             ledgerDirectories=(str(tmp_path / "l2"), str(tmp_path / "l3")))
    format_directories(other, bind_paths=False)
    with pytest.raises(InvalidCookie, match="belongs to another bookie"):
        Bookie(settings.replace(ledgerDirectories=(first, other.ledgerDirectories[1])))
    for directory in (settings.journalDirectory, *settings.ledgerDirectories):
        os.rename(directory, directory + "-moved")
    moved = settings.replace(journalDirectory=settings.journalDirectory + "-moved",
                             ledgerDirectories=tuple(d + "-moved" for d in (first, second)))
    with Bookie(moved) as bookie:  # moved together: identified by instance and roles
        bookie.add_entry(1, 0, entry(1, 0), KEY)


def test_directories_formatted_by_an_earlier_pybk_still_start(settings_factory):
    settings = settings_factory()
    old = {"format": 1, "instance_id": "0123abcd",
           "journal_directory": settings.journalDirectory,
           "ledger_directories": list(settings.ledgerDirectories)}
    for directory in (settings.journalDirectory, *settings.ledgerDirectories):
        os.makedirs(os.path.join(directory, "current"))
        with open(os.path.join(directory, "current", "COOKIE"), "w") as f:
            json.dump(old, f)  # format 1: the same cookie, bound to paths, everywhere
    with Bookie(settings) as bookie:
        assert bookie.instance_id == "0123abcd"
        bookie.add_entry(1, 0, entry(1, 0), KEY)
    with Bookie(settings) as bookie:
        assert bookie.read_entry(1, 0) == entry(1, 0)


def test_a_promoted_wal_directory_moved_serves_the_cluster_again(tmp_path, address):
    cluster = dict(cluster=address, ensemble=1, write_quorum=1, ack_quorum=1,
                   listenAddress="127.0.0.1:0")
    with pybk.open(tmp_path / "wal", **cluster) as wal:
        records = [(wal.append(b"member %d" % i), b"member %d" % i) for i in range(50)]
        bookie_id = wal.bookie_id
    os.rename(tmp_path / "wal", tmp_path / "moved")
    with pybk.open(tmp_path / "moved", **cluster) as wal:  # the cluster's cookie agrees
        assert wal.bookie_id == bookie_id
        assert list(wal.read()) == records
