"""pybk: Apache BookKeeper's replicated log storage in Python."""

from setuptools import find_packages, setup

setup(
    name="pybk",
    version="0.1.0",
    description="A Python implementation of Apache BookKeeper's replicated log storage",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["pybk", "pybk.*"]),
    package_data={"pybk": ["py.typed"], "pybk.http": ["status_page.html"]},
    install_requires=[
        "lmdb>=1.4",
        "mmh3>=4.0",
        "kazoo>=2.9",
        "pyzmq>=25.0",
        "crc32c>=2.4",
        "tqdm>=4.60",
        "prometheus_client>=0.17",
    ],
    extras_require={
        # pyspark's wheel ships ZooKeeper 3.9's jars: the tests run a real ZooKeeper.
        # ruff and mypy: `make lint`, the gate `make test` runs first.  mkdocs-material and
        # mkdocstrings-python: the user guide's site, which `make test` builds strictly
        # next.  Pinned: a newer release brings new checks (or new warnings, which
        # --strict makes errors), which a change of its own should take on.
        "test": ["pytest>=7.4", "pytest-timeout>=2.2", "pytest-asyncio>=1.0",
                 "pytest-xdist>=3.5", "pyspark>=4.0", "pyarrow>=18", "ruff==0.17.6",
                 "mypy==2.4.1", "mkdocs-material==9.8.2", "mkdocstrings-python==2.0.11"],
        "spark": ["pyspark>=4.0", "pyarrow>=18"],
        # The benchmarks' --plot (benchmarks/plot.py); `make bench` installs it.
        "bench": ["matplotlib>=3.7"],
    },
    entry_points={"console_scripts": ["pybk = pybk.cli:main"]},
)
