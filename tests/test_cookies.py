"""Cookies stop a bookie from starting on missing, swapped or wiped directories."""

from __future__ import annotations

import os
import shutil

import pytest

from conftest import KEY, entry
from pybk.errors import InvalidCookie
from pybk.storage import Bookie, format_bookie

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
    with pytest.raises(InvalidCookie, match="ledger directories"):
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
