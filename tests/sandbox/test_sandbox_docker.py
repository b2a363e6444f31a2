"""The docker sandbox backend, against a real daemon started by scripts/docker_sandbox.sh."""

from __future__ import annotations

import random
import socket
import subprocess
from pathlib import Path

import pytest

from gymforge.sandbox import Limits, Mount, get_sandbox
from gymforge.sandbox.docker import DockerBackend

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "docker_sandbox.sh"
LIMITS = Limits(memory_mb=1024)


@pytest.fixture(scope="session")
def docker_backend() -> DockerBackend:
    pytest.importorskip("docker", reason="the docker SDK is not installed")
    # First run: installs packages, runs debootstrap and builds the image (~2 min); then ~0.1 s.
    r = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        pytest.skip(f"no docker daemon: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}")
    host = r.stdout.strip().splitlines()[-1].removeprefix("DOCKER_HOST=")
    backend = get_sandbox("docker", base_url=host)
    assert isinstance(backend, DockerBackend)
    return backend


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    d = tmp_path / "ws"
    d.mkdir()
    return d


def test_setup_runs_again_while_its_daemon_runs(docker_backend: DockerBackend) -> None:
    # Every test module that needs the daemon calls the script; a daemon that inherited the setup lock made the
    # second call wait forever.
    r = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1].startswith("DOCKER_HOST=unix://")


def test_echo_and_persistence(docker_backend: DockerBackend, ws: Path) -> None:
    with docker_backend.open(ws, limits=LIMITS) as s:
        r = s.run("echo hello; echo oops >&2", timeout=30)
        assert (r.output, r.exit_code, r.timed_out) == ("hello\noops\n", 0, False)
        assert s.run("exit 4", timeout=30).exit_code == 4
        s.run("mkdir sub && cd sub && export A=1", timeout=30)
        assert s.run('echo "$PWD $A"', timeout=30).output == "/workspace/sub 1\n"
        assert s.cwd == "/workspace/sub"
        s.run("echo made > here.txt; python -c 'input()' > /dev/null 2>&1", timeout=30)
    assert (ws / "sub" / "here.txt").read_text() == "made\n"  # bind-mounted, not copied


def test_timeout_kills_everything_but_the_shell(docker_backend: DockerBackend, ws: Path) -> None:
    n = random.randrange(10**6)
    with docker_backend.open(ws, limits=LIMITS) as s:
        s.run("cd / && export KEPT=yes", timeout=30)
        r = s.run(f"sleep 1000.{n} & setsid sleep 1000.{n} & sleep 1000.{n}", timeout=1)
        assert r.timed_out and r.exit_code == 137
        # bash may first report the jobs it saw killed ("... Killed  sleep ..."); the count is the last line
        assert s.run(f"ps -eo args | grep -c '^sleep 1000.{n}'", timeout=30).output.splitlines()[-1] == "0"
        assert s.run('echo "$PWD $KEPT"', timeout=30).output.endswith("/ yes\n")
    r = docker_backend.run_once(ws, ["sleep", "1000"], timeout=1, limits=LIMITS)
    assert r.timed_out and r.exit_code == 137


def test_network_none(docker_backend: DockerBackend, ws: Path) -> None:
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    probe = (
        "import os, socket\nprint(sorted(os.listdir('/sys/class/net')))\n"
        f"for addr in [('127.0.0.1', {port}), ('10.0.0.1', 80)]:\n"
        "    try:\n        socket.create_connection(addr, timeout=3)\n        print('connected', addr)\n"
        "    except OSError as e:\n        print('refused', type(e).__name__)\n"
    )
    r = docker_backend.run_once(ws, ["python", "-c", probe], timeout=60, limits=LIMITS)
    srv.close()
    assert r.output.splitlines()[0] == "['lo']" and "connected" not in r.output, r.output


def test_memory_limit_oom(docker_backend: DockerBackend, ws: Path) -> None:
    alloc = ["python", "-c", "b = bytearray(3 << 30); print('allocated')"]
    r = docker_backend.run_once(ws, alloc, timeout=120, limits=LIMITS)
    assert r.exit_code == 137 and not r.timed_out and "out of memory" in r.output and "allocated" not in r.output
    with docker_backend.open(ws, limits=LIMITS) as s:
        r = s.run(" ".join(alloc[:2]) + ' "b = bytearray(3 << 30)"', timeout=120)
        assert r.exit_code == 137 and "Killed" in r.output
        assert s.run("echo alive", timeout=30).output == "alive\n"


def test_read_only_mount_and_secrets(
    docker_backend: DockerBackend, ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-value")
    host = tmp_path / "evaluate.py"
    host.write_text("print(1)\n")
    with docker_backend.open(ws, limits=LIMITS, mounts=[Mount(host=host, target="evaluate.py")]) as s:
        assert s.run("python evaluate.py", timeout=30).output == "1\n"
        assert s.run("echo x >> evaluate.py", timeout=30).exit_code != 0
        assert "secret-value" not in s.run("env", timeout=30).output
    assert host.read_text() == "print(1)\n" and list(ws.iterdir()) == []


def test_a_run_within_a_session_shares_its_memory_limit(docker_backend: DockerBackend, ws: Path) -> None:
    """The session holds 700 MiB; a run within it (an evaluation's submission) asks for 700 MiB more under the
    same 1 GiB: both cannot hold at once, and the episode's group is gone after the session."""
    from gymforge.sandbox import cgroups

    if not cgroups.available():
        pytest.skip("no writable cgroup here: each container has its own limit")
    hold = "import time; b = b'x' * (700 << 20); open('holding', 'w').close(); time.sleep(60)"
    with docker_backend.open(ws, limits=LIMITS) as s:
        parent = s.cgroup_parent  # type: ignore[attr-defined]
        assert s.run("cat /proc/self/cgroup", timeout=30).output.count(parent.path + "/") >= 1
        s.run(f'(nohup python -c "{hold}" > /dev/null 2>&1 &); for i in $(seq 100); do [ -e holding ] && break; '
              "sleep 0.1; done", timeout=30)
        assert (ws / "holding").exists()
        r = docker_backend.run_once(ws, ["python", "-c", "b = b'x' * (700 << 20); print('got it')"], timeout=60,
                                    limits=LIMITS, read_only=True, within=s)
        alive = "HOLDER" in s.run("pgrep -f 'time.sleep.60' > /dev/null && echo HOLDER", timeout=30).output
        assert not ("got it" in r.output and alive), "the session and the run held 1400 MiB under a 1024 MiB limit"
    assert not (parent.group.memory.exists() or parent.group.pids.exists())


def test_a_keeper_forked_late_is_waited_for(docker_backend: DockerBackend) -> None:
    # Docker reports a container running before its init has forked the keeper; on a loaded host the first look
    # at PID 1's children found none and opening the session failed. Here PID 1 forks only after a second.
    from gymforge.sandbox.docker import _keeper

    late = "import os, time; time.sleep(1); os.fork() or time.sleep(600); time.sleep(600)"
    container = docker_backend.client.containers.run(
        docker_backend.image, ["python", "-c", late], detach=True, network_mode="none", user=docker_backend.user)
    try:
        pid = _keeper(container, docker_backend.user)
        r = container.exec_run(["cat", f"/proc/{pid}/stat"], user=docker_backend.user)
        assert r.exit_code == 0 and r.output.split()[3] == b"1"  # a child of PID 1
    finally:
        container.remove(force=True)
