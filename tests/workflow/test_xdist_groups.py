"""`make test` schedules by group (pytest-xdist `--dist loadgroup`): tests/conftest.py puts the tests that share an
expensive session fixture (a whole workflow run) in one group, so one worker builds it once. If the group is lost
(pytest 9.2 changed where a node's id lives, and xdist 3.8 then silently drops every group), each worker builds
every such fixture again: three tiny workflow runs instead of one, minutes of CI."""

import subprocess
import sys

import pytest


def test_tests_are_scheduled_by_their_group(request: pytest.FixtureRequest) -> None:
    if getattr(request.config, "workerinput", None) is None or not request.config.getvalue("loadgroup"):
        pytest.skip("runs under `make test` (pytest-xdist with --dist loadgroup)")
    assert request.node.nodeid.endswith("@tests/workflow/test_xdist_groups.py"), request.node.nodeid


def test_groups_that_wait_are_dealt_before_larger_ones() -> None:
    """The order tests/conftest.py deals groups in (`--no-loadscope-reorder` keeps it): a module marked `waits`
    (test_probe_batch.py: evaluators that hang to their timeout) before a larger one, so that its minute of waiting
    overlaps the rest instead of ending the run alone (a 30 s tail of `make test-fast` before)."""
    waits, larger = "tests/tasks/test_probe_batch.py", "tests/agent/test_audit.py"
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", larger,
                           waits], capture_output=True, text=True, timeout=300, check=True)
    order = [line.split("::")[0] for line in proc.stdout.splitlines() if "::" in line]
    assert order.count(larger) > order.count(waits) > 0
    assert order == sorted(order, key=lambda module: module != waits), order
