"""`gymforge preflight`: one line per check of what a node allows, exit 1 when one fails."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from loopback import LoopbackServer, closed_port_url

from gymforge.core.config import GymforgeConfig
from gymforge.sandbox.local import _bwrap_works
from gymforge.tools import preflight as pf

NAMES = ["sandbox", "cgroups", "cuda", "sandbox-network", "teacher", "hub", "ledger-locks"]


def config(tmp_path: Path, url: str) -> GymforgeConfig:
    return GymforgeConfig.model_validate({
        "results_dir": str(tmp_path / "results"), "cache_dir": str(tmp_path / "cache"),
        "llm": {"teacher": {"provider": "openai", "base_url": url, "api_key_env": "PREFLIGHT_KEY"}}})


@pytest.mark.skipif(not _bwrap_works(), reason="bubblewrap cannot start here")
def test_the_sandbox_reaches_neither_loopback_nor_the_teacher_that_the_host_reaches(tmp_path: Path) -> None:
    """A real endpoint on this host's loopback: the host connects, sandboxed code does not."""
    with LoopbackServer() as teacher:
        cfg = config(tmp_path, teacher.url)
        assert pf.check_teacher(cfg).status == "ok"
        sandbox, backend = pf.check_sandbox(cfg, tmp_path)
        assert sandbox.status == "ok" and backend is not None
        net = pf.check_sandbox_network(cfg, backend, tmp_path)
    assert net.status == "ok" and "the teacher" in net.detail, net


def test_an_unreachable_teacher_fails_and_a_missing_hub_only_warns(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = config(tmp_path, closed_port_url())
    teacher = pf.check_teacher(cfg)
    assert teacher.status == "fail" and "cannot reach the teacher" in teacher.detail
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", closed_port_url().removesuffix("/v1"))
    hub = pf.check_hub(cfg.model_copy(update={"datasets": cfg.datasets.model_copy(update={"hub": "huggingface"})}))
    assert hub.status == "warn" and "HF_HUB_OFFLINE=1" in hub.detail
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert pf.check_hub(cfg.model_copy(update={"datasets": cfg.datasets.model_copy(update={"hub": "huggingface"})})
                        ).status == "skip"


@pytest.mark.slow  # ~30 s: two sandboxes, a cgroup, torch's import
def test_the_command_prints_one_line_per_check_and_fails_on_a_failed_one(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(config(tmp_path, closed_port_url()).model_dump_json())
    r = subprocess.run([sys.executable, "-m", "gymforge", "preflight", "--config", str(cfg)], capture_output=True,
                       text=True, timeout=300, env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})
    lines = r.stdout.splitlines()
    assert [line.split()[1] for line in lines] == NAMES, r.stdout + r.stderr
    assert r.returncode == 1 and lines[NAMES.index("teacher")].startswith("fail")
    statuses = {line.split()[1]: line.split()[0] for line in lines}
    assert statuses["cuda"] in ("skip", "ok") and statuses["hub"] == "skip"
    if _bwrap_works():
        assert statuses["sandbox"] == statuses["sandbox-network"] == "ok"
    r = subprocess.run([sys.executable, "-m", "gymforge", "preflight", "--config", str(cfg), "--json"],
                       capture_output=True, text=True, timeout=300, env={"PATH": "/usr/bin:/bin"})
    checks = json.loads(r.stdout)
    assert [c["name"] for c in checks] == NAMES and r.returncode == 1
