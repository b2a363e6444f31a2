from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Iterator

import pytest
from loopback import Answer, LoopbackServer, completion

from gymforge.agent import (
    Agent,
    AgentConfig,
    AgentTask,
    EvaluationFormatError,
    SubmissionNotFound,
    build_messages,
    read_trajectory,
)
from gymforge.core.config import EndpointConfig, Price
from gymforge.llm.client import LLMClient
from gymforge.sandbox import ExecResult, Limits, Session, get_sandbox

TASK = AgentTask(
    id="toy", description="Write a number into submission.csv.", baseline={"score": 0.25}, training_timeout=10
)


def cmd(command: str, thought: str = "DISCUSSION\nNext step.") -> str:
    return f"{thought}\n\n```\n{command}\n```\n"


class FileEvaluator:
    """The score is the number in submission.csv."""

    def __init__(self, workspace: Path) -> None:
        self.path = workspace / "submission.csv"

    def evaluate(self) -> tuple[dict[str, float], str]:
        if not self.path.exists():
            raise SubmissionNotFound(f"{self.path.name} does not exist")
        try:
            return {"score": float(self.path.read_text())}, str(self.path)
        except ValueError:
            raise EvaluationFormatError(f"{self.path.name} does not hold a number") from None


@pytest.fixture(autouse=True)
def _api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GYMFORGE_TEST_KEY", "sk-test")


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    ws = tmp_path / "ws"
    ws.mkdir()
    with get_sandbox("local").open(ws, limits=Limits()) as s:
        yield s


class Episode:
    """A scripted model on a loopback server, the local sandbox and the file evaluator."""

    def __init__(self, tmp_path: Path, session: Session, replies: list[str | dict[str, Any]], **config: Any) -> None:
        bodies = [r if isinstance(r, dict) else completion(r) for r in replies]
        self.server = LoopbackServer([Answer(200, {}, b) for b in bodies]).start()
        price = Price(input_per_mtok=1.0, output_per_mtok=2.0)
        ep = EndpointConfig(
            provider="openai", base_url=self.server.url, model="loopback-model", api_key_env="GYMFORGE_TEST_KEY",
            price=price,
        )
        self.llm = LLMClient(
            ep, stage="agent", cache_dir=tmp_path / "cache", ledger_dir=tmp_path / "ledger", budget_usd=10.0
        )
        self.out = tmp_path / "run"
        self.session = session
        self.agent = Agent(
            self.llm, session, FileEvaluator(session.workspace), TASK, AgentConfig(**config),
            seed=7, out_dir=self.out, meta={"sandbox": "local"},
        )

    def run(self) -> Any:
        try:
            return self.agent.run()
        finally:
            self.server.stop()

    def requests(self) -> list[list[dict[str, str]]]:
        return [r["body"]["messages"] for r in self.server.requests]


def assert_history_reproduces_requests(traj: Any, requests: list[list[dict[str, str]]]) -> None:
    """Each assistant turn was generated from exactly build_messages(history before it)."""
    turns = [i for i, m in enumerate(traj.history) if m["role"] == "assistant"]
    primary = [r for r in requests if not r[-1]["content"].startswith("Your reply could not be used")]
    assert len(primary) >= len(turns)
    for i, req in zip(turns, primary, strict=False):  # primary may hold a last request no turn answered
        assert build_messages(traj.history[:i]) == req


def test_validate_then_submit(tmp_path: Path, session: Session) -> None:
    ep = Episode(tmp_path, session, [
        cmd("echo 0.5 > submission.csv"),
        cmd("validate"),
        cmd("echo 0.75 > submission.csv"),
        cmd("submit"),
    ])
    traj = ep.run()
    info = traj.info
    assert info.exit_status == "submitted"
    assert info.score == [{"score": 0.5}, {"score": 0.75}]
    assert info.submission == str(session.workspace / "submission.csv")
    validate_obs = traj.trajectory[1].observation
    assert f"valid submission artefact at {session.workspace / 'submission.csv'}" in validate_obs
    assert 'Baseline Score: {"score": 0.25}' in validate_obs and 'Evaluation Score: {"score": 0.5}' in validate_obs
    actions = [s.action for s in traj.trajectory]
    assert actions == ["echo 0.5 > submission.csv", "validate", "echo 0.75 > submission.csv", "submit"]
    assert traj.trajectory[-1].observation == "Exited (submit)"
    assert info.model_stats.api_calls == 4 == ep.server.count
    assert info.model_stats.tokens_sent == 40 and info.model_stats.tokens_received == 20
    assert info.model_stats.total_cost == pytest.approx(4 * (10 + 2 * 5) / 1e6)

    # The files: MLGym's layout plus extras, results.json next to the .traj.
    raw = json.loads((ep.out / "toy.traj").read_text())
    assert {"environment", "trajectory", "history", "info"} <= raw.keys()
    assert raw["meta"] == {
        "task_id": "toy", "model": "loopback-model", "provider": "openai", "seed": 7, "sandbox": "local",
    }
    step = raw["trajectory"][0]
    assert {"action", "observation", "response", "state", "thought", "execution_time"} <= step.keys()
    assert {"prompt_tokens", "completion_tokens", "query_time", "cost_usd"} <= step.keys()
    assert json.loads(step["state"]) == {"open_file": "n/a", "working_dir": session.workdir}
    stats_keys = {"total_cost", "task_cost", "tokens_sent", "tokens_received", "api_calls"}
    assert raw["info"]["model_stats"].keys() == stats_keys
    assert raw["info"]["score"] == [{"score": 0.5}, {"score": 0.75}]
    assistant = [m for m in raw["history"] if m["role"] == "assistant"]
    assert assistant[0]["action"] == "echo 0.5 > submission.csv" and assistant[0]["thought"] == "DISCUSSION\nNext step."
    assert all(m["agent"] == "primary" for m in raw["history"])
    assert json.loads((ep.out / "results.json").read_text()) == {
        "agent": [{"score": 0.5}, {"score": 0.75}], "baseline": {"score": 0.25},
    }
    assert read_trajectory(ep.out / "toy.traj") == traj
    assert_history_reproduces_requests(traj, ep.requests())


def test_prompts_and_status_lines(tmp_path: Path, session: Session) -> None:
    replies = [cmd("mkdir sub && cd sub && export X=41"), cmd("echo $((X + 1))"), cmd("ls"), cmd("submit")]
    ep = Episode(tmp_path, session, replies)
    traj = ep.run()
    system, task, *observations = [m["content"] for m in traj.history if m["role"] != "assistant"]
    assert "end_of_edit" in system and "DISCUSSION" in system and "1000 lines" in system
    assert "Write a number into submission.csv." in task and '{"score": 0.25}' in task and "50 steps" in task
    assert task.endswith("(Current Step: 0, Remaining Steps: 50)\n(Open file: n/a)\n"
                         f"(Current directory: {session.workdir})\nbash-$")
    assert observations[0].startswith("Your command ran successfully and did not produce any output.")
    assert observations[1].startswith("42\n")  # cwd and exports persist
    assert observations[1].endswith(f"(Current Step: 2, Remaining Steps: 48)\n(Open file: n/a)\n"
                                    f"(Current directory: {session.workdir}/sub)\nbash-$")
    assert traj.info.exit_status == "submission_not_found (submit)"
    assert "submission.csv does not exist" in traj.info.exit_detail


def test_file_commands_interactive_guard_and_timeouts(tmp_path: Path, session: Session) -> None:
    ep = Episode(tmp_path, session, [
        cmd("mkdir src && cd src && printf 'import os\\n' > main.py"),
        cmd('open "main.py"'),
        cmd("edit 1:1\nimport os\nprint(os.sep)\nend_of_edit"),
        cmd("insert 2\nprint(undefined_name)\nend_of_insert"),
        cmd("vim main.py"),
        cmd("sleep 5"),
        cmd("python3 -c 'import time; time.sleep(1.5); print(\"trained\")'"),
        cmd("python3 main.py"),
        cmd("submit"),
    ], short_timeout_s=0.5)
    traj = ep.run()
    steps = traj.trajectory
    main = session.workspace / "src" / "main.py"
    assert f"[File: {session.workdir}/src/main.py (1 lines total)]" in steps[1].observation
    assert steps[2].observation.startswith("File updated.")
    assert "NOT applied" in steps[3].observation and "undefined name 'undefined_name'" in steps[3].observation
    assert main.read_text() == "import os\nprint(os.sep)\n"
    assert "`vim` is not allowed" in steps[4].observation and steps[4].execution_time < 0.1
    assert steps[5].timed_out
    assert "TIMED OUT BECAUSE THE COMMAND WAS RUNNING FOR MORE THAN 0.5 SECONDS" in steps[5].observation
    assert not steps[6].timed_out and "trained" in steps[6].observation  # python gets the training timeout
    assert steps[7].observation.strip() == "/" and steps[7].exit_code == 0
    next_obs = [m["content"] for m in traj.history if m["role"] == "user"]
    assert f"(Open file: {session.workdir}/src/main.py)" in next_obs[3]


def test_history_keeps_only_the_last_five_observations(tmp_path: Path, session: Session) -> None:
    ep = Episode(tmp_path, session, [cmd(f"echo out{i}") for i in range(8)] + [cmd("submit")])
    traj = ep.run()
    last = ep.requests()[-1]
    users = [m["content"] for m in last if m["role"] == "user"]
    assert users[0].startswith("We are solving this task")  # the task is never elided
    assert users[1:4] == ["Old output omitted (5 lines)"] * 3
    assert [u.split("\n", 1)[0] for u in users[4:]] == [f"out{i}" for i in range(3, 8)]
    # The history itself keeps everything.
    assert sum("out0" in m["content"] for m in traj.history if m["role"] == "user") == 1
    assert_history_reproduces_requests(traj, ep.requests())
    assert [m["content"] for m in last if m["role"] == "assistant"] == [cmd(f"echo out{i}") for i in range(8)]


def test_max_steps_autosubmits(tmp_path: Path, session: Session) -> None:
    ep = Episode(tmp_path, session, [cmd("echo 0.3 > submission.csv"), cmd("echo 0.4 > submission.csv")], max_steps=2)
    traj = ep.run()
    assert ep.server.count == 2  # no model call for a step that cannot be taken
    assert traj.info.exit_status == "autosubmission (max_steps)"
    assert traj.info.score == [{"score": 0.4}] and traj.info.submission
    assert traj.trajectory[-1].action == "exit_max_steps" and traj.trajectory[-1].observation == "Exited (max_steps)"
    assert "Remaining Steps: 0" in traj.history[-1]["content"]


def test_cost_limit_autosubmits(tmp_path: Path, session: Session) -> None:
    replies = [cmd("echo 1 > submission.csv"), cmd("echo 2 > submission.csv")]
    ep = Episode(tmp_path, session, replies, cost_limit_usd=1e-6)
    traj = ep.run()
    assert ep.server.count == 1 and traj.info.exit_status == "autosubmission (cost)"
    assert traj.info.score == [{"score": 1.0}]


def test_context_limit_autosubmits_before_sending(tmp_path: Path, session: Session) -> None:
    (session.workspace / "submission.csv").write_text("0.1")
    ep = Episode(tmp_path, session, [cmd("ls")], context_limit_tokens=50)
    traj = ep.run()
    assert ep.server.count == 0 and traj.info.exit_status == "autosubmission (context)"
    assert traj.info.score == [{"score": 0.1}]


def test_context_limit_uses_reported_usage(tmp_path: Path, session: Session) -> None:
    (session.workspace / "submission.csv").write_text("0.1")
    replies = [completion(cmd("ls"), prompt_tokens=90_000), cmd("ls")]
    ep = Episode(tmp_path, session, replies, context_limit_tokens=50_000)
    traj = ep.run()
    assert ep.server.count == 1 and traj.info.exit_status == "autosubmission (context)"


def test_three_malformed_replies_end_the_run(tmp_path: Path, session: Session) -> None:
    (session.workspace / "submission.csv").write_text("0.2")
    bad = ["I would like to run ls.", "```\nls\n```\n```\npwd\n```", "```\n\n```"]
    ep = Episode(tmp_path, session, [cmd("echo hi"), *bad])
    traj = ep.run()
    assert ep.server.count == 4
    assert traj.info.exit_status == "autosubmission (format)" and traj.info.score == [{"score": 0.2}]
    last = traj.trajectory[-1]
    assert last.action == "exit_format" and last.response == bad[-1]
    assert [r["response"] for r in last.format_errors] == bad
    assert "no command block" in last.format_errors[0]["error"]
    # Each retry shows the model its rejected reply and the format-error prompt after the same history.
    first, retry1, retry2 = ep.requests()[1:]
    assert retry1[:-2] == first and retry1[-2] == {"role": "assistant", "content": bad[0]}
    assert retry1[-1]["content"].startswith("Your reply could not be used: the reply has no command block")
    assert retry2[-2]["content"] == bad[1] and "2 command blocks" in retry2[-1]["content"]
    # Rejected replies never enter the history.
    assert [m["content"] for m in traj.history if m["role"] == "assistant"] == [cmd("echo hi")]


def test_a_corrected_reply_continues_the_run(tmp_path: Path, session: Session) -> None:
    ep = Episode(tmp_path, session, ["no block here", cmd("echo 0.9 > submission.csv"), cmd("submit")])
    traj = ep.run()
    assert traj.info.exit_status == "submitted" and traj.info.score == [{"score": 0.9}]
    assert len(traj.trajectory[0].format_errors) == 1 and traj.info.model_stats.api_calls == 3
    assert_history_reproduces_requests(traj, ep.requests())


def test_evaluation_failures(tmp_path: Path, session: Session) -> None:
    ep = Episode(tmp_path, session, [cmd("validate"), cmd("echo abc > submission.csv"), cmd("validate"), cmd("submit")])
    traj = ep.run()
    assert "Submission artefact not found: submission.csv does not exist" in traj.trajectory[0].observation
    assert "does not hold a number" in traj.trajectory[2].observation
    assert traj.info.exit_status == "evaluation_format_error (submit)" and traj.info.score == []
    assert json.loads((ep.out / "results.json").read_text()) == {"agent": [], "baseline": {"score": 0.25}}


def test_episodes_run_concurrently(tmp_path: Path) -> None:
    sandbox = get_sandbox("local")
    agents, servers = [], []
    for i in range(2):
        ws = tmp_path / f"ws{i}"
        ws.mkdir()
        session = sandbox.open(ws, limits=Limits())
        ep = Episode(tmp_path / f"e{i}", session, [cmd(f"sleep 3; echo {i} > submission.csv"), cmd("submit")])
        agents.append(ep.agent)
        servers.append(ep.server)

    async def both() -> tuple[list[Any], float]:
        t0 = asyncio.get_running_loop().time()
        trajs = await asyncio.gather(*(a.arun() for a in agents))
        return trajs, asyncio.get_running_loop().time() - t0

    try:
        trajs, elapsed = asyncio.run(both())
    finally:
        for a, s in zip(agents, servers, strict=True):
            s.stop()
            a.session.close()
    assert [t.info.score for t in trajs] == [[{"score": 0.0}], [{"score": 1.0}]]
    # The two three-second commands overlapped: run one after the other they take 6 s before any overhead
    # (the margin is for a loaded machine's sandbox and evaluation overhead).
    assert elapsed < 6


# ---- limits, confinement, tool errors -------------------------------------------------------------------


class LimitedSession:
    """A session whose every command was stopped by an episode limit."""

    confinement = "bwrap"

    def __init__(self, workspace: Path, limit: str | None) -> None:
        self.workspace, self.workdir, self.cwd, self.limit = workspace, "/workspace", "/workspace", limit

    def run(self, command: str, timeout: float) -> ExecResult:
        return ExecResult(output="x" * 200 + "\nKilled\n", exit_code=137, timed_out=False, duration_s=0.1,
                          limit=self.limit)


def replayed(tmp_path: Path, session: Any, commands: list[str], **config: Any) -> Any:
    from gymforge.tools.run_task import ReplayModel

    model = ReplayModel([cmd(c) for c in commands], model="replay")
    return Agent(model, session, FileEvaluator(session.workspace), TASK, AgentConfig(**config),  # type: ignore[arg-type]
                 meta={"sandbox": "local"}).run()


def test_the_limit_that_stopped_a_command_ends_the_observation_and_is_recorded(tmp_path: Path) -> None:
    limit = "memory limit, 2048 MiB for the episode"
    traj = replayed(tmp_path, LimitedSession(tmp_path, limit), ["python train.py"], max_observation_chars=100)
    step = traj.trajectory[0]
    assert step.limit == limit and step.exit_code == 137
    # Truncation keeps the head and tail of the output; the limit line comes after it, never cut.
    assert "characters omitted" in step.observation
    assert step.observation.endswith(f"Killed\n[the command was stopped: {limit}]")
    assert f"[the command was stopped: {limit}]" in traj.history[3]["content"]  # what the agent saw next
    assert traj.info.confinement == "bwrap" and traj.info.sandbox == "local"
    raw = json.loads(traj.model_dump_json())
    assert raw["trajectory"][0]["limit"] == limit and raw["info"]["confinement"] == "bwrap"

    unlimited = replayed(tmp_path, LimitedSession(tmp_path, None), ["python train.py"])
    assert unlimited.trajectory[0].limit is None and "stopped" not in unlimited.trajectory[0].observation


def test_a_session_without_confinement_attribute_records_none(tmp_path: Path, session: Session) -> None:
    traj = replayed(tmp_path, session, ["echo 0.5 > submission.csv", "submit"])
    assert traj.info.confinement == getattr(session, "confinement", None)
    assert traj.info.exit_status == "submitted"


@pytest.mark.parametrize(("error", "shown"), [
    (lambda ws: OSError(40, "Too many levels of symbolic links", f"{ws}/loop"), "Error: Too many levels of symbolic links"),
    (lambda ws: RecursionError("maximum recursion depth exceeded"), "Error: maximum recursion depth exceeded"),
    (lambda ws: RuntimeError(f"Symlink loop from '{ws}/loop'"), "Error: Symlink loop from '{workdir}/loop'"),
    (lambda ws: UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), "Error: 'utf-8' codec can't decode"),
])
def test_a_file_tool_error_becomes_an_observation(tmp_path: Path, session: Session, error: Any, shown: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from gymforge.agent.tools import FileTools

    def boom(self: Any, action: str, cwd: str) -> str:
        raise error(session.workspace)

    monkeypatch.setattr(FileTools, "run", boom)
    traj = replayed(tmp_path, session, ["open loop", "echo 0.5 > submission.csv", "submit"])
    observation = traj.trajectory[0].observation
    assert observation.startswith(shown.format(workdir=session.workdir))
    if session.workdir != str(session.workspace):  # no host path reaches the agent
        assert str(session.workspace) not in observation
    assert traj.info.exit_status == "submitted" and traj.info.score == [{"score": 0.5}]


def test_a_symlink_loop_is_an_observation_not_a_crash(tmp_path: Path, session: Session) -> None:
    traj = replayed(tmp_path, session, ["ln -s loop loop", "open loop", "create loop", "echo 1 > submission.csv",
                                        "submit"])
    assert [s.observation.startswith("Error") for s in traj.trajectory[1:3]] == [True, True]
    assert traj.info.exit_status == "submitted"
