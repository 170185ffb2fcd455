"""Where attnkit keeps the files it makes on a machine (compiled call memos, the paired gate's
Triton cache): ``$ATTNKIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/attnkit``, else
``~/.cache/attnkit``."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    explicit = os.environ.get("ATTNKIT_CACHE_DIR")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attnkit"
