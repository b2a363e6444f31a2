"""core.ids: the one rule every task id obeys, since ids name result files and run folders."""

from __future__ import annotations

import pytest

from gymforge.core.ids import ID_MAX_LENGTH, check_task_id, short_repr


@pytest.mark.parametrize("value", ["blobClustering", "t0003", "rl-Meta_Maze", "x" * ID_MAX_LENGTH])
def test_safe_ids_pass_unchanged(value: str) -> None:
    assert check_task_id(value) == value


@pytest.mark.parametrize(("value", "problem"), [
    ("", "is empty"), ("../etc", "may only use"), ("a/b", "may only use"), ("tâche", "may only use"),
    ("a b", "may only use"), ("x" * (ID_MAX_LENGTH + 1), f"at most {ID_MAX_LENGTH}"),
])
def test_unsafe_ids_are_refused_with_the_reason(value: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        check_task_id(value, "rl.tasks entry")


def test_long_values_are_cut_in_messages() -> None:
    assert short_repr("abc") == "'abc'"
    assert short_repr("y" * 100) == repr("y" * 40) + "..."
