"""`gymforge preflight`: what a node must allow before jobs run there, checked on that node (a compute node, in a job
of the partition the run will use), one line per check.

- `sandbox`: the configured sandbox starts a process (locally: bubblewrap, which without root needs unprivileged
  user namespaces) and confines it to its view.
- `cgroups`: a cgroup subtree with the memory and pids controllers is writable here, so each sandbox's memory and
  tasks are bounded as a whole (without it: per process only, and a GPU sandbox only by the job's allocation).
- `cuda`: under the sandbox's limits, with the job's GPUs, CUDA initializes (skipped where this host has none).
- `sandbox-network`: code in the sandbox reaches neither a port on this host's loopback nor the teacher.
- `teacher`: this host reaches the configured teacher endpoint (a TCP connection within a few seconds).
- `hub`: this host reaches the Hugging Face hub, or the hub is off (`HF_HUB_OFFLINE=1`: jobs read what was fetched
  before); unreachable is a warning, since compute nodes often have no internet.
- `ledger-locks`: flock on the results directory holds for every process of the run (`gymforge.runtime.sharedfs`).

Exit status 1 when a check fails; `warn` and `skip` lines do not fail. `--json` prints the same as a list.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

from gymforge.runtime import sharedfs
from gymforge.core.config import GymforgeConfig, config_or_defaults
from gymforge.sandbox import Limits, SandboxBackend, SandboxError
from gymforge.sandbox import cgroups
from gymforge.tasks.episode import sandbox_for

CONNECT_TIMEOUT_S = 5.0
HUB_URL = "https://huggingface.co"


@dataclass
class Check:
    name: str
    status: str  # ok | warn | skip | fail
    detail: str


def _reachable(host: str, port: int, timeout: float = CONNECT_TIMEOUT_S) -> str | None:
    """None when a TCP connection to host:port opens within `timeout`, else why not."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as err:
        return f"{type(err).__name__}: {err}"


def _host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)


def _teacher_url(cfg: GymforgeConfig) -> str | None:
    teacher = cfg.llm.teacher
    if teacher.provider == "offline":
        return None
    return teacher.base_url or os.environ.get("OPENAI_BASE_URL")


def check_sandbox(cfg: GymforgeConfig, work: Path) -> tuple[Check, SandboxBackend | None]:
    try:
        backend = sandbox_for(cfg, 0)
        r = backend.run_once(work, ["id", "-u"], timeout=60, limits=Limits.from_config(cfg.sandbox))
    except SandboxError as err:
        return Check("sandbox", "fail", str(err)), None
    if r.exit_code:
        return Check("sandbox", "fail", f"a trivial command exited {r.exit_code}: {' '.join(r.output.split())[:300]}"), None
    how = getattr(backend, "confinement", backend.name)
    mode = "as root (each sandbox switches to a uid of its own)" if os.geteuid() == 0 else \
        "without root (in a user namespace)" if how == "bwrap" else "without root"
    uid = r.output.strip()
    return Check("sandbox", "ok", f"the {backend.name} sandbox ({how}) starts {mode}; its code runs as uid {uid}"), backend


def check_cgroups() -> Check:
    if not cgroups.available():
        return Check("cgroups", "warn", "no writable cgroup with the memory and pids controllers: sandbox memory is "
                     "bounded per process only, and a GPU sandbox's only by the job's allocation (ask for cgroup v2 "
                     "delegation: systemd Delegate=yes, or SLURM's cgroup plugin with a delegated subtree)")
    try:
        group = cgroups.SandboxGroup(1024, 64)
        group.remove()
    except OSError as err:
        return Check("cgroups", "fail", f"a sandbox group could not be made and removed: {err}")
    where = sorted({str(p.parent) for p in group.dirs})
    return Check("cgroups", "ok", f"sandbox groups (memory, pids) can be made under {', '.join(where)}")


def check_cuda(cfg: GymforgeConfig, work: Path) -> Check:
    try:
        import torch
    except ImportError:
        return Check("cuda", "skip", "torch is not installed here")
    if not torch.cuda.is_available():
        return Check("cuda", "skip", "no GPU on this host (torch.cuda.is_available() is False)")
    try:
        backend = sandbox_for(cfg, torch.cuda.device_count())
    except SandboxError as err:
        return Check("cuda", "fail", f"no sandbox to try CUDA in: {err}")
    code = "import torch; x = torch.ones(1024, device='cuda'); print(torch.cuda.get_device_name(0), float(x.sum()))"
    r = backend.run_once(work, ["python", "-c", code], timeout=300, limits=Limits.from_config(cfg.sandbox))
    if r.exit_code or "1024.0" not in r.output:
        return Check("cuda", "fail", f"CUDA did not initialize under the sandbox's limits (exit {r.exit_code}): "
                     f"{' '.join(r.output.split())[-300:]}")
    return Check("cuda", "ok", f"CUDA initializes in the sandbox under its limits: {r.output.split(' 1024.0')[0].strip()}")


def check_sandbox_network(cfg: GymforgeConfig, backend: SandboxBackend | None, work: Path) -> Check:
    if backend is None:
        return Check("sandbox-network", "skip", "no sandbox started (see the sandbox check)")
    limits = Limits.from_config(cfg.sandbox)
    if limits.network:
        return Check("sandbox-network", "fail", "the sandbox's limits allow the network")
    targets = []
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        targets.append(("this host's loopback", "127.0.0.1", listener.getsockname()[1]))
        if url := _teacher_url(cfg):
            targets.append(("the teacher", *_host_port(url)))
        probe = ("import socket, sys\nfor host, port in zip(sys.argv[1::2], sys.argv[2::2]):\n"
                 "    try:\n        socket.create_connection((host, int(port)), timeout=3).close(); print('REACHED', host)\n"
                 "    except OSError:\n        pass\n")
        argv = ["python", "-c", probe, *(str(x) for _, host, port in targets for x in (host, port))]
        r = backend.run_once(work, argv, timeout=60, limits=limits)
    reached = [name for name, host, _ in targets if f"REACHED {host}" in r.output]
    if reached:
        return Check("sandbox-network", "fail", f"sandboxed code reached {', '.join(reached)}")
    if r.exit_code:
        return Check("sandbox-network", "fail", f"the probe exited {r.exit_code}: {' '.join(r.output.split())[-200:]}")
    return Check("sandbox-network", "ok", "sandboxed code reaches neither " + " nor ".join(n for n, _, _ in targets))


def check_teacher(cfg: GymforgeConfig) -> Check:
    url = _teacher_url(cfg)
    if cfg.llm.teacher.provider == "offline":
        return Check("teacher", "skip", "the offline teacher (each job starts it on loopback)")
    if not url:
        return Check("teacher", "fail", "llm.teacher has no base_url and OPENAI_BASE_URL is not set")
    host, port = _host_port(url)
    t0 = time.monotonic()
    if err := _reachable(host, port):
        return Check("teacher", "fail", f"this host cannot reach the teacher at {host}:{port}: {err}")
    return Check("teacher", "ok", f"this host reaches the teacher at {host}:{port} ({time.monotonic() - t0:.2f} s)")


def check_hub(cfg: GymforgeConfig) -> Check:
    if cfg.datasets.hub != "huggingface":
        return Check("hub", "skip", f"datasets.hub is {cfg.datasets.hub}: no hub to reach")
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        return Check("hub", "skip", "HF_HUB_OFFLINE=1: jobs read only what was fetched beforehand")
    host, port = _host_port(os.environ.get("HF_ENDPOINT", HUB_URL))
    if err := _reachable(host, port):
        return Check("hub", "warn", f"this host cannot reach the hub at {host}:{port} ({err}): fetch datasets, "
                     "tokenizer and weights on a node that can, and run jobs with HF_HUB_OFFLINE=1")
    return Check("hub", "ok", f"this host reaches the hub at {host}:{port}")


def check_ledger_locks(cfg: GymforgeConfig) -> Check:
    where = cfg.results / "llm"
    probe_dir = where if where.is_dir() else next(p for p in [cfg.results, *cfg.results.absolute().parents]
                                                    if p.is_dir())
    found = sharedfs.lock_mount(probe_dir)
    line = f"{probe_dir} is on {found.mount_point} ({found.fstype}): {found.why}"
    status = {"ok": "ok", "broken": "fail", "per_node": "warn", "unknown": "warn"}[found.state]
    if found.state == "per_node":
        line += "; the budget then holds only when every job runs on one node (GYMFORGE_SINGLE_NODE=1)"
    return Check("ledger-locks", status, line)


def preflight(cfg: GymforgeConfig) -> list[Check]:
    work = Path(tempfile.mkdtemp(prefix="gymforge-preflight-"))
    try:
        sandbox, backend = check_sandbox(cfg, work)
        return [sandbox, check_cgroups(), check_cuda(cfg, work), check_sandbox_network(cfg, backend, work),
                check_teacher(cfg), check_hub(cfg), check_ledger_locks(cfg)]
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(args) -> None:
    checks = preflight(config_or_defaults(args.config))
    if args.json:
        print(json.dumps([asdict(c) for c in checks], indent=2))
    else:
        for c in checks:
            print(f"{c.status:<5} {c.name:<16} {c.detail}")
    sys.exit(1 if any(c.status == "fail" for c in checks) else 0)
