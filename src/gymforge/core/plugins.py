"""Backends found by entry point (group `gymforge.backends`), so the seams' factories never import them.

The offline simulator (`gymforge.offline`: the teacher simulator and the offline hub) registers here; the
product reaches it only through `load`, and a user who installs gymforge without it gets a clear error
instead of an import deep in a stage.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

GROUP = "gymforge.backends"


class BackendMissing(LookupError):
    pass


def load(name: str) -> Any:
    """The object registered as `name` (e.g. `offline-hub`, `offline-teacher`)."""
    found = entry_points(group=GROUP, name=name)
    if not found:
        raise BackendMissing(f"no gymforge backend {name!r} is installed (entry point group {GROUP!r}); "
                             "reinstall gymforge (`pip install -e .`) to register the offline backends")
    try:
        return next(iter(found)).load()
    except ModuleNotFoundError as err:  # registered, but a package of its extra is not installed
        raise BackendMissing(f"gymforge backend {name!r} needs {err.name!r}, which is not installed; "
                             "install the offline extra (`pip install -e '.[offline]'`)") from err
