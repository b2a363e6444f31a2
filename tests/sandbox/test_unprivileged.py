"""The rootless path, as a cluster user runs it: the local (bubblewrap) sandbox's attack matrix and a short workflow
run as an unprivileged user.

CI runs as root, and as root the local backend takes another path (no user namespace; each sandbox switches to a
uid of its own with setpriv). Users on a cluster have no root: bubblewrap then needs unprivileged user namespaces,
RLIMIT_NPROC counts the user's own tasks, and no file can be chowned. These tests run that path for real: as root
they create an unprivileged user (`gymforge-ci`) and run the attack module and `snakemake` under `runuser`. The
checkout and the interpreter must be reachable by that user: where an ancestor directory is closed to others
(`/root`, 0700, holding the base interpreter), it gets the search bit for others (`o+x`: paths inside can be
opened by name, nothing can be listed) for the length of this module, and its mode is put back after.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from workflow_copy import copy_workflow

REPO = Path(__file__).resolve().parents[2]
USER = "gymforge-ci"

pytestmark = [
    pytest.mark.slow,  # a nested pytest of ~60 s, a snakemake run of ~3 min
    pytest.mark.skipif(os.geteuid() != 0, reason="already unprivileged: every other test runs the rootless path"),
    pytest.mark.skipif(not all(map(shutil.which, ("runuser", "useradd", "bwrap"))),
                       reason="needs runuser, useradd and bubblewrap"),
]


def _closed_ancestors(paths: list[Path], uid: int, gid: int) -> list[Path]:
    """Directories on the way to `paths` that the user cannot search."""
    closed: list[Path] = []
    for path in paths:
        for d in [*reversed(path.parents), path] if path.is_dir() else reversed(path.parents):
            st = d.stat()
            bit = stat.S_IXUSR if st.st_uid == uid else stat.S_IXGRP if st.st_gid == gid else stat.S_IXOTH
            if not st.st_mode & bit and d not in closed:
                closed.append(d)
    return closed


@pytest.fixture(scope="module")
def unprivileged() -> Iterator[tuple[str, Path]]:
    """(user name, a home directory it owns), the checkout and interpreter reachable by it. The home is not under
    pytest's temporary root: every pytest run of root sets that back to 0700."""
    created = False
    try:
        pw = pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", "--shell", "/usr/sbin/nologin",
                        USER], check=True, capture_output=True)
        created, pw = True, pwd.getpwnam(USER)
    home = Path(tempfile.mkdtemp(prefix="gymforge-unprivileged-"))
    os.chown(home, pw.pw_uid, pw.pw_gid)
    needed = [REPO, Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), Path(sys.executable).resolve(),
              home]
    opened = {d: d.stat().st_mode for d in _closed_ancestors(needed, pw.pw_uid, pw.pw_gid)}
    for d, mode in opened.items():
        d.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)
    try:
        probe = subprocess.run(["runuser", "-u", USER, "--", "bwrap", "--unshare-user", "--unshare-net", "--ro-bind",
                                "/", "/", "true"], capture_output=True, text=True, timeout=60)
        if probe.returncode:
            pytest.skip(f"bubblewrap cannot start as an unprivileged user here (user namespaces off?): "
                        f"{probe.stderr.strip()}")
        yield USER, home
    finally:
        for d, mode in opened.items():
            d.chmod(stat.S_IMODE(mode))
        shutil.rmtree(home, ignore_errors=True)
        if created:
            subprocess.run(["userdel", USER], check=False, capture_output=True)


def as_user(unprivileged: tuple[str, Path], argv: list[str], *, cwd: Path, timeout: float,
            **env: str) -> subprocess.CompletedProcess:
    user, home = unprivileged
    (home / "tmp").mkdir(exist_ok=True)
    base = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(home), "TMPDIR": str(home / "tmp"),
            "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "OMP_WAIT_POLICY": "PASSIVE"}
    command = ["runuser", "-u", user, "--", "env", "-i", *(f"{k}={v}" for k, v in {**base, **env}.items()), *argv]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def test_the_local_attack_matrix_holds_as_an_unprivileged_user(unprivileged: tuple[str, Path]) -> None:
    """Every attack of tests/sandbox/test_attacks.py on the local backend (torchrun's LM entry aside: slow, as in the root
    run), with bubblewrap in a user namespace: the same verdicts as root's, and none of them skipped."""
    _, home = unprivileged
    r = as_user(unprivileged, [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-n", "0",
                               "tests/sandbox/test_attacks.py", "-k", "local", "-m", "not slow", "--basetemp",
                               str(home / "attacks")], cwd=REPO, timeout=900)
    summary = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|xfailed|xpassed|error)", summary)}
    assert counts.get("passed", 0) >= 40 and not counts.get("skipped"), summary


@pytest.mark.heavy  # ~3 min on the 2 shared cores
def test_a_short_workflow_runs_as_an_unprivileged_user(unprivileged: tuple[str, Path]) -> None:
    """One topic slot from topics to its verified environment (baseline, evaluator probes and a teacher episode in
    the sandbox), in a copy of the workflow the user owns, the local sandbox under bubblewrap in a user namespace."""
    user, home = unprivileged
    work = copy_workflow(home / "workflow", "rules", "report")
    (work / "run.yaml").write_text("topics: {n: 1}\nsandbox: {backend: local}\n")
    pw = pwd.getpwnam(user)
    for d, _dirs, files in os.walk(work):
        for p in [d, *(os.path.join(d, f) for f in files)]:
            os.chown(p, pw.pw_uid, pw.pw_gid)
    r = as_user(unprivileged, [sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", "config.yaml",
                               "run.yaml", "--", "environments"], cwd=work, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    reports = list((work / "results" / "environments").glob("*/report.json"))
    assert len(reports) == 1 and reports[0].stat().st_uid == pw.pw_uid
    assert "local sandbox without bubblewrap" not in r.stderr  # the weak fallback would say so, and be refused
