"""The agent loop: ask the model, run its one command, show the output; until submit or a limit.

Every turn the model sees `build_messages(history)`: the full history with all but the last few
observations elided. Rejected (badly formatted) replies never enter the history, as in MLGym; each
step lists them under `format_errors`, so every request that was sent can be rebuilt from the file.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence, TypeVar

import openai
from pydantic import BaseModel, ConfigDict, Field

from gymforge.agent.audit import Auditor
from gymforge.agent.commands import CommandResult, Commands
from gymforge.agent.errors import EvaluationFormatError, SubmissionNotFound
from gymforge.agent.parsing import FormatError, parse_reply
from gymforge.agent.tools import FILE_COMMANDS, FileTools, Workspace, blocked, is_training_command
from gymforge.agent.trajectory import KEEP_OBSERVATIONS, build_messages, write_results, write_trajectory
from gymforge.core.prompts import render
from gymforge.core.records import Exit, ExitStatus, Flag, Trajectory, TrajectoryStep
from gymforge.core.tokens import Sampled, encode_records
from gymforge.llm.client import BudgetExceeded, ChatResult, LLMClient
from gymforge.sandbox import ExecResult, Mount

log = logging.getLogger("gymforge.agent")

_T = TypeVar("_T")


class Session(Protocol):
    """A persistent bash: cwd and exports survive between commands (gymforge.sandbox.Session)."""

    workspace: Path  # host path of the workspace
    workdir: str  # the workspace as the sandboxed code sees it
    cwd: str  # the shell's directory after the last command, as the sandboxed code sees it

    def run(self, command: str, timeout: float) -> ExecResult: ...


class TaskEvaluator(Protocol):
    def evaluate(self) -> tuple[dict[str, float], str]:
        """(metrics, artefact path) of the current artefact; raises SubmissionNotFound or EvaluationFormatError."""
        ...


class AgentTask(BaseModel):
    id: str
    description: str  # the full task text the agent sees, dataset docs already filled in
    baseline: dict[str, float] | None = None
    training_timeout: float = Field(3600, gt=0)


class AgentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_steps: int = Field(50, ge=1)
    window: int = Field(1000, ge=1, description="Lines the file viewer shows at once.")
    keep_observations: int = Field(KEEP_OBSERVATIONS, ge=0, description="Observations kept in full in the prompt.")
    short_timeout_s: float = Field(25, gt=0, description="Limit for commands that do not train.")
    context_limit_tokens: int | None = Field(None, ge=1)
    cost_limit_usd: float | None = Field(None, ge=0)
    max_format_retries: int = Field(2, ge=0)
    max_observation_chars: int = Field(50_000, ge=100, description="Longer outputs keep their head and tail.")
    name: str = "primary"


def _prompt(name: str, **context: Any) -> str:
    return render(name, **context).rstrip()  # observations end exactly at the `bash-$` prompt


def _estimate_tokens(messages: list[dict[str, str]]) -> int:
    return math.ceil(len(json.dumps(messages)) / 4)


def _truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    note = (
        f"\n[... {len(text) - 2 * half} characters omitted: redirect long output to a file and read it "
        "with head, tail or grep ...]\n"
    )
    return text[:half] + note + text[-half:]


@dataclass
class _Outcome:
    """What one action did."""

    observation: str
    done: bool = False
    exit_code: int | None = None
    timed_out: bool = False
    limit: str | None = None  # the sandbox limit that stopped the command, in words
    failed: bool = False  # a failed action: non-zero exit, timeout, refused command, tool error, nothing to score
    trained: bool = False  # it ran training that finished (a training command or a train skill that exited 0)


@dataclass
class _Reply:
    """One turn's answer from the model, after any format retries."""

    response: str = ""
    thought: str = ""
    action: str | None = None  # None: every attempt was malformed
    rejected: list[dict[str, str]] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    query_time: float = 0.0
    sampled: list[Sampled | None] = field(default_factory=list)  # each reply's tokens, rejected ones first


def timed_out_note(timeout: float) -> str:
    return f"\nEXECUTION TIMED OUT BECAUSE THE COMMAND WAS RUNNING FOR MORE THAN {timeout:g} SECONDS."


class Agent:
    """One episode: construct, then `await arun()` (or `run()`); writes `<task>.traj` and results.json to out_dir."""

    def __init__(
        self,
        llm: LLMClient,
        session: Session,
        evaluator: TaskEvaluator,
        task: AgentTask,
        config: AgentConfig | None = None,
        *,
        seed: int | None = None,
        mounts: Sequence[Mount] = (),
        out_dir: Path | None = None,
        meta: dict[str, Any] | None = None,
        commands: Commands | None = None,
    ) -> None:
        config = config if config is not None else AgentConfig()
        self.commands = commands  # a task kind's extra commands (gymforge.agent.commands), or None
        self.llm, self.session, self.evaluator, self.task, self.cfg = llm, session, evaluator, task, config
        self.seed = seed
        self.out_dir = out_dir
        # The session's mounts, so that file commands see the same files as the shell.
        self.files = FileTools(Workspace(session.workspace, session.workdir, mounts), config.window)
        ep = llm.endpoint
        meta = {"task_id": task.id, "model": ep.model, "provider": ep.provider, "seed": seed, **(meta or {})}
        self.traj = Trajectory(meta=meta)
        # What confined the episode: the backend's name (from the caller's meta) and the session's confinement.
        self.traj.info.sandbox = meta.get("sandbox")
        self.traj.info.confinement = getattr(session, "confinement", None)
        self.step = 0
        self._last_prompt_tokens = 0
        self._last_ids: list[int] = []  # the last recorded reply's prompt + completion ids (compact token records)
        self._trained = False  # training finished since the last scored evaluation
        self.audit: Auditor | None
        try:
            self.audit = Auditor.for_episode(session, evaluator)
        except Exception:  # the audit is evidence, never a reason for an episode to fail
            log.warning("%s: suspicious-action audit unavailable", task.id, exc_info=True)
            self.audit = None

    def run(self) -> Trajectory:
        return asyncio.run(self.arun())

    async def arun(self) -> Trajectory:
        # A thread of its own: many episodes share one event loop, and a training command may block
        # for an hour, which would starve a shared default executor.
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"agent-{self.task.id}")
        try:
            if self.audit is not None:
                await self._blocking(self.audit.start)
            self._say("system", _prompt("agent_system", window=self.cfg.window))
            self._say("user", _prompt(
                "agent_task",
                description=self.task.description,
                baseline=json.dumps(self.task.baseline) if self.task.baseline else None,
                max_steps=self.cfg.max_steps,
                training_timeout=f"{self.task.training_timeout:g}",
                short_timeout=f"{self.cfg.short_timeout_s:g}",
                extra=self.commands.instructions().strip() if self.commands is not None else "",
                **self._status(),
            ))
            while not await self._turn():
                self._save()
        finally:
            self._pool.shutdown(wait=False)
            # results.json only for an episode that ended; a crash leaves the partial .traj alone.
            self._save(final=self.traj.info.exit_status is not None)
        return self.traj

    async def _turn(self) -> bool:
        """One step of the episode; True when it has ended."""
        messages = build_messages(self.traj.history, self.cfg.keep_observations)
        state = json.dumps({"open_file": self.files.open_file, "working_dir": self.session.cwd})
        stats = self.traj.info.model_stats
        if self.step >= self.cfg.max_steps:
            return await self._autosubmit("max_steps", state)
        if self.cfg.cost_limit_usd is not None and stats.task_cost > self.cfg.cost_limit_usd:
            return await self._autosubmit("cost", state)
        if self.cfg.context_limit_tokens is not None and max(
            _estimate_tokens(messages), self._last_prompt_tokens
        ) > self.cfg.context_limit_tokens:
            return await self._autosubmit("context", state)
        reply = _Reply()
        try:
            await self._ask(messages, reply)
        except BudgetExceeded as err:
            log.warning("%s: run-wide LLM budget exhausted: %s", self.task.id, err)
            return await self._autosubmit("cost", state, reply)
        except openai.BadRequestError as err:
            if "context" not in str(err).lower():
                raise
            return await self._autosubmit("context", state, reply)
        except openai.OpenAIError as err:  # the client has already retried what can be retried
            log.warning("%s: endpoint failed: %s", self.task.id, err)
            return await self._autosubmit("api", state, reply)
        if reply.action is None:
            return await self._autosubmit("format", state, reply)

        self._say("assistant", reply.response, thought=reply.thought, action=reply.action)
        self.step += 1
        t0 = time.perf_counter()
        outcome = await self._act(reply.action)
        seconds = time.perf_counter() - t0
        self.traj.info.failed_actions += outcome.failed
        self._trained |= outcome.trained
        flags = await self._audit(reply.action, json.loads(state)["working_dir"])
        self._record(reply, state, outcome.observation, seconds, exit_code=outcome.exit_code,
                     timed_out=outcome.timed_out, limit=outcome.limit, flags=flags)
        if not outcome.done:
            self._say("user", _prompt("agent_next_step", observation=outcome.observation, **self._status()))
        return outcome.done

    async def _ask(self, messages: list[dict[str, str]], reply: _Reply) -> None:
        """Query the model, re-asking with the format-error prompt while the reply is malformed."""
        convo = messages
        for _ in range(self.cfg.max_format_retries + 1):
            t0 = time.perf_counter()
            result = await self.llm.achat(convo, seed=self.seed)
            reply.query_time += time.perf_counter() - t0
            self._account(result, reply, primary=convo is messages)
            reply.sampled.append(result.tokens)
            reply.response = result.content or ""
            try:
                reply.thought, reply.action = parse_reply(result.content)
                return
            except FormatError as err:
                reply.rejected.append({"response": reply.response, "error": str(err)})
                convo = [
                    *messages,
                    {"role": "assistant", "content": reply.response},
                    {"role": "user", "content": _prompt("agent_format_error", error=str(err))},
                ]

    async def _act(self, action: str) -> _Outcome:
        """What one command did; a limit that stopped it ends the observation, after any truncation."""
        if action in ("validate", "submit"):
            scored = len(self.traj.info.score)
            observation, done = await self._evaluate(action)
            return _Outcome(observation, done, failed=len(self.traj.info.score) == scored)
        name = action.split(None, 1)[0]
        if self.commands is not None and name in self.commands.names:
            return await self._command(action)
        if name in FILE_COMMANDS:
            observation = await self._file_command(action)
            failed = observation.startswith("Error:") or " was NOT applied" in observation
            return _Outcome(_truncate(observation, self.cfg.max_observation_chars), failed=failed)
        if reason := blocked(action):
            return _Outcome(reason, failed=True)
        training = is_training_command(action)
        result = await self._blocking(self.session.run, action, self._timeout(action))
        observation = result.output
        if result.timed_out:
            observation += timed_out_note(self._timeout(action))
        observation = _truncate(observation, self.cfg.max_observation_chars)
        limit = getattr(result, "limit", None)
        if limit:
            observation = observation.rstrip("\n") + f"\n[the command was stopped: {limit}]"
        failed = result.exit_code != 0 or result.timed_out
        return _Outcome(observation, False, result.exit_code, result.timed_out, limit, failed=failed,
                        trained=training and not failed)

    def _timeout(self, command: str) -> float:
        return self.task.training_timeout if is_training_command(command) else self.cfg.short_timeout_s

    async def _command(self, action: str) -> _Outcome:
        """An extra command (gymforge.agent.commands); one that crashes is a failed action, never a failed episode."""
        assert self.commands is not None
        try:
            result = await self._blocking(self.commands.run, action, _Host(self))
        except Exception as err:  # noqa: BLE001 - the model sees the class, the log the details
            log.warning("%s: command %r failed", self.task.id, action.split(None, 1)[0], exc_info=True)
            result = CommandResult(f"Error: the command failed ({type(err).__name__})", exit_code=1)
        observation = _truncate(result.observation, self.cfg.max_observation_chars)
        if result.limit:
            observation = observation.rstrip("\n") + f"\n[the command was stopped: {result.limit}]"
        failed = result.exit_code != 0 or result.timed_out
        return _Outcome(observation, False, result.exit_code, result.timed_out, result.limit, failed=failed,
                        trained=result.trained and not failed)

    async def _file_command(self, action: str) -> str:
        """A host-side file tool; any filesystem error it lets through becomes the observation, never a crash."""
        try:
            return await self._blocking(self.files.run, action, self.session.cwd)
        except (OSError, RuntimeError, ValueError) as err:  # RecursionError (symlink loops) is a RuntimeError
            log.warning("%s: file command %r failed: %r", self.task.id, action.split(None, 1)[0], err)
            message = str(err.strerror or err) if isinstance(err, OSError) else str(err) or type(err).__name__
            return "Error: " + message.replace(str(self.session.workspace), self.session.workdir)  # no host paths

    async def _audit(self, action: str, cwd: str) -> list[Flag]:
        """This step's suspicious-action flags (gymforge.agent.audit), also collected in the trajectory's info."""
        if self.audit is None:
            return []
        try:
            flags = await self._blocking(
                lambda: self.audit.check(action, cwd=cwd, open_file=self.files.open_file))  # type: ignore[union-attr]
        except Exception:
            log.warning("%s: audit of step %d failed", self.task.id, self.step, exc_info=True)
            return []
        step = self.step if not action.startswith("exit_") else self.step + 1
        for flag in flags:
            flag.step = step
            log.warning("%s: step %d flagged %s: %s", self.task.id, step, flag.code, flag.detail)
        self.traj.info.flags.extend(flags)
        self.traj.info.audit_notes = list(self.audit.notes)
        return flags

    async def _evaluate(self, reason: str) -> tuple[str, bool]:
        """Evaluate the current artefact for `validate` (the run goes on), `submit` or an auto-submission."""
        return await self._blocking(self._evaluation, reason)

    def _evaluation(self, reason: str) -> tuple[str, bool]:
        """`_evaluate`'s work, in the episode's worker thread (extra commands call it from there)."""
        info = self.traj.info
        final = reason != "validate"
        try:
            metrics, artefact = self.evaluator.evaluate()
        except SubmissionNotFound as err:
            if not final:
                return f"Submission artefact not found: {err}\nProduce the artefact the task asks for first.", False
            info.exit_status, info.exit_detail = str(Exit(ExitStatus.SUBMISSION_NOT_FOUND, reason)), str(err)
            return f"Exited ({reason}): submission artefact not found: {err}", True
        except EvaluationFormatError as err:
            if not final:
                return f"The evaluation could not read your submission: {err}", False
            info.exit_status, info.exit_detail = str(Exit(ExitStatus.EVALUATION_FORMAT_ERROR, reason)), str(err)
            return f"Exited ({reason}): the evaluation could not read the submission: {err}", True
        info.score.append(metrics)
        if self._trained:  # the first scored evaluation since training finished: a train-to-eval iteration
            info.train_eval_iterations += 1
            self._trained = False
        if not final:
            baseline = json.dumps(self.task.baseline) if self.task.baseline else "n/a (no baseline)"
            return (
                f"Your code produced a valid submission artefact at {artefact}.\n"
                f"Baseline Score: {baseline}\nEvaluation Score: {json.dumps(metrics)}"
            ), False
        info.submission = artefact
        ended = Exit(ExitStatus.SUBMITTED) if reason == "submit" else Exit(ExitStatus.AUTOSUBMISSION, reason)
        info.exit_status = str(ended)
        return f"Exited ({reason})", True

    async def _autosubmit(self, reason: str, state: str, reply: _Reply | None = None) -> bool:
        log.info("%s: auto-submitting (%s) after step %d", self.task.id, reason, self.step)
        reply = reply or _Reply()
        t0 = time.perf_counter()
        observation, _ = await self._evaluate(reason)
        reply.thought, reply.action = f"Exit due to {reason}", f"exit_{reason}"
        seconds = time.perf_counter() - t0
        flags = await self._audit(reply.action, json.loads(state)["working_dir"])  # what ran in the background
        self._record(reply, state, observation, seconds, step=self.step + 1, flags=flags)
        return True

    # -- bookkeeping ----------------------------------------------------------------------------

    def _status(self) -> dict[str, Any]:
        return {
            "current_step": self.step,
            "remaining_steps": self.cfg.max_steps - self.step,
            "open_file": self.files.open_file,
            "working_dir": self.session.cwd,
        }

    def _say(self, role: str, content: str, **extra: str) -> None:
        self.traj.history.append({"role": role, "content": content, "agent": self.cfg.name, **extra})

    def _account(self, result: ChatResult, reply: _Reply, *, primary: bool) -> None:
        stats = self.traj.info.model_stats
        stats.api_calls += 1
        stats.tokens_sent += result.prompt_tokens
        stats.tokens_received += result.completion_tokens
        stats.task_cost += result.cost_usd
        stats.total_cost += result.cost_usd
        reply.prompt_tokens += result.prompt_tokens
        reply.completion_tokens += result.completion_tokens
        reply.cost_usd += result.cost_usd
        if primary:  # a format retry's prompt carries the rejected reply, which the history will not
            self._last_prompt_tokens = result.prompt_tokens

    def _record(
        self, reply: _Reply, state: str, observation: str, seconds: float,
        *, step: int | None = None, exit_code: int | None = None, timed_out: bool = False, limit: str | None = None,
        flags: list[Flag] | None = None,
    ) -> None:
        tokens = None
        if any(s is not None for s in reply.sampled):  # a served model's replies: their tokens, compactly
            tokens = encode_records(reply.sampled, self._last_ids)
        if reply.sampled:
            last = reply.sampled[-1] if tokens is not None else None
            self._last_ids = [*last.prompt_ids, *last.ids] if last is not None else []
        self.traj.trajectory.append(TrajectoryStep(
            action=reply.action or "", observation=observation, response=reply.response, state=state,
            thought=reply.thought, execution_time=seconds, step=step or self.step, query_time=reply.query_time,
            prompt_tokens=reply.prompt_tokens, completion_tokens=reply.completion_tokens, cost_usd=reply.cost_usd,
            exit_code=exit_code, timed_out=timed_out, limit=limit, flags=[f.model_copy() for f in flags or []],
            format_errors=reply.rejected, tokens=tokens,
        ))

    def _save(self, final: bool = False) -> None:
        if self.out_dir is None:
            return
        write_trajectory(self.out_dir / f"{self.task.id}.traj", self.traj)
        if final:
            write_results(self.out_dir / "results.json", self.traj, self.task.baseline)

    async def _blocking(self, fn: Callable[..., _T], *args: Any) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)


class _Host:
    """The `CommandHost` the loop lends an extra command: the episode's shell and evaluation, run in the episode's
    worker thread (the command itself runs there)."""

    def __init__(self, agent: Agent) -> None:
        self._agent = agent

    @property
    def cwd(self) -> str:
        return self._agent.session.cwd

    @property
    def workdir(self) -> str:
        return self._agent.session.workdir

    def shell(self, command: str) -> ExecResult:
        return self._agent.session.run(command, self._agent._timeout(command))

    def validate(self) -> tuple[str, dict[str, float] | None]:
        scored = len(self._agent.traj.info.score)
        observation, _ = self._agent._evaluation("validate")
        score = self._agent.traj.info.score
        return observation, (score[-1] if len(score) > scored else None)
