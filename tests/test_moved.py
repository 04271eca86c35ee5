"""Modules that moved between packages keep their old import paths for one release:
the old path gives the module at its new path, with a DeprecationWarning naming it."""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest

from pybk._moved import MOVED_MODULES


@pytest.mark.parametrize("old", sorted(MOVED_MODULES))
def test_an_old_module_path_gives_the_moved_module_and_warns(old, monkeypatch):
    new = MOVED_MODULES[old]
    moved = importlib.import_module(new)
    monkeypatch.delitem(sys.modules, old, raising=False)  # as if imported for the first time
    with pytest.warns(DeprecationWarning, match=f"{old} has moved to {new}"):
        found = importlib.import_module(old)
    assert found is moved  # one module: its state and monkeypatches are shared by both names
    assert moved.__name__ == new and moved.__spec__.name == new


def test_the_network_classes_are_still_found_in_pybk_cluster():
    import pybk.cluster
    import pybk.net
    for name in ("BookieServer", "ClientLoop", "ZmqBookieClient"):
        with pytest.warns(DeprecationWarning, match=f"pybk.cluster.{name} has moved to "
                                                    f"pybk.net.{name}"):
            assert getattr(pybk.cluster, name) is getattr(pybk.net, name)


def test_new_paths_and_unknown_names_are_not_deprecated():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        import pybk.cluster
        import pybk.net.wire  # noqa: F401
        import pybk.testing.local_cluster  # noqa: F401
        with pytest.raises(AttributeError, match="no attribute 'nothing'"):
            pybk.cluster.nothing  # noqa: B018
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module("pybk.cluster.nothing")
