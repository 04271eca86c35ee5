"""Cookies stop a bookie from starting on missing, swapped or wiped directories; an
embedded WAL's directory can be copied, moved or opened through a symlink; a bookie
server's directories moved on purpose are accepted again by updatecookie."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from clusterutil import address  # noqa: F401 (fixture)
from conftest import KEY, entry

import pybk
from pybk.cluster.cookies import update_cookies
from pybk.errors import BookKeeperError, InvalidCookie
from pybk.storage import Bookie, format_bookie
from pybk.storage.cookie import directory_cookie, format_directories

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


# -- a bookie server's directories moved on purpose: updatecookie -------------------------

def _moved(settings, tmp_path, order=(0, 1)):
    """Move the bookie's directories under tmp_path/new; the settings naming them there,
    the ledger directories in ``order``."""
    new = tmp_path / "new"
    new.mkdir()
    shutil.move(settings.journalDirectory, new / "journal")
    ledgers = []
    for i, directory in enumerate(settings.ledgerDirectories):
        shutil.move(directory, new / f"ledgers{i}")
        ledgers.append(str(new / f"ledgers{i}"))
    return settings.replace(journalDirectory=str(new / "journal"),
                            ledgerDirectories=tuple(ledgers[i] for i in order))


def test_a_moved_bookie_is_refused_until_updatecookie_accepts_its_directories(
        settings_factory, tmp_path):
    settings = _formatted(settings_factory)
    with Bookie(settings) as bookie:
        for i in range(10):
            bookie.add_entry(1, i, entry(1, i), KEY)
    moved = _moved(settings, tmp_path)
    with pytest.raises(InvalidCookie, match=f"records journal {settings.journalDirectory}.*"
                                            "run pybk updatecookie"):
        Bookie(moved)
    cookie = update_cookies(moved)  # never in a cluster: no cluster copy to update
    assert (cookie.journal_directory, cookie.ledger_directories) == \
        (moved.journalDirectory, moved.ledgerDirectories)
    assert directory_cookie(moved) == cookie
    with Bookie(moved) as bookie:
        assert [bookie.read_entry(1, i) for i in range(10)] == \
            [entry(1, i) for i in range(10)]
    assert update_cookies(moved) == cookie  # running it again changes nothing


def test_updatecookie_refuses_directories_that_are_not_one_bookies(settings_factory,
                                                                   tmp_path):
    settings = _formatted(settings_factory)
    before = directory_cookie(settings)
    with Bookie(settings), pytest.raises(BookKeeperError, match="a bookie is using these "
                                                                "directories; stop it"):
        update_cookies(settings)
    swapped = _moved(settings, tmp_path, order=(1, 0))
    with pytest.raises(InvalidCookie, match="were directories swapped"):
        update_cookies(swapped)
    other = settings.replace(journalDirectory=str(tmp_path / "oj"),
                             ledgerDirectories=(str(tmp_path / "ol"),))
    format_bookie(other)
    mixed = swapped.replace(ledgerDirectories=(swapped.ledgerDirectories[1],
                                               other.ledgerDirectories[0]))
    with pytest.raises(InvalidCookie, match="belongs to another bookie"):
        update_cookies(mixed)
    moved = swapped.replace(ledgerDirectories=swapped.ledgerDirectories[::-1])
    # Refused without writing anything: the cookies still name the former paths.
    with pytest.raises(InvalidCookie, match="run pybk updatecookie"):
        Bookie(moved)
    assert update_cookies(moved).instance_id == before.instance_id  # in order: accepted


def test_directories_formatted_by_an_earlier_pybk_still_start_and_can_move(settings_factory,
                                                                           tmp_path):
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
    moved = _moved(settings, tmp_path)
    with pytest.raises(InvalidCookie, match="run pybk updatecookie"):
        Bookie(moved)
    assert update_cookies(moved).instance_id == "0123abcd"
    with open(os.path.join(moved.ledgerDirectories[1], "current", "COOKIE")) as f:
        assert json.load(f)["format"] == 2  # rewritten in the current format
    with Bookie(moved) as bookie:
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
