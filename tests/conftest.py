import os

import pytest

# No test may reach the Hugging Face hub; without these flags huggingface_hub retries for ~20 s.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

pytest_plugins = ["loopback", "workflow_runs", "stage_fixtures", "finished_run"]


# Under pytest-xdist (`make test`: --dist loadgroup) each worker builds its own session fixtures. The tests
# that share an expensive one (a whole workflow run, the docker image) run on one worker, so it is built
# once; every other test runs with the rest of its module (module fixtures are built once too).
SHARED_FIXTURES = ("finished_run", "clean_tasks", "docker_backend", "proposals")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which turns the marker into the scheduling group
def pytest_collection_modifyitems(config, items):
    for item in items:
        names = getattr(item, "fixturenames", ())
        shared = next((name for name in SHARED_FIXTURES if name in names), None)
        if shared is None and "docker" in item.nodeid:  # the attack matrix asks for the daemon by name
            shared = "docker_backend"
        item.add_marker(pytest.mark.xdist_group(shared or item.nodeid.split("::")[0]))


@pytest.fixture(scope="session")
def bwrap_backend():
    """The local sandbox under bubblewrap (skips where bubblewrap cannot run), for tests whose checks need real
    confinement (read-only mounts, no network): the post-training tasks' tests."""
    from gymforge.sandbox import SandboxError, get_sandbox

    try:
        return get_sandbox("local", confinement="bwrap")
    except SandboxError as err:
        pytest.skip(f"bubblewrap unavailable: {err}")
