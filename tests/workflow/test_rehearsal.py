"""The rehearsal of the paper-scale run (configs/rehearsal.yaml, scripts/rehearsal.sh): paper-scale with only its sizes
shrunk, end to end through the single-node SLURM cluster, the docker sandbox and the strict reasoning-model teacher.

The overlay's keys are held to an allow-list here (sizes, plus the few switches the overlay comments); the run itself
is `slow` and `heavy` (14-21 min on the loaded 2-core machine) and skips only where SLURM or docker cannot run (not root,
no apt-get). The run is tests/rehearsal_run.py's `rehearsal` fixture, which tests/workflow/test_slurm.py's checks of
the SLURM run share.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from rehearsal_run import Rehearsal

from gymforge.core.config import load_config
from gymforge.core.prompts import render

REPO = Path(__file__).resolve().parents[2]
OVERLAY = REPO / "configs" / "rehearsal.yaml"
PAPER = REPO / "configs" / "paper-scale.yaml"

# Sizes: counts, steps, lengths, concurrency, memory, cores, GPUs. Nothing here changes what a stage does, only how
# much of it there is and what its jobs ask of the scheduler.
SIZES = {
    "topics.n", "topics.batch_size",
    "llm.teacher.concurrency",
    "sandbox.memory_mb",
    "trajectories.per_task", "trajectories.shard_size", "trajectories.concurrency", "trajectories.gpus",
    "trajectories.threads",
    "train.epochs", "train.gradient_accumulation", "train.gpus", "train.mem_mb", "train.threads",
    "evaluate.tasks", "evaluate.runs_per_task", "evaluate.max_steps", "evaluate.concurrency",
    "evaluate.serving.max_new_tokens", "evaluate.mem_mb", "evaluate.threads",
    "rl.iterations", "rl.tasks_per_iteration", "rl.group_size", "rl.max_steps", "rl.concurrency",
    "rl.max_new_tokens", "rl.minibatches", "rl.max_length", "rl.gpus", "rl.mem_mb", "rl.threads",
}
# The switches, each for something this machine cannot run (no network, no GPU), with the value it must take.
SWITCHES = {
    "results_dir": "results-rehearsal",               # never mixes with a real paper-scale run's results
    "llm.teacher.base_url": "http://127.0.0.1:18431/v1",  # the strict reasoning endpoint on loopback
    "datasets.hub": "offline",
    "train.student": "offline",
    "evaluate.benchmark": "builtin",
    "evaluate.serving.backend": "transformers",
}


def leaves(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def test_the_overlay_changes_only_sizes_and_the_commented_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    raw = yaml.safe_load(OVERLAY.read_text())
    assert raw.pop("base") == "paper-scale.yaml"
    keys = leaves(raw)
    assert keys.keys() <= SIZES | SWITCHES.keys(), sorted(keys.keys() - SIZES - SWITCHES.keys())
    assert {k: keys[k] for k in SWITCHES} == SWITCHES
    text = OVERLAY.read_text()
    for key in SWITCHES:  # each switch says why, on its line or the comment above it
        name = key.rsplit(".", 1)[-1]
        line = next(i for i, ln in enumerate(text.splitlines()) if ln.strip().startswith(f"{name}:"))
        assert "SWITCH" in "\n".join(text.splitlines()[max(0, line - 3):line + 1]), key
    # Resolved, the two configs differ exactly there: whatever paper-scale says of the rest (the teacher's provider
    # and request options, the docker sandbox, precision, learning rates, RL over every verified task) holds.
    rehearsal, paper = leaves(load_config(OVERLAY).model_dump()), leaves(load_config(PAPER).model_dump())
    changed = {k for k in rehearsal.keys() | paper.keys() if rehearsal.get(k) != paper.get(k)}
    assert changed <= SIZES | SWITCHES.keys(), sorted(changed - SIZES - SWITCHES.keys())
    cfg = load_config(OVERLAY)
    teacher = cfg.llm.teacher
    assert (teacher.provider, teacher.token_param, teacher.omit_params, teacher.reasoning_effort) == (
        "openai", "max_completion_tokens", ["temperature"], "medium")
    assert cfg.sandbox.backend == "docker" and cfg.rl.tasks is None
    assert "student-rl" in [m.source for m in cfg.evaluate.models]


def test_the_teacher_servers_request_log_records_fields_not_messages(tmp_path: Path) -> None:
    from gymforge.offline.server import _make_server

    log = tmp_path / "requests.jsonl"
    server = _make_server("127.0.0.1", 0, "reasoning", request_log=log)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1/chat/completions"
    # The pipeline's topic request, which the offline teacher answers; its text must not reach the log.
    messages = [{"role": "system", "content": render("system_teacher")},
                {"role": "user", "content": render("topics", n=3, seen=[])}]

    def post(body: dict[str, Any]) -> int:
        request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status
        except urllib.error.HTTPError as err:
            return err.code

    try:
        assert post({"model": "m", "messages": messages, "max_tokens": 10}) == 400
        assert post({"model": "m", "messages": messages, "max_completion_tokens": 4000, "reasoning_effort": "low"}) == 200
    finally:
        server.shutdown()
        server.server_close()
    refused, answered = [json.loads(line) for line in log.read_text().splitlines()]
    assert refused["status"] == 400 and "max_tokens" in refused["fields"] and "max_tokens" in refused["error"]
    assert answered["status"] == 200 and answered["fields"] == ["max_completion_tokens", "messages", "model",
                                                                 "reasoning_effort"]
    assert answered["max_completion_tokens"] == 4000 and answered["reasoning_effort"] == "low"
    assert answered["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0
    assert messages[1]["content"][:60] not in log.read_text() and "messages" not in refused


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.timeout(3600)  # 14-21 min on the loaded 2-core machine, plus the docker image's first build (9 min here)
def test_the_rehearsal_reaches_scores_through_slurm_docker_and_the_strict_teacher(rehearsal: Rehearsal) -> None:
    proc, summary = rehearsal.proc, rehearsal.summary
    assert proc.returncode == 0 and summary.get("ok"), f"{summary.get('problems')}\n{proc.stderr[-6000:]}"
    # Every job went through SLURM: only the shell-less aggregation targets ran in the Snakemake process.
    slurm = summary["slurm"]
    assert slurm["states"] == ["COMPLETED"] and slurm["sbatch_jobs"] >= 24 and slurm["array_tasks"] == 0
    assert {"topic_batch", "verify_environment", "rollout_shard", "train_student", "train_rl", "eval_runs",
            "score_table"} <= set(slurm["remote_rules"])
    # The sandbox was docker: containers of the image started, and every recorded episode says docker.
    docker = summary["docker"]
    assert docker["sandbox_containers_started"] > 0 and list(docker["episodes_by_sandbox"]) == ["docker"]
    # The teacher endpoint saw only what a reasoning model accepts, refused nothing, and billed reasoning tokens.
    teacher = summary["teacher"]
    assert teacher["requests"] > 0 and teacher["refused"] == 0
    assert "max_completion_tokens" in teacher["fields"]
    assert "max_tokens" not in teacher["fields"] and "temperature" not in teacher["fields"]
    assert teacher["reasoning_efforts"] == ["medium"] and teacher["reasoning_tokens"] > 0
    assert summary["ledger"]["reasoning_tokens"] > 0 and summary["ledger"]["cost_usd"] > 0
    # Scores, and every stage of the funnel with items done.
    assert summary["aup_csv"] and "student-rl" in summary["aup_csv"]
    for stage in ("topics", "proposals", "configs", "tasks", "environments", "decontamination", "trajectories",
                  "checkpoints", "scores"):
        assert summary["funnel"][stage]["done"] > 0, stage
    print(f"rehearsal: {rehearsal.elapsed:.0f} s ({json.dumps(summary['seconds'])})")
