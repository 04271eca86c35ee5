"""Every Python block of the README and of the user guide (``docs/guide/*.md``) runs as
written, and every link of the README and of ``docs/`` leads to a file (and heading) of
the repository.

Each block runs as a script of its own (a fresh process: ``python block.py``) in a fresh
directory, where its relative paths (``data/wal``, ...) land.  Two substitutions give
the blocks that reach a cluster a real one: a freshly formatted cluster on the test
ZooKeeper with three bookies serving it (so that a client can create a ledger on an
ensemble of three).  The guide's example cluster address, :data:`README_CLUSTER`, is
replaced by its address; and a block that reads :data:`LOCAL_CLUSTER_CONF` (the file
``pybk localcluster 3 --dir data/cluster`` writes, as the README's quick start runs it)
finds that file naming it.  A block that appears on several pages (the README's Spark
example is also the guide's) runs once.

A block that cannot run as written is preceded by the line ``<!-- not run: <why> -->``;
the test skips it, giving that reason.  Keep such blocks few.

The guide's site is built by ``mkdocs build --strict`` (``make docs``, which ``make
test`` runs before the tests); the link check here covers the README, which is not part
of the site, with the same rules.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import os
import re
import subprocess
import sys
import warnings

import pytest
import sparkutil
from clusterutil import serving_cluster

from pybk.settings import ServerSettings

pytestmark = pytest.mark.timeout(300)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
#: The pages whose Python blocks run: the README, then the guide's.
PAGES = [README, *sorted(glob.glob(os.path.join(ROOT, "docs", "guide", "*.md")))]
#: The cluster address the guide's examples use.
README_CLUSTER = "zk://zk1:2181,zk2:2181,zk3:2181/ledgers"
#: The client settings file of the README's local cluster (its address, as
#: ``metadataServiceUri=...``), which the README's cluster and Spark blocks read.
LOCAL_CLUSTER_CONF = "data/cluster/client.conf"
#: The most lines the README may have: it is a page, the guide holds the rest.
README_LINES_MAX = 200
_NOT_RUN = re.compile(r"<!-- not run: (.+?) -->")
RUN_TIMEOUT_S = 240  # a Spark block on a busy 2-core machine
#: Spark's Python workers run this interpreter (a user's would be their environment's
#: ``python3``), on loopback; its JVMs take the tests' options (tests/sparkutil.py).
SPARK_ENV = sparkutil.script_env()


def python_blocks(text: str) -> list[tuple[str, str, str | None]]:
    """``(name, code, why not run or None)`` of every ```` ```python ```` block; a
    block's name is the section it is in, numbered when a section holds several.
    Lines of other code blocks (a shell's ``# comment``) are no headings."""
    blocks = []
    section, previous, lines = "top", "", iter(text.splitlines())
    for line in lines:
        if line.strip() == "```python":
            code = []
            for body in lines:
                if body.strip() == "```":
                    break
                code.append(body)
            not_run = _NOT_RUN.fullmatch(previous.strip())
            blocks.append((section, "\n".join(code) + "\n",
                           not_run.group(1) if not_run else None))
        elif line.startswith("```"):
            for body in lines:
                if body.startswith("```"):
                    break
        elif line.startswith("#"):
            section = line.lstrip("#").strip()
        if line.strip():
            previous = line
    names = [name for name, _, _ in blocks]
    return [(f"{name} {names[:i].count(name) + 1}" if names.count(name) > 1 else name,
             code, why) for i, (name, code, why) in enumerate(blocks)]


def page_blocks(pages: list[str]) -> list[tuple[str, str, str | None]]:
    """The blocks of ``pages``, each named ``page: section``; a block whose code an
    earlier page already has is left out (it runs once, under its first name)."""
    blocks: dict[str, tuple[str, str, str | None]] = {}
    for page in pages:
        with open(page, encoding="utf-8") as f:
            for name, code, why in python_blocks(f.read()):
                blocks.setdefault(code, (f"{os.path.relpath(page, ROOT)}: {name}", code, why))
    return list(blocks.values())


BLOCKS = page_blocks(PAGES)


def test_the_readme_and_the_guide_have_python_blocks_and_few_are_not_run():
    readme = [name for name, _, _ in BLOCKS if name.startswith("README.md: ")]
    assert len(readme) >= 3
    assert len(BLOCKS) - len(readme) >= 12
    assert sum(why is not None for _, _, why in BLOCKS) <= 1


def test_the_readme_is_a_page():
    with open(README, encoding="utf-8") as f:
        assert len(f.read().splitlines()) <= README_LINES_MAX


@pytest.fixture
def cluster(zookeeper, tmp_path):
    """A formatted cluster of its own on the test ZooKeeper with three bookies serving
    it in this process (closed after the test); its address."""
    with serving_cluster(zookeeper, tmp_path) as address:
        yield address


def _needs(code: str) -> list[pytest.MarkDecorator]:
    """The markers of a block that needs a ZooKeeper server (a cluster) or Spark."""
    marks = []
    if README_CLUSTER in code or LOCAL_CLUSTER_CONF in code or "ZooKeeperServer" in code:
        marks.append(pytest.mark.zookeeper)
    if "pyspark" in code or "SparkSession" in code:
        marks.append(pytest.mark.spark)
    return marks


@pytest.mark.parametrize("name, code, not_run",
                         [pytest.param(*block, marks=_needs(block[1]), id=block[0])
                          for block in BLOCKS])
def test_a_readme_block_runs_as_written(name, code, not_run, tmp_path, request):
    if not_run is not None:
        pytest.skip(f"block {name!r} is marked not run: {not_run}")
    workdir = tmp_path / "block"
    workdir.mkdir()
    if README_CLUSTER in code:
        code = code.replace(README_CLUSTER, request.getfixturevalue("cluster"))
    if LOCAL_CLUSTER_CONF in code:
        conf = workdir / LOCAL_CLUSTER_CONF
        conf.parent.mkdir(parents=True)
        conf.write_text(f"metadataServiceUri={request.getfixturevalue('cluster')}\n")
    (workdir / "block.py").write_text(code)
    result = subprocess.run([sys.executable, "block.py"], cwd=workdir, capture_output=True,
                            text=True, timeout=RUN_TIMEOUT_S, stdin=subprocess.DEVNULL,
                            env=dict(os.environ, PYTHONPATH=ROOT, **SPARK_ENV))
    assert result.returncode == 0, f"block {name!r} failed:\n{code}\n" \
                                   f"{result.stdout}{result.stderr}"


# -- links ---------------------------------------------------------------------------------

#: The Markdown files whose links must lead somewhere.
MARKDOWN = [README, *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))), *PAGES[1:]]
_FENCE = re.compile(r"^```.*?^```", re.M | re.S)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # http:, https:, mailto:


def prose(text: str) -> str:
    """``text`` without code blocks and code spans, where brackets are not links."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def anchors(path: str) -> set[str]:
    """The anchors of a Markdown file's headings, as GitHub makes them."""
    with open(path, encoding="utf-8") as f:
        headings = re.findall(r"^#+\s+(.*?)\s*$", _FENCE.sub("", f.read()), re.M)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
            for heading in headings}


def broken_links(path: str) -> list[str]:
    """Each link of the Markdown file ``path`` that does not lead to a file of the
    repository, or to a heading of it, with the reason."""
    with open(path, encoding="utf-8") as f:
        targets = _LINK.findall(prose(f.read()))
    broken = []
    for target in targets:
        if _EXTERNAL.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) \
            if file_part else path
        if os.path.commonpath([resolved, ROOT]) != ROOT:
            broken.append(f"{target}: outside the repository")
        elif not os.path.exists(resolved):
            broken.append(f"{target}: no such file")
        elif anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading #{anchor} in {os.path.relpath(resolved, ROOT)}")
    return broken


@pytest.mark.parametrize("path", MARKDOWN, ids=[os.path.relpath(p, ROOT) for p in MARKDOWN])
def test_every_link_leads_to_a_file_of_the_repository(path):
    assert broken_links(path) == []


def test_the_readme_links_the_guide_the_design_and_the_threads():
    with open(README, encoding="utf-8") as f:
        targets = _LINK.findall(prose(f.read()))
    assert {"docs/guide/index.md", "docs/DESIGN.md", "docs/THREADS.md"} <= set(targets)


def test_a_broken_link_is_found(tmp_path, monkeypatch):
    """The check itself: a missing file, a missing heading and a path outside the
    repository are each reported; links in code and external ones are not checked."""
    monkeypatch.setattr(sys.modules[__name__], "ROOT", str(tmp_path))
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "A.md").write_text("# A title\n\n## Some part: here\n")
    page = tmp_path / "README.md"
    page.write_text("[ok](docs/A.md) [ok](docs/A.md#some-part-here) [ok](#top) "
                    "[web](https://example.org/x) `[code](missing.md)`\n"
                    "```\n[block](missing.md)\n```\n# Top\n"
                    "[gone](docs/B.md) [no heading](docs/A.md#nowhere) [out](../x.md)\n")
    assert broken_links(str(page)) == [
        "docs/B.md: no such file", "docs/A.md#nowhere: no heading #nowhere in docs/A.md",
        "../x.md: outside the repository"]


#: A path of the repository in a code span: `pybk/log/wal.py`, `tests/golden/`.
_PATH_SPAN = re.compile(r"`((?:pybk|tests|benchmarks|examples|docs)/[\w./-]*)`")
#: A name of pybk in a code span: `pybk.net.wire`, `pybk.log.ranges.plan(...)`.
_NAME_SPAN = re.compile(r"`(pybk(?:\.\w+)+)")


def _missing(name: str) -> str | None:
    """Why the dotted name ``name`` leads to no object of pybk, or None if it does.  A
    moved module's old name (pybk/_moved.py) is found by the module it gives, whose
    ``__name__`` is the new one (its warning comes only at the first import of a
    process); a moved attribute warns at every access."""
    parts = name.split(".")
    for length in range(len(parts), 0, -1):  # the longest prefix that is a module
        module_name = ".".join(parts[:length])
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                found = importlib.import_module(module_name)
        except ModuleNotFoundError:
            continue
        if found.__name__ != module_name:
            return "a moved module's old name"
        for part in parts[length:]:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("error", DeprecationWarning)
                    found = getattr(found, part)
            except AttributeError:
                return f"no {part}"
            except DeprecationWarning:
                return "a moved name"
        return None
    return "no such module"


def stale_names(path: str) -> list[str]:
    """The repository paths and ``pybk.`` names that the Markdown file ``path`` shows in
    code spans but that do not exist, or exist only as a moved module's deprecated
    alias (pybk/_moved.py), with the reason."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    stale = [f"{name}: no such path" for name in sorted(set(_PATH_SPAN.findall(text)))
             if not os.path.exists(os.path.join(ROOT, name.rstrip("/")))]
    for name in sorted(set(_NAME_SPAN.findall(text))):
        why = _missing(name)
        if why is not None:
            stale.append(f"{name}: {why}")
    return stale


@pytest.mark.parametrize("path", PAGES, ids=[os.path.relpath(p, ROOT) for p in PAGES])
def test_every_path_and_name_a_page_shows_exists(path):
    assert stale_names(path) == []


def test_a_stale_path_or_name_is_found(tmp_path):
    """The check itself: a path, a module, an attribute, a moved module's old name (also
    once it was imported) and a moved attribute."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        importlib.import_module("pybk.cluster.wire")
    page = tmp_path / "page.md"
    page.write_text("`pybk/log/wal.py` `pybk.log.wal.open` `pybk/nowhere.py` "
                    "`pybk.log.nowhere` `pybk.log.wal.nothing` `pybk.cluster.wire` "
                    "`pybk.cluster.BookieServer`\n")
    assert stale_names(str(page)) == [
        "pybk/nowhere.py: no such path", "pybk.cluster.BookieServer: a moved name",
        "pybk.cluster.wire: a moved module's old name", "pybk.log.nowhere: no nowhere",
        "pybk.log.wal.nothing: no nothing"]


# -- generated references ------------------------------------------------------------------

def _hook(name: str):
    """The module of a MkDocs hook in docs/hooks (not a package: loaded by path)."""
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(ROOT, "docs", "hooks", f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(table: str) -> dict[str, list[str]]:
    """A Markdown table's rows by their first cell (a name in a code span)."""
    rows = {}
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split(" | ")]
        if cells[0].startswith("`"):
            rows[cells[0].strip("`")] = cells[1:]
    return rows


def test_the_settings_reference_documents_every_field_of_every_settings_class():
    from pybk.meta.zookeeper import ZooKeeperSettings
    from pybk.settings import ClientSettings, LogSettings

    hook = _hook("settings_reference")
    with open(os.path.join(ROOT, "docs", "guide", "settings.md"), encoding="utf-8") as f:
        page = hook.expand_markers(f.read())
    assert "<!--" not in page
    for cls in (ServerSettings, ClientSettings, LogSettings, ZooKeeperSettings):
        rows = _rows(hook.settings_table(f"{cls.__module__}.{cls.__name__}"))
        for field in dataclasses.fields(cls):
            kind, default, doc = rows[field.name]
            assert repr(field.default) in default and doc, (cls.__name__, field.name)
    # Fields under one comment share it; the comment's text is the code's.
    log_rows = _rows(hook.settings_table("pybk.settings.LogSettings"))
    assert log_rows["writeQuorumSize"][2] == log_rows["ensembleSize"][2]
    assert log_rows["segmentMaxBytes"][1] == "`268435456` (256 MiB)"
    assert "a larger record goes alone into its own entry" in log_rows["batchMaxBytes"][2]


def test_a_settings_field_without_a_comment_fails_the_build(tmp_path, monkeypatch):
    (tmp_path / "some_settings.py").write_text(
        "from dataclasses import dataclass\n\n\n@dataclass(frozen=True)\nclass Some:\n"
        "    #: Documented.\n    first: int = 1\n    shared: int = 2\n\n"
        "    undocumented: str = ''\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match=r"Some.undocumented has no #: comment"):
        _hook("settings_reference").settings_table("some_settings.Some")


def test_the_spark_options_table_lists_every_option_with_its_default():
    from pybk.spark.options import OPTIONS

    hook = _hook("settings_reference")
    with open(os.path.join(ROOT, "docs", "guide", "spark.md"), encoding="utf-8") as f:
        rows = _rows(hook.expand_markers(f.read()))
    for name, option in OPTIONS.items():
        uses, default, doc = rows[name]
        assert uses and doc == option.doc
        if option.default not in (None, ""):
            assert str(option.default).lower() in default.lower()


def test_sphinx_roles_in_docstrings_become_code_spans():
    roles = _hook("sphinx_roles")
    assert roles.markdown_names(":class:`~pybk.settings.ServerSettings` and "
                                ":func:`pybk.open`") == "`ServerSettings` and `pybk.open`"
