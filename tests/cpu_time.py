"""`pytest --cpu-durations=N`: the N test phases that used the most CPU, and CPU per xdist group.

`--durations` counts wall time, waiting included. On 2 cores the suite is CPU-bound (the machine is ~90% busy
through `make test-fast`), so CPU is what a faster suite has to cut. Counted per phase (setup, call, teardown):
the test process's own CPU plus that of the child processes it waited for (Snakemake runs and their jobs, CLI runs,
training). Not counted: processes nobody waits for, and among them everything inside a bubblewrap sandbox (bwrap's
init of the new pid namespace outlives the bwrap it was started by and is reaped by the machine's init, so its CPU
never reaches the test), docker containers and daemonized servers. A sandbox-heavy test (the evaluator probes, the
attack matrix) therefore shows only a fraction of its CPU here: `python bench/suite_cpu.py -- <pytest command>`
counts every process through process accounting. A session fixture's cost lands on the setup of the first test
that asks for it.
"""

from __future__ import annotations

import resource
from collections import Counter

import pytest

_CPU = pytest.StashKey[dict[str, float]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cpu-durations", type=int, default=None, metavar="N",
                     help="show the N test phases that used the most CPU (children waited for included, bubblewrap "
                          "sandboxes not: bench/suite_cpu.py), "
                          "and CPU per xdist group")


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _timed(item: pytest.Item, when: str):
    start = _cpu()
    yield
    item.stash.setdefault(_CPU, {})[when] = _cpu() - start


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    yield from _timed(item, "setup")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    yield from _timed(item, "call")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item):
    yield from _timed(item, "teardown")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    cpu = item.stash.get(_CPU, {}).get(call.when)
    if cpu is not None:  # travels to the xdist controller with the report
        outcome.get_result().user_properties.append(("cpu_s", round(cpu, 2)))


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    n = config.getoption("cpu_durations")
    if n is None:
        return
    rows = []
    for reports in terminalreporter.stats.values():
        for report in reports:
            cpu = dict(getattr(report, "user_properties", ())).get("cpu_s")
            if cpu is not None:
                rows.append((cpu, report.when, report.nodeid))
    groups: Counter[str] = Counter()
    for cpu, _, nodeid in rows:
        groups[nodeid.rpartition("@")[2] if "@" in nodeid else nodeid.split("::")[0]] += cpu
    terminalreporter.write_sep("=", f"most CPU: {sum(r[0] for r in rows):.0f} CPU-s in all (tests and the children "
                                    "they waited for; not bubblewrap sandboxes: bench/suite_cpu.py)")
    for cpu, when, nodeid in sorted(rows, reverse=True)[:n]:
        terminalreporter.write_line(f"{cpu:8.1f}s {when:<8} {nodeid}")
    terminalreporter.write_sep("-", "CPU per group (xdist group, else module)")
    for group, cpu in groups.most_common(n):
        terminalreporter.write_line(f"{cpu:8.1f}s {group}")
