"""The `edit a:b` command the offline teacher's agents write to change a file they have open."""

from __future__ import annotations


def edit_command(old: list[str], new: list[str]) -> str:
    """The smallest `edit a:b` that turns `old` into `new`."""
    p = 0
    while p < min(len(old), len(new)) and old[p] == new[p]:
        p += 1
    q = 0
    while q < min(len(old), len(new)) - p and old[-1 - q] == new[-1 - q]:
        q += 1
    start, end, body = p + 1, len(old) - q, new[p : len(new) - q]
    if end < start:  # a pure insertion still replaces one line: the one before it (or after, at the top)
        if p:
            start = end = p
            body = [old[p - 1], *body]
        else:
            start = end = 1
            body = [*body, old[0]]
    return "\n".join([f"edit {start}:{end}", *body, "end_of_edit"])
