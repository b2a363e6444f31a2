"""gymforge tasks as TRL environments: `GRPOTrainer(environment_factory=GymforgeEnv)` (docs/interop.md).

TRL drives a rollout through a Python object: `reset(**row)` returns text that is appended to the row's prompt, the
object's public methods are the tools the model may call, and `get_reward()` scores the rollout once it ended. Here
that object is an episode of gymforge's own agent loop with TRL in the model's seat:

- `reset(task=...)` installs the task in the configured sandbox exactly as an episode does (`EpisodeRunner`: backend,
  limits, dataset cache, hidden columns) and returns the task's first message as the loop renders it;
- each tool call is one step of the loop (`Agent`'s own command dispatch): the shell with its short and training
  timeouts, the file commands, `validate`, `submit` and a task kind's extra commands, each audited and recorded in
  the episode's trajectory; the step budget auto-submits as the loop does;
- `get_reward()` auto-submits an episode the model left unfinished (as the loop does when a reply carries no command)
  and returns `gymforge.rl.rewards.episode_reward` of the trajectory, shaped by `rl.reward`.

`task_rows` turns a results directory into the dataset TRL expects (one row per verified task or micro variant).
"""

from __future__ import annotations

import asyncio
import json
import shlex
import shutil
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Coroutine, TypeVar

from gymforge.agent.loop import Agent, AgentConfig, AgentTask, _Reply
from gymforge.core.config import GymforgeConfig
from gymforge.core.prompts import render
from gymforge.core.records import Trajectory
from gymforge.rl.rewards import Episode, Reward, TaskMetric, episode_reward
from gymforge.rl.rollouts import load_task
from gymforge.tasks.episode import EpisodeRunner
from gymforge.tasks.metrics import metric_direction
from gymforge.tasks.workflow import skills_for

_T = TypeVar("_T")

ENDED = "The episode has ended; no further command runs."


class _Policy:
    """What `Agent` reads of its model when TRL is the model: a name for the trajectory's meta. It is never asked."""

    endpoint = SimpleNamespace(model="trl-policy", provider="trl")

    async def achat(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a TRL-driven episode takes its actions from the tool calls, never from a model")


class DrivenEpisode(Agent):
    """The agent loop with its actions given from outside, one at a time: `begin()`, then `act(action)` until
    `done`, or `finish(reason)`. Every action goes through the loop's own dispatch, audit and recording."""

    def begin(self) -> str:
        """Start the audit and write the first two messages; the task's first message (the user turn)."""
        if self.audit is not None:
            self.audit.start()
        self._say("system", _render("agent_system", window=self.cfg.window))
        first = _render(
            "agent_task", description=self.task.description,
            baseline=json.dumps(self.task.baseline) if self.task.baseline else None, max_steps=self.cfg.max_steps,
            training_timeout=f"{self.task.training_timeout:g}", short_timeout=f"{self.cfg.short_timeout_s:g}",
            extra=self.commands.instructions().strip() if self.commands is not None else "", **self._status())
        self._say("user", first)
        return first

    @property
    def done(self) -> bool:
        return self.traj.info.exit_status is not None

    async def act(self, action: str, thought: str = "") -> str:
        """One step of the loop with `action` as the model's command; the observation the model is shown."""
        if self.done:
            return ENDED
        state = json.dumps({"open_file": self.files.open_file, "working_dir": self.session.cwd})
        if self.step >= self.cfg.max_steps:
            await self._autosubmit("max_steps", state)
            return self.traj.trajectory[-1].observation
        self._say("assistant", action, thought=thought, action=action)
        self.step += 1
        t0 = asyncio.get_running_loop().time()
        outcome = await self._act(action)
        seconds = asyncio.get_running_loop().time() - t0
        self.traj.info.failed_actions += outcome.failed
        self._trained |= outcome.trained
        flags = await self._audit(action, json.loads(state)["working_dir"])
        self._record(_Reply(response=action, thought=thought, action=action), state, outcome.observation, seconds,
                     exit_code=outcome.exit_code, timed_out=outcome.timed_out, limit=outcome.limit, flags=flags)
        if not outcome.done:
            self._say("user", _render("agent_next_step", observation=outcome.observation, **self._status()))
        if not outcome.done and self.step >= self.cfg.max_steps:  # the budget is spent: the loop auto-submits
            await self._autosubmit("max_steps", state)
            return outcome.observation + "\n" + self.traj.trajectory[-1].observation
        return outcome.observation

    async def finish(self, reason: str) -> None:
        """Auto-submit an episode that is still open (`reason`: what ended it, as the loop names it)."""
        if not self.done:
            state = json.dumps({"open_file": self.files.open_file, "working_dir": self.session.cwd})
            await self._autosubmit(reason, state)


def _render(name: str, **context: Any) -> str:
    return render(name, **context).rstrip()  # as the loop renders it: the text ends at the `bash-$` prompt


@dataclass
class TaskRow:
    """One task of the dataset TRL reads: where the task is, how its metric ranks, what the agent is shown."""

    task: str  # the task YAML
    root: str  # the MLGym tree its paths are relative to
    metric: str
    higher_is_better: bool
    baseline: str  # JSON of the baseline metrics ("" when unknown)
    hidden_columns: str  # JSON of split -> hidden columns ("" when none)
    slot: str = ""

    def as_row(self, prompt: str = "") -> dict[str, Any]:
        return {"prompt": [{"role": "user", "content": prompt}], **self.__dict__}


def task_row(task_yaml: Path, *, root: Path | None = None, baseline: dict[str, float] | None = None,
             metric: str | None = None, hidden_columns: dict[str, list[str]] | None = None, slot: str = "") -> TaskRow:
    """The row of one task YAML; the metric defaults to the baseline's only (or first) key, its direction to the
    metric name's usual one (`gymforge.tasks.metrics.metric_direction`)."""
    name = metric or (next(iter(baseline)) if baseline else "")
    key, higher = metric_direction(name)
    root = Path(root) if root is not None else Path(task_yaml).resolve().parents[2]
    return TaskRow(task=str(Path(task_yaml).resolve()), root=str(root.resolve()), metric=key or name,
                   higher_is_better=higher, baseline=json.dumps(baseline) if baseline else "",
                   hidden_columns=json.dumps(hidden_columns) if hidden_columns else "", slot=slot)


def task_rows(results: Path, *, micro: bool = False, prompt: str = "") -> list[dict[str, Any]]:
    """The dataset rows of a results directory: every verified environment (`micro`: every micro variant instead),
    with the metric and baseline the RL stage reads (`gymforge.rl.rollouts.load_task`)."""
    results = Path(results)
    rows = []
    for report in sorted((results / ("micro" if micro else "environments")).glob("*/report.json")):
        slot = report.parent.name
        task = load_task(slot, report, report.parent / "verified", results / "proposals" / f"{slot}.json")
        if task is None:
            continue
        rows.append(TaskRow(task=str(task.task_yaml.resolve()), root=str(task.tree.resolve()),
                            metric=task.metric.metric, higher_is_better=task.metric.higher_is_better,
                            baseline=json.dumps(task.baseline) if task.baseline else "",
                            hidden_columns=json.dumps(task.hidden_columns) if task.hidden_columns else "",
                            slot=slot).as_row(prompt))
    return rows


@dataclass
class Finished:
    """One ended episode: its trajectory, the task's metric and the reward `get_reward` returned."""

    task: TaskRow
    trajectory: Trajectory
    metric: TaskMetric
    reward: Reward


class GymforgeEnv:
    """One gymforge episode per rollout for `GRPOTrainer(environment_factory=...)`.

    Configure the class (not the instance: TRL constructs it with no arguments) with `GymforgeEnv.configure(cfg)`,
    or subclass it and set `config`. `finished` collects every ended episode of the process (oldest first), so a
    caller can check the rewards TRL recorded against the trajectories.
    """

    config: GymforgeConfig | None = None
    max_steps: int | None = None  # None: trajectories.max_steps
    work_dir: Path | None = None  # where episode workspaces go (None: a temporary directory)
    finished: list[Finished] = []
    _count = 0
    _count_lock = threading.Lock()

    @classmethod
    def configure(cls, config: GymforgeConfig, *, max_steps: int | None = None, work_dir: Path | None = None) -> None:
        cls.config, cls.max_steps, cls.work_dir = config, max_steps, work_dir
        cls.finished = []

    def __init__(self) -> None:
        cfg = type(self).config or GymforgeConfig()
        self._cfg = cfg
        self._runner = EpisodeRunner.for_config(cfg, 0)
        # One thread owns the sandbox session for its whole life (a bwrap sandbox dies with the thread that
        # started it), and one event loop on another thread runs the loop's coroutines for the sync tool calls.
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="gymforge-trl")
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, daemon=True, name="gymforge-trl-loop").start()
        self._episode: DrivenEpisode | None = None
        self._env: Any = None
        self._session: Any = None
        self._row: TaskRow | None = None
        self._run_dir: Path | None = None
        self._reward: float | None = None

    # -- TRL's lifecycle ------------------------------------------------------------------------------

    def reset(self, task: str | None = None, root: str = "", metric: str = "", higher_is_better: bool = True,
              baseline: str = "", hidden_columns: str = "", slot: str = "", **_: Any) -> str:
        if task is None:
            raise ValueError("GymforgeEnv.reset needs `task` (the task YAML) from the dataset row (see task_rows)")
        self._close()
        row = TaskRow(task=task, root=root or str(Path(task).resolve().parents[2]), metric=metric,
                      higher_is_better=bool(higher_is_better), baseline=baseline, hidden_columns=hidden_columns,
                      slot=slot)
        self._row, self._reward = row, None
        base = json.loads(baseline) if baseline else None
        hidden = json.loads(hidden_columns) if hidden_columns else None
        with GymforgeEnv._count_lock:
            GymforgeEnv._count += 1
            n = GymforgeEnv._count
        parent = Path(type(self).work_dir) if type(self).work_dir else Path(tempfile.gettempdir())
        parent.mkdir(parents=True, exist_ok=True)
        self._run_dir = Path(tempfile.mkdtemp(prefix=f"trl-{Path(task).stem}-{n}-", dir=parent))
        workflow = self._runner.interface == "workflow"
        env = self._runner.environment(Path(task), root=Path(row.root), run_dir=self._run_dir / "run",
                                       hidden_columns=hidden, skills=workflow)
        self._env = env

        def start() -> tuple[Any, Any]:
            env.install()
            session = env.open_session()
            return session, (skills_for(env, base) if workflow else None)

        self._session, skills = self._pool.submit(start).result()
        max_steps = type(self).max_steps or self._cfg.trajectories.max_steps
        agent_task = AgentTask(id=env.task.id, description=env.description, baseline=base, training_timeout=env.timeout)
        self._episode = DrivenEpisode(
            _Policy(), self._session, env, agent_task, AgentConfig(max_steps=max_steps), mounts=env.mounts,
            meta={"stage": "trl", "slot": slot, "sandbox": self._runner.sandbox.name}, commands=skills)
        self._episode._pool = self._pool  # the loop's blocking calls run in the session's thread
        return self._pool.submit(self._episode.begin).result()

    def get_reward(self) -> float:
        """The episode's shaped reward (`rl.reward`); an unfinished episode is auto-submitted first."""
        if self._reward is not None:
            return self._reward
        if self._episode is None or self._row is None:
            return 0.0
        self._run(self._episode.finish("format"))
        metric = TaskMetric(metric=self._row.metric, higher_is_better=self._row.higher_is_better,
                            baseline=_baseline_value(self._row))
        reward = episode_reward(Episode.of(self._episode.traj), metric, self._cfg.rl.reward)
        self._reward = reward.reward
        type(self).finished.append(Finished(self._row, self._episode.traj, metric, reward))
        self._close()
        return self._reward

    @property
    def trajectory(self) -> Trajectory | None:
        return self._episode.traj if self._episode is not None else None

    # -- the tools: the agent's commands --------------------------------------------------------------

    def shell(self, command: str) -> str:
        """
        Run one non-interactive bash command in the task's workspace; the shell keeps its directory and exported
        variables between calls. Commands that run python may run up to the task's training timeout, others briefly.

        Args:
            command: The bash command line to run.

        Returns:
            The command's output.
        """
        return self._act(command)

    def open(self, path: str, line_number: int = 0) -> str:
        """
        Open a file of the workspace and show a window of its lines, from the start or around a line.

        Args:
            path: The file to open.
            line_number: The line to show around (0: from the start).

        Returns:
            The numbered lines shown.
        """
        return self._act(f"open {shlex.quote(path)}" + (f" {int(line_number)}" if line_number else ""))

    def goto(self, line_number: int) -> str:
        """
        Show the open file around a line.

        Args:
            line_number: The line to show.

        Returns:
            The numbered lines shown.
        """
        return self._act(f"goto {int(line_number)}")

    def scroll_down(self) -> str:
        """
        Show the next window of lines of the open file.

        Returns:
            The numbered lines shown.
        """
        return self._act("scroll_down")

    def scroll_up(self) -> str:
        """
        Show the previous window of lines of the open file.

        Returns:
            The numbered lines shown.
        """
        return self._act("scroll_up")

    def create(self, path: str) -> str:
        """
        Create a new, empty file and open it.

        Args:
            path: The file to create.

        Returns:
            What was done.
        """
        return self._act(f"create {shlex.quote(path)}")

    def edit(self, start_line: int, end_line: int, replacement: str) -> str:
        """
        Replace lines start_line to end_line (both included) of the open file with new lines. In a Python file an
        edit that would add a syntax error or an undefined name is refused.

        Args:
            start_line: The first line replaced.
            end_line: The last line replaced.
            replacement: The new lines, with their full indentation.

        Returns:
            The edited region, or why the edit was refused.
        """
        return self._act(f"edit {int(start_line)}:{int(end_line)}\n{replacement.rstrip(chr(10))}\nend_of_edit")

    def insert(self, line_number: int, text: str) -> str:
        """
        Insert lines after a line of the open file (0 inserts at the top).

        Args:
            line_number: The line after which the text goes.
            text: The new lines.

        Returns:
            The edited region, or why the insertion was refused.
        """
        return self._act(f"insert {int(line_number)}\n{text.rstrip(chr(10))}\nend_of_insert")

    def search_dir(self, term: str, directory: str = "") -> str:
        """
        List the files under a directory that contain a literal term.

        Args:
            term: The text to look for.
            directory: Where to look (empty: the current directory).

        Returns:
            The matching files.
        """
        return self._act(f"search_dir {shlex.quote(term)}" + (f" {shlex.quote(directory)}" if directory else ""))

    def search_file(self, term: str, path: str = "") -> str:
        """
        Show the lines of a file that contain a literal term.

        Args:
            term: The text to look for.
            path: The file (empty: the open file).

        Returns:
            The matching lines.
        """
        return self._act(f"search_file {shlex.quote(term)}" + (f" {shlex.quote(path)}" if path else ""))

    def find_file(self, name: str, directory: str = "") -> str:
        """
        Find files whose name matches (wildcards * and ? allowed) under a directory.

        Args:
            name: The file name or pattern.
            directory: Where to look (empty: the current directory).

        Returns:
            The matching paths.
        """
        return self._act(f"find_file {shlex.quote(name)}" + (f" {shlex.quote(directory)}" if directory else ""))

    def validate(self) -> str:
        """
        Evaluate the current submission artefact and show its score next to the baseline's; the task goes on.

        Returns:
            The score, or why there was nothing to score.
        """
        return self._act("validate")

    def submit(self) -> str:
        """
        Evaluate the current submission artefact as the final answer and end the task.

        Returns:
            What the final evaluation found.
        """
        return self._act("submit")

    def skill(self, command: str) -> str:
        """
        Run one of the task's extra commands (a post-training task's workflow skills, listed in the task's text).

        Args:
            command: The extra command line, its name first.

        Returns:
            The command's output.
        """
        episode = self._episode
        if episode is not None and (episode.commands is None or command.split(None, 1)[:1] == []
                                    or command.split(None, 1)[0] not in episode.commands.names):
            return "Error: this task has no such extra command; use shell for bash commands"
        return self._act(command)

    # -- plumbing -------------------------------------------------------------------------------------

    def _act(self, action: str) -> str:
        if self._episode is None:
            return "Error: no task is installed (reset first)"
        return self._run(self._episode.act(action))

    def _run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _close(self) -> None:
        """Close the episode's session and remove its workspace (the trajectory stays)."""
        session, run_dir = self._session, self._run_dir
        self._session, self._run_dir = None, None
        if session is not None:
            self._pool.submit(session.close).result()
        if run_dir is not None:
            shutil.rmtree(run_dir, ignore_errors=True)

    def __del__(self) -> None:
        try:
            self._close()
            self._pool.shutdown(wait=False)
            self._loop.call_soon_threadsafe(self._loop.stop)
        except Exception:  # noqa: BLE001 - best-effort teardown at interpreter exit
            pass


def _baseline_value(row: TaskRow) -> float | None:
    if not row.baseline:
        return None
    value = json.loads(row.baseline).get(row.metric)
    return float(value) if isinstance(value, (int, float)) else None
