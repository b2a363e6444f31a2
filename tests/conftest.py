import os

import pytest

# No test may reach the Hugging Face hub; without these flags huggingface_hub retries for ~20 s.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# Three workers share two cores: OpenMP threads (torch's) that spin at barriers hold a core while the thread they wait
# for is descheduled. Set before any test imports torch, as train_student does for itself: the torch tests
# (test_training, test_rl, test_sft, test_rl_sharded, test_rl_frontier, test_micro, test_masks) on three workers
# took 82 s instead of 101 s, with 21% less CPU. (On idle cores passive threads cost instead: a tiny model's
# generation on 2 threads ~30% slower, so the product sets it only where cores are shared.)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# Tests that run SFT or RL log to no tracker (their default results_dir is the checkout's results/); the tracking
# tests turn trackio on with a results_dir of their own (gymforge.runtime.tracking).
os.environ.setdefault("GYMFORGE_TRACKING", "none")

pytest_plugins = ["loopback", "workflow_runs", "stage_fixtures", "finished_run", "rehearsal_run", "cpu_time"]


# Under pytest-xdist (`make test`: --dist loadgroup) each worker builds its own session fixtures. The tests
# that share an expensive one (a whole workflow run, the docker image) run on one worker, so it is built
# once; every other test runs with the rest of its module (module fixtures are built once too).
SHARED_FIXTURES = ("finished_run", "clean_tasks", "docker_backend", "proposals", "smollm2_cache")


# Tests on the docker backend start a private daemon and a container per sandbox: they are `slow`, so `make test`
# runs them and `make test-fast` (the edit-test loop) covers the sandbox contract on the local backend alone.
@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which turns the marker into the scheduling group, and
def pytest_collection_modifyitems(config, items):  # before `-m` deselects by marker
    for item in items:
        names = getattr(item, "fixturenames", ())
        shared = next((name for name in SHARED_FIXTURES if name in names), None)
        # The attack matrix asks for the daemon by name. The rehearsal shares the private daemon, and its check counts
        # the sandbox containers (label gymforge.sandbox=1) the daemon started during its run: another test's, at the
        # same time, would be counted too. So it runs in turn with the docker tests, not as a group of its own.
        if shared is None and ("docker" in item.nodeid or "rehearsal" in names):
            shared = "docker_backend"
        if shared == "docker_backend":
            item.add_marker(pytest.mark.slow)
        item.add_marker(pytest.mark.xdist_group(shared or item.nodeid.split("::")[0]))
    # `make test` runs `heavy` tests in its one parallel phase, beside the rest: the groups that hold one (or a test
    # that `waits`), and those that share an expensive fixture, are dealt to the workers first (with
    # --no-loadscope-reorder, xdist deals groups in this order), largest first, so that no long run starts last and
    # leaves the other workers idle. `make test-fast` deals in the same order.
    groups: dict[str, list[pytest.Item]] = {}
    for item in items:
        groups.setdefault(item.get_closest_marker("xdist_group").args[0], []).append(item)

    def first(group: str) -> tuple[bool, int]:
        long_runs = group in SHARED_FIXTURES or any(
            item.get_closest_marker("heavy") or item.get_closest_marker("waits") for item in groups[group])
        return not long_runs, -len(groups[group])

    items[:] = [item for group in sorted(groups, key=first) for item in groups[group]]


@pytest.fixture(scope="session")
def bwrap_backend():
    """The local sandbox under bubblewrap (skips where bubblewrap cannot run), for tests whose checks need real
    confinement (read-only mounts, no network, one-file binds): the post-training tasks' and the probe batch's tests."""
    from gymforge.sandbox import SandboxError, get_sandbox

    try:
        return get_sandbox("local", confinement="bwrap")
    except SandboxError as err:
        pytest.skip(f"bubblewrap unavailable: {err}")


@pytest.fixture(scope="session")
def smollm2_cache(tmp_path_factory):
    """One model cache for the tests whose tasks build SmolLM2-135M as their base (dequantized and saved, ~45 s):
    built by the first, found by the others, as the jobs of one run share `cache_dir`."""
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def rule_reads(tmp_path_factory):
    """{rule: {"reads": its declared config sections, "file": its rules/*.smk}}, as the Snakefile writes them for
    the jobs (a dry run of a copy of the workflow): tests that call a step's function directly run it under its
    rule's view (`gymforge.core.configview.restrict`), as its Snakemake job would."""
    import json
    import subprocess
    import sys

    from workflow_copy import copy_workflow

    workdir = copy_workflow(tmp_path_factory.mktemp("reads"), "rules", "report")
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--quiet", "all"], cwd=workdir,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (written,) = (workdir / "results" / ".gymforge").glob("reads-*.json")
    return json.loads(written.read_text())
