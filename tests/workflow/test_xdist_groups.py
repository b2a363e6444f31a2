"""`make test` schedules by group (pytest-xdist `--dist loadgroup`): tests/conftest.py puts the tests that share an
expensive session fixture (a whole workflow run) in one group, so one worker builds it once. If the group is lost
(pytest 9.2 changed where a node's id lives, and xdist 3.8 then silently drops every group), each worker builds
every such fixture again: three tiny workflow runs instead of one, minutes of CI."""

import pytest


def test_tests_are_scheduled_by_their_group(request: pytest.FixtureRequest) -> None:
    if getattr(request.config, "workerinput", None) is None or not request.config.getvalue("loadgroup"):
        pytest.skip("runs under `make test` (pytest-xdist with --dist loadgroup)")
    assert request.node.nodeid.endswith("@tests/workflow/test_xdist_groups.py"), request.node.nodeid
