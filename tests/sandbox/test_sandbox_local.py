"""The local sandbox backend, against real processes (bubblewrap where it works)."""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator

import pytest
from pydantic import ValidationError

from gymforge.core.config import GymforgeConfig, SandboxConfig
from gymforge.sandbox import Limits, Mount, SandboxError, cgroups, disk, get_sandbox
from gymforge.sandbox.local import LocalBackend, _bwrap_works, _unshare_works
from gymforge.tasks.episode import EpisodeRunner

BWRAP = _bwrap_works()
needs_bwrap = pytest.mark.skipif(
    not BWRAP, reason="bubblewrap is missing or a trial run failed (apt-get install bubblewrap)"
)
CONFINEMENTS = [
    pytest.param("bwrap", marks=needs_bwrap),
    pytest.param("unshare-net", marks=pytest.mark.skipif(not _unshare_works(), reason="unshare needs root")),
    "none",
]
LIMITS = Limits(memory_mb=1024)


@pytest.fixture(params=CONFINEMENTS)
def backend(request: pytest.FixtureRequest) -> LocalBackend:
    return LocalBackend(request.param, allow_weak_confinement=request.param != "bwrap")


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    d = tmp_path / "ws"
    d.mkdir()
    return d


def survivors(marker: str) -> list[str]:
    """Host processes whose command line contains `marker`."""
    out = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


@pytest.fixture
def tcp_server() -> Iterator[tuple[int, list[object]]]:
    """A real TCP server on the host's 127.0.0.1; the list collects accepted connections."""
    srv = socket.create_server(("127.0.0.1", 0))
    accepted: list[object] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            accepted.append(conn)
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    yield srv.getsockname()[1], accepted
    srv.close()


def test_echo_exit_code_and_persistence(backend: LocalBackend, ws: Path) -> None:
    with backend.open(ws, limits=LIMITS) as s:
        r = s.run("echo hello; echo oops >&2", timeout=10)
        assert (r.output, r.exit_code, r.timed_out) == ("hello\noops\n", 0, False)
        assert s.run("exit 7", timeout=10).exit_code == 7  # the shell died; the next command restarts it
        assert s.run("false", timeout=10).exit_code == 1
        s.run("mkdir -p sub/dir && cd sub", timeout=10)
        inside = backend.workdir(ws)  # /workspace under bwrap, the host path otherwise
        assert s.run("pwd", timeout=10).output == f"{inside}/sub\n"
        assert s.cwd == f"{inside}/sub"
        s.run("export A=1; B=2", timeout=10)
        assert s.run('echo "$A $B"', timeout=10).output == "1 2\n"
        r = s.run("cat; python -c 'input()' 2>&1 | tail -1", timeout=10)  # stdin is /dev/null: no hang
        assert r.output == "EOFError: EOF when reading a line\n"
        assert s.run("printf 'a\\nb' && printf \"it's \\u00e9\\n\"", timeout=10).output == "a\nbit's \u00e9\n"


def test_timeout_kills_the_whole_tree_and_keeps_the_session(backend: LocalBackend, ws: Path) -> None:
    n = random.randrange(10**6)
    with backend.open(ws, limits=LIMITS) as s:
        s.run("cd / && export KEPT=yes && plain=also", timeout=10)
        r = s.run(f"sleep 1000.{n}1 & setsid sleep 1000.{n}2 & sleep 1000.{n}3", timeout=1)
        # well under the sleeps' 1000 s; the bound is loose because parallel test workers share the cores
        assert r.timed_out and r.exit_code == 137 and 1 <= r.duration_s < 30
        escaped = survivors(f"sleep 1000.{n}")
        if backend.confinement == "none":  # setsid escapes a process group; nothing else may survive
            assert [line for line in escaped if f"1000.{n}2" not in line] == []
            for line in escaped:
                os.kill(int(line.split()[0]), 9)
        else:
            assert escaped == []
        # bash may first report the death of its background jobs
        assert s.run('echo "$PWD $KEPT $plain"', timeout=10).output.endswith("/ yes also\n")


def test_stuck_shell_is_restarted_with_cwd_and_exports(ws: Path) -> None:
    backend = LocalBackend()
    with backend.open(ws, limits=LIMITS) as s:
        s.run("mkdir d && cd d && export KEPT=1 && plain=2", timeout=10)
        assert s.run("while :; do :; done", timeout=0.5).timed_out  # a builtin loop: the shell itself is busy
        assert s.run('echo "$PWD $KEPT ${plain:-lost}"', timeout=10).output == f"{backend.workdir(ws)}/d 1 lost\n"


def test_run_once_timeout_and_exit_code(backend: LocalBackend, ws: Path) -> None:
    n = random.randrange(10**6)
    r = backend.run_once(ws, ["bash", "-c", f"sleep 1000.{n} & sleep 1000.{n}"], timeout=1, limits=LIMITS)
    assert r.timed_out and r.exit_code == 137
    assert survivors(f"sleep 1000.{n}") == []
    r = backend.run_once(ws, ["python", "-c", "import sys; print('out'); sys.exit(3)"], timeout=30, limits=LIMITS)
    assert (r.output, r.exit_code, r.timed_out) == ("out\n", 3, False)


def test_memory_cpu_and_file_size_limits(backend: LocalBackend, ws: Path) -> None:
    r = backend.run_once(ws, ["python", "-c", "b = bytearray(3 << 30)"], timeout=30, limits=LIMITS)
    assert r.exit_code != 0 and "MemoryError" in r.output
    cpu = Limits(memory_mb=1024, cpu_seconds=1)
    r = backend.run_once(ws, ["python", "-c", "while True: pass"], timeout=30, limits=cpu)
    assert r.exit_code == 128 + 24 and not r.timed_out  # SIGXCPU
    small = Limits(memory_mb=1024, max_file_mb=1)
    r = backend.run_once(ws, ["python", "-c", "open('big', 'wb').write(bytes(2 << 20))"], timeout=30, limits=small)
    assert r.exit_code != 0 and "File too large" in r.output  # python ignores SIGXFSZ and gets EFBIG
    assert (ws / "big").stat().st_size <= 1 << 20


def test_output_is_capped(ws: Path) -> None:
    r = get_sandbox("local", max_output=1000).run_once(
        ws, ["python", "-c", "print('a' * 100_000 + 'END')"], timeout=30, limits=LIMITS
    )
    assert len(r.output) < 1100 and "bytes of output truncated" in r.output and r.output.endswith("END\n")


def test_secrets_never_enter(backend: LocalBackend, ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-value")
    monkeypatch.setenv("HF_TOKEN", "hf-secret-value")
    r = backend.run_once(ws, ["env"], timeout=30, limits=LIMITS, env={"SEED": "3", "TOKENIZERS_PARALLELISM": "false"})
    assert "secret-value" not in r.output and "SEED=3" in r.output and f"HOME={backend.workdir(ws)}" in r.output
    with pytest.raises(SandboxError, match="OPENAI_API_KEY"):
        backend.run_once(ws, ["true"], timeout=30, limits=LIMITS, env={"OPENAI_API_KEY": "sk"})


def test_limits_validation() -> None:
    with pytest.raises(ValidationError, match="memory_mb"):
        Limits(memory_mb=512)


def test_limits_come_from_the_sandbox_config() -> None:
    """Episodes get the configured limits (`Limits.from_config`), and `Limits()` is the default config's."""
    assert Limits() == Limits.from_config(SandboxConfig())
    configured = SandboxConfig(memory_mb=4096, cpu_seconds=77, max_processes=64, tmp_mb=32, disk_mb=128,
                               allow_weak_confinement=True)  # a host without bubblewrap builds the runner too
    cfg = GymforgeConfig(sandbox=configured)
    limits = EpisodeRunner.for_config(cfg, 0).limits
    assert limits == Limits.from_config(configured) == Limits(memory_mb=4096, cpu_seconds=77, max_processes=64,
                                                              tmp_mb=32, disk_mb=128)


@pytest.mark.parametrize(
    "confinement",
    [pytest.param("bwrap", marks=needs_bwrap), pytest.param("unshare-net", marks=CONFINEMENTS[1].marks)],
)
def test_no_network(confinement: str, ws: Path, tcp_server: tuple[int, list[object]]) -> None:
    port, accepted = tcp_server
    probe = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=5); print('connected')"
    backend = LocalBackend(confinement, allow_weak_confinement=True)  # type: ignore[arg-type]
    r = backend.run_once(ws, ["python", "-c", probe], timeout=30, limits=LIMITS)
    assert r.exit_code != 0 and "connected" not in r.output and accepted == []
    # The same probe reaches the server unconfined: the server is real.
    networked = LIMITS.model_copy(update={"network": True})
    r = LocalBackend("none", allow_weak_confinement=True).run_once(ws, ["python", "-c", probe], timeout=30, limits=networked)
    assert r.output == "connected\n" and len(accepted) == 1


@needs_bwrap
def test_files_outside_the_workspace_are_out_of_reach(ws: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    other = tmp_path_factory.mktemp("other")
    (other / "secret.txt").write_text("hidden answer")
    stdlib_file = Path(os.__file__).parent / "gymforge_sandbox_probe"
    with LocalBackend("bwrap").open(ws, limits=LIMITS) as s:
        assert s.run("cat /etc/shadow", timeout=10).exit_code != 0
        r = s.run(f"cat {other}/secret.txt; ls {other}", timeout=10)
        assert r.exit_code != 0 and "hidden answer" not in r.output
        assert s.run(f"echo x > {other}/new.txt", timeout=10).exit_code != 0
        assert s.run(f"echo x > {stdlib_file}", timeout=10).exit_code != 0
        assert s.run("echo x > /usr/probe", timeout=10).exit_code != 0
        assert s.run("echo mine > mine.txt && echo x > /tmp/scratch && cat /tmp/scratch", timeout=10).output == "x\n"
    assert not (other / "new.txt").exists() and not stdlib_file.exists()
    assert (ws / "mine.txt").read_text() == "mine\n"


@needs_bwrap
def test_read_only_mounts(ws: Path, tmp_path: Path) -> None:
    host = tmp_path / "evaluate.py"
    host.write_text("print('{\"score\": 1.0}')\n")
    answers = tmp_path / "answers"
    answers.mkdir()
    (answers / "labels.csv").write_text("id,label\n")
    mounts = [Mount(host=host, target="evaluate.py"), Mount(host=answers, target="data/answers")]
    backend = LocalBackend("bwrap")
    with backend.open(ws, limits=LIMITS, mounts=mounts) as s:
        assert s.run("python evaluate.py", timeout=30).output == '{"score": 1.0}\n'
        attacks = ["echo x >> evaluate.py", "rm -f evaluate.py", "mv evaluate.py e.py", "chmod u+w evaluate.py"]
        attacks += ["echo 1,1 >> data/answers/labels.csv", "rm data/answers/labels.csv", "touch data/answers/new"]
        for attack in attacks:
            r = s.run(attack, timeout=10)
            assert r.exit_code != 0, (attack, r.output)
        assert s.run("cat data/answers/labels.csv", timeout=10).output == "id,label\n"
    assert host.read_text() == "print('{\"score\": 1.0}')\n" and os.listdir(answers) == ["labels.csv"]
    assert list(ws.iterdir()) == []  # mount points made for the session are gone
    outside = [Mount(host=answers / "labels.csv", target="/data/x.txt")]  # an absolute target
    r = backend.run_once(ws, ["cat", "/data/x.txt"], timeout=30, limits=LIMITS, mounts=outside)
    assert r.output == "id,label\n"


@pytest.mark.parametrize("confinement", CONFINEMENTS)
def test_a_mount_hides_what_the_workspace_holds_at_its_target_until_the_sandbox_ends(
        ws: Path, tmp_path: Path, confinement: str) -> None:
    """A task's data folder is mounted where the workspace already has one (a scorer's copy of the task): the
    sandbox sees the mounted files only, and the workspace's own come back unchanged afterwards, whether the
    mount is a bind mount (bwrap) or a link (weak confinement)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "train.csv").write_text("x,y\n")
    (ws / "data").mkdir()
    (ws / "data" / "own.txt").write_text("mine\n")
    backend = LocalBackend(confinement, allow_weak_confinement=confinement != "bwrap")  # type: ignore[arg-type]
    r = backend.run_once(ws, ["ls", "data"], timeout=30, limits=LIMITS, mounts=[Mount(host=shared, target="data")])
    assert r.exit_code == 0 and r.output.split() == ["train.csv"], r
    assert sorted(p.name for p in ws.iterdir()) == ["data"] and not (ws / "data").is_symlink()
    assert (ws / "data" / "own.txt").read_text() == "mine\n" and os.listdir(shared) == ["train.csv"]


@needs_bwrap
def test_process_limit_bounds_a_fork_bomb(ws: Path) -> None:
    limits = Limits(memory_mb=1024, max_processes=32)
    count = """
import os, time
n = 0
try:
    for _ in range(200):
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        n += 1
except OSError:
    pass
print(n)
"""
    r = LocalBackend("bwrap").run_once(ws, ["python", "-c", count], timeout=30, limits=limits)
    # As root the sandbox has a uid of its own; otherwise the bound is approximate (tasks the user had + 32).
    assert 0 < int(r.output) < 48
    with LocalBackend("bwrap").open(ws, limits=limits) as s:
        assert s.run("bomb() { bomb | bomb & }; bomb; sleep 5", timeout=2).timed_out
        assert s.run("echo alive", timeout=30).output == "alive\n"
        assert int(s.run("ls /proc | grep -c '^[0-9]'", timeout=30).output) <= 5  # the bomb is gone


def test_session_can_still_write_after_a_one_shot_run(backend: LocalBackend, ws: Path) -> None:
    """An agent's validate runs the evaluation as a one-shot process on its workspace; its shell must keep
    write access afterwards (each workspace has one sandbox uid)."""
    with backend.open(ws, limits=Limits()) as session:
        assert session.run("touch before", timeout=10).exit_code == 0
        assert backend.run_once(ws, ["touch", "during"], timeout=10, limits=Limits()).exit_code == 0
        assert session.run("touch after && echo written", timeout=10).output.strip() == "written"


@pytest.mark.parametrize("confinement", ["unshare-net", "none"])
def test_weak_confinement_is_refused_unless_allowed(confinement: str) -> None:
    with pytest.raises(SandboxError, match="apt-get install bubblewrap.*allow_weak_confinement"):
        LocalBackend(confinement)  # type: ignore[arg-type]


needs_cgroups = pytest.mark.skipif(not __import__("gymforge.sandbox.cgroups").sandbox.cgroups.available(),
                                   reason="no writable memory and pids cgroups on this host")


@needs_bwrap
@needs_cgroups
def test_memory_is_bounded_for_the_whole_sandbox_not_per_process(ws: Path) -> None:
    """Four processes of 400 MiB each stay under the 1 GiB address-space rlimit but not under the group's 1 GiB."""
    hold = "import time; b = bytearray(400 << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(6)"
    with LocalBackend("bwrap").open(ws, limits=LIMITS) as s:
        r = s.run(" & ".join([f"python -c {hold!r}"] * 4) + "; wait", timeout=60)
        assert r.limit is not None and r.limit.startswith("memory: 1024 MiB"), r
        assert s.run("echo alive", timeout=10).output.strip() == "alive"  # the session goes on


@needs_bwrap
def test_tmp_is_sized_and_the_workspace_disk_is_capped(ws: Path) -> None:
    limits = Limits(memory_mb=1024, tmp_mb=16, disk_mb=32)
    with LocalBackend("bwrap").open(ws, limits=limits) as s:
        r = s.run("head -c 32M /dev/zero > /tmp/big; echo rc=$?", timeout=30)
        assert "No space left" in r.output and "rc=1" in r.output
        r = s.run("while true; do head -c 4M /dev/zero > f$RANDOM$RANDOM; done", timeout=60)
        named = "disk: the workspace is full (32 MiB" if disk.available() else "disk: the workspace holds more than 32 MiB"
        assert r.limit is not None and r.limit.startswith(named), r
        assert not r.timed_out and r.duration_s < 30
        assert s.run("rm -f f*; echo ok", timeout=10).output.strip() == "ok"


@needs_bwrap
@pytest.mark.skipif(not disk.available(), reason="no file system of its own for a workspace here (needs root, "
                    "mkfs.ext4 and loop devices): the cap is polled")
def test_the_workspace_is_a_file_system_of_its_own_while_a_sandbox_is_open(ws: Path) -> None:
    """A hard cap: writes past disk_mb fail at once, however fast; the files are the same on the host while the
    sandbox runs and come back to a plain directory (links, hard links, modes kept) when the last one closes."""
    (ws / "sub").mkdir(mode=0o700)
    (ws / "sub" / "a.txt").write_text("a\n")
    os.link(ws / "sub" / "a.txt", ws / "hard.txt")
    os.symlink("/etc/passwd", ws / "out")
    os.mkfifo(ws / "fifo")
    limits = Limits(memory_mb=1024, disk_mb=32)
    backend = LocalBackend("bwrap")
    with backend.open(ws, limits=limits) as s:
        assert os.path.ismount(ws)
        r = s.run("fallocate -l 200M big; echo rc=$?; head -c 200M /dev/zero > big2; du -sm . | cut -f1", timeout=30)
        assert "No space left" in r.output and int(r.output.split()[-1]) <= 48, r.output
        assert r.limit is not None and r.limit.startswith("disk: the workspace is full"), r
        assert s.run("rm -f big big2; echo made > new.txt; cat sub/a.txt", timeout=10).output == "a\n"
        assert (ws / "new.txt").read_text() == "made\n"  # the host sees the sandbox's files at once
        mountinfo = s.run("cat /proc/self/mountinfo", timeout=10).output
        assert str(ws) not in mountinfo and " / /workspace " in mountinfo, mountinfo
        # A run on the same workspace while the session is open shares its file system.
        r = backend.run_once(ws, ["bash", "-c", "echo once > once.txt; df -m . | tail -1"], timeout=30, limits=limits)
        assert r.exit_code == 0 and os.path.ismount(ws) and (ws / "once.txt").exists(), r.output
        assert s.run("cat once.txt", timeout=10).output == "once\n"
    assert not os.path.ismount(ws)
    assert sorted(p.name for p in ws.parent.iterdir()) == ["ws"], "something was left beside the workspace"
    assert sorted(os.listdir(ws)) == ["fifo", "hard.txt", "new.txt", "once.txt", "out", "sub"]
    assert os.readlink(ws / "out") == "/etc/passwd" and (ws / "sub").stat().st_mode & 0o777 == 0o700
    assert os.path.samefile(ws / "hard.txt", ws / "sub" / "a.txt")
    assert (ws / "new.txt").stat().st_uid == (ws / "sub").stat().st_uid  # the sandbox's uid, kept
    # A one-shot run on its own mounts and gives back too; a read-only one needs no file system.
    r = backend.run_once(ws, ["bash", "-c", "head -c 100M /dev/zero > z; echo rc=$?"], timeout=30, limits=limits)
    assert "rc=1" in r.output and (ws / "z").stat().st_size <= 48 << 20 and not os.path.ismount(ws), r.output


@needs_bwrap
def test_no_host_path_in_the_sandbox_environment(ws: Path) -> None:
    r = LocalBackend("bwrap").run_once(ws, ["bash", "-c", "env; ps -ef; pwd"], timeout=30, limits=LIMITS)
    assert r.exit_code == 0, r.output
    assert str(ws) not in r.output and str(Path.cwd()) not in r.output and "/opt/venv/bin" in r.output


@needs_bwrap
def test_torch_in_the_sandbox_gets_the_jobs_cores_not_the_machines(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two 1-core Snakemake jobs on 2 cores: each sandbox's fine-tune or generation runs 1 torch thread, not 2."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # what Snakemake exports for a job of 1 thread
    r = LocalBackend("bwrap").run_once(ws, ["bash", "-c", "echo $GYMFORGE_TORCH_THREADS $OMP_WAIT_POLICY"],
                                       timeout=30, limits=LIMITS)
    assert r.output.split() == ["1", "PASSIVE"], r.output
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    r = LocalBackend("bwrap").run_once(ws, ["bash", "-c", "echo $GYMFORGE_TORCH_THREADS"], timeout=30, limits=LIMITS)
    assert r.output.split() == ["3"], r.output


@needs_bwrap
def test_the_sandbox_resolves_its_own_hostname_and_none_of_the_hosts(ws: Path) -> None:
    """torchrun's c10d store looks up the sandbox's hostname: it must resolve (to loopback), from a hosts file of
    the sandbox's own that names nothing of the host."""
    host = socket.gethostname()
    r = LocalBackend("bwrap").run_once(ws, ["bash", "-c", "hostname; getent hosts $(hostname) || echo UNRESOLVED; cat /etc/hosts"],
                                       timeout=30, limits=LIMITS)
    lines = r.output.splitlines()
    assert lines[0] == "sandbox" and "UNRESOLVED" not in r.output, r.output
    assert lines[1].split()[0] in ("127.0.0.1", "::1") and lines[1].split()[-1] == "sandbox", r.output
    assert host == "sandbox" or host not in r.output.split(), r.output


@needs_bwrap
def test_torchrun_standalone_starts_in_the_sandbox(ws: Path) -> None:
    pytest.importorskip("torch")
    (ws / "probe.py").write_text("import os\nprint('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'])\n")
    r = LocalBackend("bwrap").run_once(ws, ["torchrun", "--nproc_per_node=1", "--standalone", "probe.py"],
                                       timeout=180, limits=Limits(memory_mb=4096))
    assert r.exit_code == 0 and "rank 0 of 1" in r.output, r.output[-2000:]


@needs_bwrap
@pytest.mark.skipif(not disk.available(), reason="no file system of its own for a workspace here")
def test_a_killed_runs_capped_workspace_is_swept_when_a_backend_is_made(tmp_path: Path) -> None:
    """kill -9 of the process that holds a workspace on its own file system leaves the mount; the next backend
    made (a rerun) unmounts it, so the run directory can be removed and made again."""
    ws = tmp_path / "run" / "workspace"
    ws.mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from gymforge.sandbox import Limits, "
         "get_sandbox; s = get_sandbox('local').open(Path(sys.argv[1]), limits=Limits(disk_mb=64)); "
         "print('open', flush=True); time.sleep(600)", str(ws)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        assert os.path.ismount(ws)
    finally:
        holder.kill()
        holder.wait()
    assert os.path.ismount(ws)  # left behind
    LocalBackend("bwrap")
    assert not os.path.ismount(ws)
    shutil.rmtree(tmp_path / "run")
    ws.mkdir(parents=True)


@needs_bwrap
def test_a_gpu_sandbox_has_no_address_space_cap_but_its_group_still_bounds_memory(ws: Path) -> None:
    """CUDA reserves more address space than any sensible cap: a sandbox given GPUs gets no `ulimit -v`, one without
    GPUs keeps it; memory that is really used stays bounded by the sandbox's cgroup either way."""
    reserve = "import mmap; m = mmap.mmap(-1, 3 << 30); print('reserved')"  # address space only, never touched
    plain = LocalBackend("bwrap").run_once(ws, ["bash", "-c", f"ulimit -v; python -c {reserve!r}"], timeout=60,
                                           limits=LIMITS)
    assert plain.output.splitlines()[0] == str(1024 * 1024) and "reserved" not in plain.output
    gpu = LocalBackend("bwrap", gpus=True)
    r = gpu.run_once(ws, ["bash", "-c", f"ulimit -v; python -c {reserve!r}"], timeout=60, limits=LIMITS)
    assert r.output.split() == ["unlimited", "reserved"], r.output
    if cgroups.available():
        touch = "b = bytearray(2 << 30); b[::4096] = b'x' * len(b[::4096]); print('survived')"
        r = gpu.run_once(ws, ["python", "-c", touch], timeout=60, limits=LIMITS)
        assert "survived" not in r.output and r.limit is not None and r.limit.startswith("memory: 1024 MiB"), r
