"""Stage 3.5: rollout shards (plan, seeds, records), the SFT messages against what the endpoint received,
and resume after kill -9. Episodes run for real (agent loop, local sandbox, `openai` client over HTTP)
against a loopback server whose scripted agent replies cost nothing."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from gymforge.core.config import GymforgeConfig, load_config
from gymforge.agent.trajectory import reply_chats, requests_of, sft_messages
from gymforge.stages.sft import build_sft
from gymforge.core.records import VerificationReport, derive_seed
from gymforge.stages.rollouts import (RolloutRecord, ShardRecord, parts_dir, rollout_seed, rollout_shard, shard_count,
                                      shard_ids, shard_rollouts)
from loopback import Answer, LoopbackServer, completion
from workflow_copy import copy_workflow

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
from rollout_concurrency import make_environment  # noqa: E402

SLOT = "t0000"
RUN_SEED = 5  # its first four rollouts of t0000 have seeds of all four scripted behaviours (see scripted_turn)
FORMAT_ERROR = "Your reply could not be used"


def _reply(thought: str, action: str) -> str:
    return f"DISCUSSION\n{thought}\n\n```\n{action}\n```\n"


def scripted_turn(seed: int, turn: int, retry: bool) -> str:
    """A deterministic agent whose behaviour depends on the seed: seed % 4 == 0 solves the task, 1 also solves
    it after a malformed reply at turn 2, 2 submits before any artefact exists, 3 wanders until the step limit."""
    kind = seed % 4
    if kind == 1 and turn == 2 and not retry:
        return "I think I should look at the data first, but I forgot the command block."
    if kind == 2:
        plan = ["ls", 'open "baseline.py"', "submit"]
    elif kind == 3:
        plan = ["ls", 'open "evaluate.py"', "scroll_down", "goto 1", "search_file rmse"]
    else:
        plan = ["ls", 'open "baseline.py"', "scroll_down", "goto 1", "search_file mean", 'open "evaluate.py"',
                "python baseline.py", "validate", "submit"]
    action = plan[turn % len(plan)] if kind == 3 else plan[min(turn, len(plan) - 1)]
    return _reply(f"Turn {turn} of episode {seed}: {action.split()[0]}" + (" (format fixed)" if retry else ""), action)


class Scripted:
    """Answers agent requests with `scripted_turn` and remembers every (request, reply) pair."""

    def __init__(self) -> None:
        self.log: list[tuple[dict[str, Any], str]] = []

    def __call__(self, body: dict[str, Any]) -> Answer:
        messages = body["messages"]
        retry = messages[-1]["content"].startswith(FORMAT_ERROR)
        turn = sum(m["role"] == "assistant" for m in messages) - (1 if retry else 0)
        reply = scripted_turn(body["seed"], turn, retry)
        self.log.append((body, reply))
        return Answer(200, {}, completion(reply, model=body["model"], prompt_tokens=len(json.dumps(messages)) // 4,
                                          completion_tokens=len(reply) // 4))


def config(root: Path, url: str, **trajectories: Any) -> GymforgeConfig:
    return GymforgeConfig.model_validate({
        "seed": RUN_SEED, "results_dir": str(root / "results"), "cache_dir": str(root / "cache"),
        "llm": {"teacher": {"provider": "openai", "base_url": url, "model": "scripted-teacher", "concurrency": 8}},
        "trajectories": {"per_task": 4, "shard_size": 4, "concurrency": 4, "max_steps": 12, **trajectories},
    })


def shard_path(root: Path, k: int = 0) -> Path:
    return root / "results" / "trajectories" / SLOT / f"shard_{k:04d}.json"


@pytest.fixture
def api_key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "loopback-key")


# ---- plan and seeds --------------------------------------------------------------------------------------


def test_shards_cover_every_rollout_once_and_seeds_do_not_depend_on_sharding():
    for per_task, size in [(6, 4), (256, 32), (5, 5), (3, 8)]:
        cfg = GymforgeConfig.model_validate({"trajectories": {"per_task": per_task, "shard_size": size}})
        indices = [i for k in range(shard_count(cfg)) for i in shard_rollouts(cfg, k)]
        assert indices == list(range(per_task)) and all(shard_rollouts(cfg, k) for k in range(shard_count(cfg)))
        assert shard_ids(cfg)[0] == "0000"
    cfg = GymforgeConfig(seed=3)
    seeds = {rollout_seed(cfg, slot, i) for slot in ("t0000", "t0001") for i in range(256)}
    assert len(seeds) == 512
    assert rollout_seed(cfg, "t0001", 7) == derive_seed(3, "rollout", "t0001", 7) != rollout_seed(GymforgeConfig(), "t0001", 7)


def test_scheduling_settings_do_not_rerun_shards_but_episode_settings_do():
    base = GymforgeConfig()
    sections = ("seed", "teacher", "sandbox", "trajectories")
    same = GymforgeConfig.model_validate({"trajectories": {"per_task": 256, "shard_size": 32, "concurrency": 16,
                                                           "gpus": 1}})
    assert base.digest(*sections) == same.digest(*sections)
    for change in ({"max_steps": 20}, {"model": "gymforge-offline-teacher@0.5"}):
        assert base.digest(*sections) != GymforgeConfig.model_validate({"trajectories": change}).digest(*sections)
    assert base.digest("filter", "student") != GymforgeConfig.model_validate(
        {"filter": {"max_tokens": 100}}).digest("filter", "student")


def test_a_task_that_was_not_verified_gets_a_trivial_shard(tmp_path):
    report = tmp_path / "report.json"
    report.write_text(VerificationReport(item=SLOT, status="discarded", reason_code="verification_failed",
                                         reason="still failing").model_dump_json())
    (tmp_path / "verified").mkdir()
    out = shard_path(tmp_path)
    record = rollout_shard(GymforgeConfig(), SLOT, 0, report, tmp_path / "verified", out)
    assert record.status == "skipped" and record.reason_code == "verification_failed" and not record.rollouts
    assert ShardRecord.model_validate_json(out.read_text()) == record


# ---- one shard, for real ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shard_run(tmp_path_factory):
    """One shard of 4 rollouts (seeds of all four behaviours) against the scripted loopback agent."""
    root = tmp_path_factory.mktemp("shard")
    scripted = Scripted()
    old = os.environ.get("OPENAI_API_KEY")
    os.environ["OPENAI_API_KEY"] = "loopback-key"
    try:
        with LoopbackServer(respond=scripted) as server:
            cfg = config(root, server.url)
            report, verified = make_environment(root)
            record = rollout_shard(cfg, SLOT, 0, report, verified, shard_path(root))
            requests = list(server.requests)
    finally:
        if old is None:
            os.environ.pop("OPENAI_API_KEY")
        else:
            os.environ["OPENAI_API_KEY"] = old
    return cfg, record, scripted, requests, root


def test_every_seed_behaviour_is_exercised(shard_run):
    _, record, *_ = shard_run
    assert sorted(r.seed % 4 for r in record.rollouts) == [0, 1, 2, 3]


def test_record_schema(shard_run):
    cfg, record, _, _, root = shard_run
    assert record.status == "ok" and record.task_id == "csvTiny" and record.rollout_indices == [0, 1, 2, 3]
    assert [r.rollout for r in record.rollouts] == [0, 1, 2, 3] and record.resumed == 0
    on_disk = json.loads(shard_path(root).read_text())
    assert ShardRecord.model_validate(on_disk) == record
    assert not parts_dir(shard_path(root)).exists()  # finished: the resume scratch is gone
    for raw, rec in zip(on_disk["rollouts"], record.rollouts, strict=True):
        assert set(raw) >= {"slot", "task_id", "rollout", "seed", "teacher", "sandbox", "max_steps", "trajectory",
                            "wall_s", "baseline", "fingerprint"}
        assert rec.seed == derive_seed(cfg.seed, "rollout", SLOT, rec.rollout)
        assert rec.teacher.model == "scripted-teacher" and rec.teacher.provider == "openai"
        assert rec.teacher.endpoint.startswith("http://127.0.0.1:") and rec.sandbox.backend == "local"
        traj = raw["trajectory"]
        # MLGym's .traj keys (docs/training.md)
        assert set(traj) >= {"environment", "trajectory", "history", "info"}
        assert set(traj["info"]) >= {"model_stats", "exit_status", "submission", "score"}
        assert set(traj["info"]["model_stats"]) == {"total_cost", "task_cost", "tokens_sent", "tokens_received",
                                                    "api_calls"}
        for step in traj["trajectory"]:
            assert set(step) >= {"action", "observation", "response", "state", "thought", "execution_time",
                                 "prompt_tokens", "completion_tokens", "query_time"}
        model_steps = [s for s in traj["trajectory"] if not s["action"].startswith("exit_")]
        assert all(s["prompt_tokens"] > 0 and s["completion_tokens"] > 0 for s in model_steps)
        for message in traj["history"]:
            assert set(message) >= {"role", "content", "agent"}
            if message["role"] == "assistant":
                assert {"thought", "action"} <= set(message)
        assert traj["meta"]["seed"] == rec.seed and traj["meta"]["task_id"] == "csvTiny"
        assert traj["info"]["exit_status"]


def test_rollouts_end_as_their_scripts_say(shard_run):
    _, record, *_ = shard_run
    for rec in record.rollouts:
        info = rec.trajectory.info
        kind = rec.seed % 4
        if kind in (0, 1):
            assert info.exit_status == "submitted" and len(info.score) == 2
        elif kind == 2:
            assert info.exit_status == "submission_not_found (submit)" and not info.score
        else:
            assert info.exit_status == "submission_not_found (max_steps)" and len(rec.trajectory.trajectory) == 13


def test_sft_messages_equal_what_the_endpoint_received(shard_run):
    _, record, scripted, requests, _ = shard_run
    received: dict[int, list[list[dict[str, str]]]] = defaultdict(list)  # what the server read off the wire
    for request in requests:
        body = request["body"]
        received[body["seed"]].append([{"role": m["role"], "content": m["content"]} for m in body["messages"]])
    replies: dict[int, list[str]] = defaultdict(list)
    for body, reply in scripted.log:
        replies[body["seed"]].append(reply)
    for rec in record.rollouts:
        sent = list(zip(received[rec.seed], replies[rec.seed], strict=True))
        # every request of the episode, rebuilt from the trajectory file, is exactly what the server got
        assert requests_of(rec.trajectory) == [messages for messages, _ in sent]
        example = sft_messages(rec.trajectory)
        assert example is not None and example[-1]["role"] == "assistant"
        # the example = the final request as sent + the reply the endpoint returned to it
        accepted = [(m, r) for m, r in sent if not r.startswith("I think")]  # the malformed reply was re-asked
        assert (example[:-1], example[-1]["content"]) == accepted[-1]
        # the `request` unit's examples = every accepted reply with the request that got it (re-asks included)
        assert [(chat[:-1], chat[-1]["content"]) for chat in reply_chats(rec.trajectory)] == accepted
        if rec.seed % 4 == 1:
            assert any(m[-1]["content"].startswith(FORMAT_ERROR) for m, _ in sent)
        elided = [m for m in example if m["content"].startswith("Old output omitted (")]
        observations = sum(m["role"] == "user" for m in example) - 1
        assert len(elided) == max(0, observations - 5)


# ---- resume after kill -9 --------------------------------------------------------------------------------


def _cli(cfg_file: Path, report: Path, verified: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "gymforge", "rollout-shard", "--config", str(cfg_file), "--slot", SLOT,
            "--shard", "0000", "--report", str(report), "--env", str(verified), "--out", str(out)]


def _write_config(path: Path, cfg: GymforgeConfig) -> Path:
    path.write_text(cfg.model_dump_json())
    return path


@pytest.fixture(scope="module")
def student_tokenizer(tmp_path_factory):
    from gymforge.core.prompts import templates_dir
    from gymforge.student.tokenizer import build_tokenizer

    return build_tokenizer("offline", tmp_path_factory.mktemp("tok") / "tokenizer", templates_dir(), [])


def _dataset(cfg: GymforgeConfig, shard: Path, tokenizer: Path, out: Path) -> tuple[bytes, list[dict]]:
    import datasets

    build_sft(cfg, [shard], tokenizer, jsonl_out=out / "train.jsonl", dataset_out=out / "dataset",
              rollouts_out=out / "rollouts.jsonl", stats_out=out / "stats.json")
    return (out / "train.jsonl").read_bytes(), datasets.load_from_disk(str(out / "dataset")).to_list()


@pytest.mark.slow
def test_kill_9_mid_shard_then_rerun_equals_an_uninterrupted_run(tmp_path, student_tokenizer):
    root = tmp_path / "w"
    report, verified = make_environment(root)
    out = shard_path(root)
    env = {**os.environ, "OPENAI_API_KEY": "loopback-key", "HF_HUB_OFFLINE": "1"}
    scripted = Scripted()
    with LoopbackServer(respond=scripted, delay_s=0.15) as server:
        def cfg(tag: str) -> GymforgeConfig:  # same results dir (so the same workspace paths), fresh LLM cache
            c = config(root, server.url, per_task=8, shard_size=8, concurrency=2)
            return c.model_copy(update={"cache_dir": str(tmp_path / f"cache-{tag}")})

        subprocess.run(_cli(_write_config(tmp_path / "a.json", cfg("a")), report, verified, out), env=env,
                       check=True, capture_output=True, timeout=300)
        uninterrupted = Counter(body["seed"] for body, _ in scripted.log)
        reference = _dataset(cfg("a"), out, student_tokenizer, tmp_path / "sft-a")
        reference_shard = ShardRecord.model_validate_json(out.read_text())
        shutil.rmtree(out.parent)

        proc = subprocess.Popen(_cli(_write_config(tmp_path / "b.json", cfg("b")), report, verified, out), env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 120
        while len(list(parts_dir(out).glob("r*.json"))) < 3 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        assert proc.returncode == -signal.SIGKILL
        assert not out.exists()
        finished = {p.name: p.read_bytes() for p in parts_dir(out).glob("r*.json")}
        assert 3 <= len(finished) < 8
        before = server.count

        subprocess.run(_cli(_write_config(tmp_path / "c.json", cfg("c")), report, verified, out), env=env,
                       check=True, capture_output=True, timeout=300)
        resumed = ShardRecord.model_validate_json(out.read_text())
        assert resumed.resumed == len(finished) and not parts_dir(out).exists()
        for rec in resumed.rollouts:
            if (name := f"r{rec.rollout:05d}.json") in finished:
                assert rec == RolloutRecord.model_validate_json(finished[name])  # taken over, not redone
        # the rerun asked nothing for the rollouts that had finished, and everything for the others
        finished_seeds = {RolloutRecord.model_validate_json(b).seed for b in finished.values()}
        rerun = Counter(body["seed"] for body, _ in scripted.log[before:])
        assert rerun == {seed: n for seed, n in uninterrupted.items() if seed not in finished_seeds}

        again = _dataset(cfg("c"), out, student_tokenizer, tmp_path / "sft-c")
    assert again == reference
    assert [r.trajectory.history for r in resumed.rollouts] == [r.trajectory.history for r in reference_shard.rollouts]
    assert reference[1] and len(reference[1]) < 8  # the filters kept some, not all


# ---- the workflow --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_dry_run_plans_a_static_shard_dag(tmp_path):
    copy_workflow(tmp_path, "rules")
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--quiet", "rules", "--cores", "2", "--config",
                           "trajectories={per_task: 10, shard_size: 4}"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = {p[0]: int(p[1]) for p in (line.split() for line in proc.stdout.splitlines())
              if len(p) == 2 and p[1].isdigit()}
    n = load_config(tmp_path / "config.yaml").topics.n  # the run reads config.yaml's slots
    assert counts["rollout_shard"] == n * 3
    assert counts["student_tokenizer"] == counts["sft_dataset"] == counts["sft_plots"] == counts["all"] == 1
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--cores", "2",
                           "results/trajectories/t0003/shard_0002.json", "--config", "trajectories={gpus: 1}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "gpu=1" in proc.stdout + proc.stderr


def test_a_shards_memory_covers_its_concurrent_sandboxes() -> None:
    """A shard job's allocation holds `concurrency` sandboxes at their memory limit plus the job: derived when
    `trajectories.mem_mb` is null, refused at plan time when set below that."""
    from gymforge.core.plan import shard_mem_mb

    cfg = GymforgeConfig.model_validate({"sandbox": {"memory_mb": 32768}, "trajectories": {"concurrency": 16}})
    assert shard_mem_mb(cfg) == 16 * 32768 + 1024
    raised = cfg.model_copy(update={"trajectories": cfg.trajectories.model_copy(update={"mem_mb": 600_000})})
    assert shard_mem_mb(raised) == 600_000
    short = cfg.model_copy(update={"trajectories": cfg.trajectories.model_copy(update={"mem_mb": 131072})})
    with pytest.raises(ValueError, match="at least 525312 MB"):
        shard_mem_mb(short)


def test_episode_workspaces_live_in_tmpdir_not_beside_the_results(tmp_path, monkeypatch, api_key):
    """On a cluster $TMPDIR is the node's own disk: a shard's workspaces go there while its episodes run (none on the
    shared results file system), its record lands in results/ (written atomically), and nothing is left behind."""
    node = tmp_path / "node-tmp"
    node.mkdir()
    monkeypatch.setenv("TMPDIR", str(node))
    root = tmp_path / "run"
    seen: list[tuple[list[str], list[str]]] = []
    scripted = Scripted()

    def respond(body):
        shard_dir = shard_path(root).parent
        seen.append((sorted(p.name for p in node.iterdir()),
                     sorted(p.name for p in shard_dir.iterdir()) if shard_dir.exists() else []))
        return scripted(body)

    with LoopbackServer(respond=respond) as server:
        report, verified = make_environment(root)
        record = rollout_shard(config(root, server.url, per_task=1, shard_size=1, max_steps=3), SLOT, 0, report,
                               verified, shard_path(root))
    assert record.status == "ok" and shard_path(root).exists() and seen
    for in_tmp, beside in seen:
        assert [n for n in in_tmp if n.startswith("gymforge-") and n.endswith("shard_0000.work")], in_tmp
        assert not [n for n in beside if n.endswith(".work")], beside
    assert not [p for p in node.iterdir() if p.name.startswith("gymforge-")]
