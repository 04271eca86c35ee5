"""``python -m pybk``: the same as the ``pybk`` command."""

from pybk.cli import main

raise SystemExit(main())
