"""Task ids: the one rule every id obeys, since ids name result files and run folders.

Its own module so that the config models and the plan can both check ids without importing each other.
"""

from __future__ import annotations

import re

ID_MAX_LENGTH = 64
SAFE_ID_PATTERN = rf"^[A-Za-z0-9_-]{{1,{ID_MAX_LENGTH}}}$"  # every task id, MLGym's own included


def short_repr(value: str) -> str:
    """`value` quoted for an error message, cut after 40 characters."""
    return repr(value) if len(value) <= 48 else f"{value[:40]!r}..."


def check_task_id(value: str, what: str = "task id") -> str:
    """`value` if it is safe as a file and directory name: at most 64 characters of [A-Za-z0-9_-].

    Every task id must pass, MLGym's own included: ids name result files and run folders.
    """
    if not re.fullmatch(SAFE_ID_PATTERN, value):
        problem = (f"is {len(value)} characters long (at most {ID_MAX_LENGTH})" if len(value) > ID_MAX_LENGTH
                   else "is empty" if not value else "may only use ASCII letters, digits, '_' and '-'")
        raise ValueError(f"{what} {short_repr(value)} {problem}; ids name files and folders")
    return value
