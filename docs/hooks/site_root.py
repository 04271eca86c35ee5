"""MkDocs hook: the site's root page sends the reader to the guide.

The guide's home is docs/guide/index.md (so that its links read the same on GitHub,
where docs/ also holds DESIGN.md and THREADS.md), which MkDocs publishes at
``guide/``; this writes ``site/index.html`` as a redirect there.
"""

from __future__ import annotations

import os
from typing import Any

PAGE = """<!doctype html>
<meta charset="utf-8">
<title>pybk</title>
<meta http-equiv="refresh" content="0; url=guide/">
<a href="guide/">pybk's user guide</a>
"""


def on_post_build(config: Any) -> None:
    """MkDocs' hook: write the redirect once the site is built."""
    with open(os.path.join(config["site_dir"], "index.html"), "w", encoding="utf-8") as f:
        f.write(PAGE)
