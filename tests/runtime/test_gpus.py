"""gymforge.runtime.gpus: lock-based GPU leases and `with-gpus` (no GPU needed: GYMFORGE_GPUS fakes the count)."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from gymforge.runtime import gpus
from gymforge.runtime.gpus import GpuError, GpuTimeout, lease, with_gpus


@pytest.fixture
def four_gpus(tmp_path, monkeypatch):
    monkeypatch.setenv("GYMFORGE_GPUS", "4")
    monkeypatch.setenv("GYMFORGE_GPU_LOCKS", str(tmp_path / "locks"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    return tmp_path / "locks"


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "SLURM_JOB_ID")}
    env.update(extra)
    return env


def test_two_concurrent_leases_get_disjoint_ids(four_gpus):
    with lease(2, timeout_s=2) as a, lease(2, timeout_s=2) as b:
        assert len(a) == len(b) == 2
        assert not set(a) & set(b)
        assert set(a) | set(b) == {"0", "1", "2", "3"}
        assert sorted(p.name for p in four_gpus.iterdir()) == [f"gpu{i}.lock" for i in range(4)]


def test_third_lease_waits_until_one_is_released(four_gpus):
    got: dict[str, object] = {}

    def third():
        started = time.monotonic()
        with lease(2, timeout_s=20, poll_s=0.05) as ids:
            got["ids"], got["waited"] = ids, time.monotonic() - started

    first = lease(2)
    a = first.__enter__()
    with lease(2) as b:
        thread = threading.Thread(target=third)
        thread.start()
        time.sleep(0.6)
        assert thread.is_alive() and "ids" not in got  # all four devices are taken
        first.__exit__(None, None, None)
        thread.join(10)
        assert not thread.is_alive()
        assert sorted(got["ids"]) == sorted(a)  # exactly the released pair, never one of b's
        assert not set(got["ids"]) & set(b)
        assert got["waited"] >= 0.5


def test_timeout_and_too_many_fail_clearly(four_gpus):
    with lease(4):
        with pytest.raises(GpuTimeout, match="within 0.3 s"):
            with lease(1, timeout_s=0.3, poll_s=0.05):
                pass
    with pytest.raises(GpuError, match="asked for 5 GPUs but only 4 exist") as err:
        with lease(5, timeout_s=1):
            pass
    assert "GYMFORGE_GPUS" in str(err.value)


def test_partial_sets_are_not_held_while_waiting(four_gpus):
    """A waiter for 3 devices must not sit on the 2 free ones: a 2-device lease still gets them."""
    holder = lease(2)
    holder.__enter__()
    stop = threading.Event()

    def greedy():
        with pytest.raises(GpuTimeout):
            with lease(3, timeout_s=1.5, poll_s=0.01):
                pass
        stop.set()

    thread = threading.Thread(target=greedy)
    thread.start()
    try:
        successes = 0
        for _ in range(20):
            try:
                with lease(2, timeout_s=0.5, poll_s=0.01):
                    successes += 1
            except GpuTimeout:
                pass
        assert successes >= 15
    finally:
        thread.join(10)
        holder.__exit__(None, None, None)
    assert stop.is_set()


def test_sigkilled_holder_frees_its_devices(four_gpus):
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""
            import sys, time
            from gymforge.runtime.gpus import lease
            with lease(3) as ids:
                print(",".join(ids), flush=True)
                time.sleep(120)
        """)],
        stdout=subprocess.PIPE, text=True, env=child_env(GYMFORGE_GPUS="4", GYMFORGE_GPU_LOCKS=str(four_gpus)))
    try:
        held = holder.stdout.readline().strip().split(",")
        assert len(held) == 3
        with pytest.raises(GpuTimeout):
            with lease(2, timeout_s=0.3, poll_s=0.05):
                pass
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        with lease(4, timeout_s=5, poll_s=0.05) as ids:
            assert sorted(ids) == ["0", "1", "2", "3"]
    finally:
        holder.kill()
        holder.wait()


def run_with_gpus(*args: str, timeout: float = 30, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gymforge.runtime.gpus", *args], capture_output=True, text=True,
                          timeout=timeout, env=child_env(**env))


def test_with_gpus_sets_devices_and_forwards_exit_code(four_gpus):
    env = {"GYMFORGE_GPUS": "4", "GYMFORGE_GPU_LOCKS": str(four_gpus)}
    proc = run_with_gpus("2", "--", "sh", "-c", 'echo "[$CUDA_VISIBLE_DEVICES]"; exit 7', **env)
    assert proc.returncode == 7, proc.stderr
    assert proc.stdout.strip() == "[0,1]"
    assert "CUDA_VISIBLE_DEVICES='0,1'" in proc.stderr
    # The exec'd command holds the locks itself: while it runs nobody else gets its devices.
    with lease(2, timeout_s=2) as mine:
        sleeper = subprocess.Popen([sys.executable, "-m", "gymforge.runtime.gpus", "2", "--", "sh", "-c",
                                    'echo "$CUDA_VISIBLE_DEVICES"; exec sleep 60'],
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=child_env(**env))
        try:
            theirs = sleeper.stdout.readline().strip().split(",")
            assert len(theirs) == 2 and not set(theirs) & set(mine)
            proc = run_with_gpus("--timeout", "0.3", "1", "--", "true", **env)
            assert proc.returncode == 1 and "became free within 0.3 s" in proc.stderr
        finally:
            sleeper.kill()
            sleeper.wait()
        proc = run_with_gpus("--timeout", "5", "2", "--", "sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES"', **env)
        assert proc.returncode == 0 and sorted(proc.stdout.strip().split(",")) == sorted(theirs)
    # n = 0: the command sees no GPU at all.
    proc = run_with_gpus("0", "--", "sh", "-c", 'echo "[${CUDA_VISIBLE_DEVICES-unset}]"', **env)
    assert (proc.returncode, proc.stdout.strip()) == (0, "[]")
    # Clear failures: too many GPUs, no command, a command that does not exist.
    proc = run_with_gpus("5", "--", "true", **env)
    assert proc.returncode == 1 and "asked for 5 GPUs but only 4 exist" in proc.stderr
    assert run_with_gpus("1", "--", **env).returncode == 2
    assert run_with_gpus("1", "--", "/nonexistent/cmd", **env).returncode == 127


def test_with_gpus_supervised_mode_forwards_exit_code_and_signals(four_gpus, tmp_path):
    code = with_gpus(1, [sys.executable, "-c", "import os, sys; sys.exit(int(os.environ['CUDA_VISIBLE_DEVICES']) + 40)"],
                     replace_process=False, quiet=True)
    assert code == 40
    # The lease ended with the child.
    with lease(4, timeout_s=1):
        pass
    # A SIGTERM to the supervisor reaches the child, whose exit code comes back.
    script = textwrap.dedent("""
        import sys
        from gymforge.runtime.gpus import with_gpus
        sys.exit(with_gpus(1, [sys.executable, "-c",
            "import signal, sys, time\\n"
            "signal.signal(signal.SIGTERM, lambda *a: sys.exit(42))\\n"
            "print('ready', flush=True)\\n"
            "time.sleep(60)"], replace_process=False, quiet=True))
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            env=child_env(GYMFORGE_GPUS="4", GYMFORGE_GPU_LOCKS=str(four_gpus)))
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 42
    finally:
        proc.kill()
        proc.wait()


def test_preset_visible_devices_are_the_pool(four_gpus, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    with lease(1, timeout_s=1) as a, lease(1, timeout_s=1) as b:
        assert sorted(a + b) == ["3", "5"]
        with pytest.raises(GpuTimeout):
            with lease(1, timeout_s=0.2, poll_s=0.05):
                pass
    # Outside a scheduler even "all of them" is locked: two jobs never share a device.
    with lease(2, timeout_s=1) as ids:
        assert sorted(ids) == ["3", "5"]
        with pytest.raises(GpuTimeout):
            with lease(2, timeout_s=0.2, poll_s=0.05):
                pass
    # Inside a SLURM job holding exactly n devices: passed through as the scheduler gave them, no locks.
    monkeypatch.setenv("SLURM_JOB_ID", "123")
    with lease(2) as ids, lease(2) as again:
        assert ids == again == ["3", "5"]
    assert not (four_gpus / "job-123").exists()
    # ... holding more than a step needs: locked among the job's own ids, in a per-job directory.
    with lease(1, timeout_s=1) as a, lease(1, timeout_s=1) as b:
        assert sorted(a + b) == ["3", "5"]
    assert sorted(p.name for p in (four_gpus / "job-123").iterdir()) == ["gpu3.lock", "gpu5.lock"]
    monkeypatch.delenv("SLURM_JOB_ID")
    with pytest.raises(GpuError, match="only 2 exist"):
        with lease(3):
            pass
    proc = run_with_gpus("1", "--", "sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES"', CUDA_VISIBLE_DEVICES="3,5",
                         GYMFORGE_GPU_LOCKS=str(four_gpus))
    assert proc.returncode == 0 and proc.stdout.strip() in ("3", "5")


def test_device_sources(monkeypatch, tmp_path):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gpus.device_total({"GYMFORGE_GPUS": "8"}) == (8, "GYMFORGE_GPUS")
    with pytest.raises(GpuError, match="whole number"):
        gpus.device_total({"GYMFORGE_GPUS": "many"})
    assert gpus.visible_devices({}) is None
    assert gpus.visible_devices({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert gpus.visible_devices({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}) == []
    assert gpus.visible_devices({"CUDA_VISIBLE_DEVICES": "2, 0,-1,1"}) == ["2", "0"]
    assert gpus.visible_devices({"CUDA_VISIBLE_DEVICES": "GPU-ab12,GPU-cd34"}) == ["GPU-ab12", "GPU-cd34"]
    # Inside a SLURM job each job sees its own GPUs from 0: locks are scoped to the job.
    env = {"GYMFORGE_GPU_LOCKS": str(tmp_path), "SLURM_JOB_ID": "17", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert gpus.default_lock_dir(env) == tmp_path / "job-17"
    assert gpus.default_lock_dir({"GYMFORGE_GPU_LOCKS": str(tmp_path)}) == tmp_path
    assert gpus.default_lock_dir({}) == gpus.Path(gpus.DEFAULT_LOCK_DIR)
    assert gpus.gpu_count({"GYMFORGE_GPUS": "5"}) == 5
    # n = 0 never needs a device count (no nvidia-smi or torch probe).
    with lease(0, total=0) as ids:
        assert ids == []
    with lease(2, total=2, lock_dir=tmp_path / "l") as ids:
        assert ids == ["0", "1"]


def test_torch_is_asked_only_where_an_nvidia_driver_is_loaded(monkeypatch, tmp_path):
    """Without nvidia-smi the count falls back to torch, but only on a host with the driver: elsewhere torch
    could find no GPU, and importing it costs seconds."""
    fake_torch = type(sys)("torch")
    fake_torch.cuda = type(sys)("torch.cuda")
    fake_torch.cuda.device_count = lambda: 2
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    monkeypatch.setattr(gpus.shutil, "which", lambda name: None)  # no nvidia-smi
    monkeypatch.setattr(gpus, "NVIDIA_DRIVER", tmp_path / "no-driver")
    assert gpus.device_total({})[0] == gpus.gpu_count({}) == 0
    monkeypatch.setattr(gpus, "NVIDIA_DRIVER", tmp_path)
    assert gpus.device_total({}) == (2, "torch.cuda.device_count()") and gpus.gpu_count({}) == 2
