"""Helpers for end-to-end runs of the workflow against the offline teacher reached as an `openai` endpoint (directly,
or through tests/fault_proxy.py): a config overlay, Snakemake invocations, and a fingerprint of `results/` that two
runs must share when they produced the same data.

Run by hand (the numbers docs/operations.md quotes), e.g. 12 topics under 30% faults of every kind:

    python tests/workflow_runs.py faults --topics 12 --rate 0.3 --workdir /tmp/gf-faults
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from workflow_copy import copy_workflow

KEY_ENV = "GYMFORGE_FAULT_KEY"
SMALL_TOPICS = 4  # the tests' runs; the numbers in docs/operations.md are for 12 (see main())
# Not data: logs, benchmarks, the ledger, job scratch, and the resolved config (it names the endpoint's port).
NOT_DATA = ("logs", "benchmarks", "llm", ".gymforge", "config.json")


def workflow(dest: Path, url: str, *, topics: int, **llm: Any) -> Path:
    """A copy of the workflow whose teacher is the OpenAI-compatible endpoint at `url`; returns the config overlay."""
    copy_workflow(dest, "rules", "report", "profiles")
    teacher = {"provider": "openai", "base_url": url, "api_key_env": KEY_ENV, "timeout_s": 2.0, "max_retries": 6,
               **llm.pop("teacher", {})}
    overlay = {"topics": {"n": topics}, "llm": {"teacher": teacher, **llm}}
    path = dest / "run.yaml"
    path.write_text(yaml.safe_dump(overlay))
    return path


def snakemake_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "snakemake", "--cores", "2", *args, "--configfile", "config.yaml", "run.yaml"]


def env() -> dict[str, str]:
    return {**os.environ, KEY_ENV: "sk-fault-test", "OMP_NUM_THREADS": "1"}


def snakemake(workdir: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(snakemake_cmd(*args), cwd=workdir, capture_output=True, text=True, timeout=timeout, env=env(),
                          check=False)


def _strip_usage(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_usage(v) for k, v in value.items() if k != "usage"}
    if isinstance(value, list):
        return [_strip_usage(v) for v in value]
    return value


def fingerprint(results: Path) -> dict[str, str]:
    """Relative path -> content hash of every data file under `results`; JSON without its `usage` blocks (accounting:
    retries and cache hits change it, the data do not)."""
    out = {}
    for path in sorted(p for p in results.rglob("*") if p.is_file()):
        rel = path.relative_to(results)
        if rel.parts[0] in NOT_DATA:
            continue
        data = path.read_bytes()
        if path.suffix == ".json":
            try:
                data = json.dumps(_strip_usage(json.loads(data)), sort_keys=True).encode()
            except ValueError:
                pass
        out[str(rel)] = hashlib.sha256(data).hexdigest()[:16]
    return out


def leftovers(workdir: Path) -> list[str]:
    """Temporaries, scratch dirs and Snakemake locks left anywhere in the workflow's directory."""
    found = [p for p in (workdir / "results").rglob("*") if p.name.endswith((".tmp", ".scratch"))]
    found += list((workdir / ".cache").rglob("*.tmp")) if (workdir / ".cache").exists() else []
    found += list((workdir / ".snakemake" / "locks").glob("*.lock"))
    return sorted(str(p.relative_to(workdir)) for p in found)


@pytest.fixture(scope="session")
def teacher_url() -> str:
    from gymforge.offline.server import ensure_server

    return ensure_server()


@pytest.fixture(scope="session")
def clean_tasks(tmp_path_factory: pytest.TempPathFactory, teacher_url: str) -> dict[str, str]:
    """Fingerprint of an uninterrupted, fault-free `snakemake tasks` with SMALL_TOPICS topic slots."""
    workdir = tmp_path_factory.mktemp("clean-tasks")
    workflow(workdir, teacher_url, topics=SMALL_TOPICS)
    proc = snakemake(workdir, "tasks")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return fingerprint(workdir / "results")


def main() -> None:
    from fault_proxy import FaultProxy

    from gymforge.llm.ledger import Ledger
    from gymforge.offline.server import ensure_server

    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["faults", "clean"])
    parser.add_argument("--topics", type=int, default=12)
    parser.add_argument("--rate", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--target", default="tasks")
    parser.add_argument("--budget", type=float, default=None, help="llm.budget_usd (one invocation)")
    args = parser.parse_args()
    teacher = ensure_server()
    with FaultProxy(teacher, rate=args.rate if args.what == "faults" else 0.0, seed=args.seed, hang_s=3.0) as proxy:
        workflow(args.workdir, proxy.url, topics=args.topics,
                 **({"budget_usd": args.budget} if args.budget else {}))
        invocations, t0 = 0, time.monotonic()
        while invocations < (1 if args.budget else 5):
            invocations += 1
            proc = snakemake(args.workdir, args.target, timeout=3600)
            if proc.returncode == 0:
                break
            print(proc.stderr[-3000:])
        elapsed = time.monotonic() - t0
    totals = Ledger(args.workdir / "results" / "llm").totals()
    print(json.dumps({"invocations": invocations, "rc": proc.returncode, "seconds": round(elapsed, 1),
                      "injected": dict(proxy.injected), "chat_requests": proxy.requests,
                      "ledger": {k: {f: v[f] for f in ("calls", "retries", "errors", "cost_usd")} for k, v in
                                 totals.items()},
                      "leftovers": leftovers(args.workdir),
                      **({"budget": Ledger(args.workdir / "results" / "llm").budget(args.budget)} if args.budget else {}),
                      }, indent=1))
    (args.workdir / "fingerprint.json").write_text(json.dumps(fingerprint(args.workdir / "results"), indent=1))


if __name__ == "__main__":
    main()
