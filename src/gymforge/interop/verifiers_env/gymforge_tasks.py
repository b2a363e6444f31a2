"""gymforge's verified tasks as a verifiers 0.4 environment (`verifiers.v1`), played by gymforge's own agent loop.

verifiers loads a taskset by its id as an installed module exporting, in `__all__`, a `Taskset` subclass and
(optionally) the `Harness` that plays it by default: `vf-eval gymforge-tasks ...` imports this module. It imports
nothing of gymforge (verifiers and gymforge need different `openai` majors, so they live in two venvs); everything
gymforge does runs in gymforge's Python (`GymforgeTasksetConfig.python`, `GymforgeHarnessConfig.python`, default
`$GYMFORGE_PYTHON`, else `python3`) as `gymforge.interop.verifiers_bridge`:

- `GymforgeTaskset`: one task per verified environment (or micro variant) of a gymforge results directory, the rows
  that TRL's `GymforgeEnv` also reads (`bridge rows`);
- `GymforgeHarness`: the program of a rollout is `gymforge run-task --policy teacher` on the task (`bridge
  episode`), whose teacher is verifiers' interception endpoint, so verifiers records every model call. The loop is
  gymforge's: one command per reply, the file commands, validate/submit, the audit after each step, the step budget
  and training timeouts, the agent's commands confined in gymforge's sandbox (`sandbox`: local bubblewrap or docker).
  verifiers' runtime only hosts that program: `subprocess` (the harness needs no container of verifiers');
- `GymforgeTask`: its reward `gymforge` is the rollout's reward as gymforge shapes it (`rl.reward`: milestones,
  flags, penalties; what TRL's environment returns), its metric `submission_score` the task's metric of the final submission,
  as gymforge's scorer measured it.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import verifiers.v1 as vf
from verifiers.v1.runtimes import ProgramResult, Runtime

KEY_ENV = "GYMFORGE_VERIFIERS_API_KEY"  # gymforge.interop.verifiers_bridge.KEY_ENV
BRIDGE = "gymforge.interop.verifiers_bridge"
REWARD_FILE = "gymforge-reward.json"  # in the runtime's working directory


def gymforge_python(value: str) -> str:
    return value or os.environ.get("GYMFORGE_PYTHON") or "python3"


class GymforgeTasksetConfig(vf.TasksetConfig):
    results: str = ""
    """A gymforge results directory: its verified environments are the tasks."""
    micro: bool = False
    """Its micro variants instead."""
    python: str = ""
    """The Python that has gymforge installed (default: $GYMFORGE_PYTHON, else python3)."""


class GymforgeData(vf.TaskData):
    task: str
    """The task YAML."""
    root: str
    """The MLGym tree its paths are relative to."""
    metric: str
    higher_is_better: bool
    baseline: str = ""
    """JSON of the baseline's metrics ("" when unknown: run-task measures it)."""
    hidden_columns: str = ""
    """JSON of split -> columns hidden from the agent ("" when none)."""
    slot: str = ""


class GymforgeTask(vf.Task[GymforgeData]):
    async def _record(self, runtime: Runtime) -> dict[str, Any]:
        return json.loads(await runtime.read(REWARD_FILE))

    @vf.reward
    async def gymforge(self, runtime: Runtime) -> float:
        """The rollout's reward as gymforge shapes it (`rl.reward`)."""
        return float((await self._record(runtime))["reward"])

    @vf.metric
    async def submission_score(self, runtime: Runtime) -> float:
        """The task's metric of the final submission (NaN: nothing was scored)."""
        value = (await self._record(runtime))["score"]
        return float("nan") if value is None else float(value)


class GymforgeTaskset(vf.Taskset[GymforgeTask, GymforgeTasksetConfig]):
    def load(self) -> Iterator[GymforgeTask]:
        if not self.config.results:
            raise ValueError("the gymforge taskset needs a results directory: --env.taskset.results DIR")
        command = [gymforge_python(self.config.python), "-m", BRIDGE, "rows", self.config.results]
        if self.config.micro:
            command.append("--micro")
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} exited {done.returncode}: {done.stderr.strip()[-2000:]}")
        for row in json.loads(done.stdout):
            # The prompt only names the task: the agent loop renders the task's first message itself (the first
            # request of the trace shows it).
            yield GymforgeTask(GymforgeData(
                id=row["slot"] or None, name=os.path.basename(row["task"]).removesuffix(".yaml"),
                prompt=f"gymforge task {row['slot'] or row['task']}", **row), self.config.task)


class GymforgeHarnessConfig(vf.HarnessConfig):
    python: str = ""
    """The Python that has gymforge installed (default: $GYMFORGE_PYTHON, else python3)."""
    config: str = ""
    """The gymforge config the episodes run under (sandbox, limits, rl.reward, the teacher's request settings; default:
    ./config.yaml of the runtime's working directory, else the defaults)."""
    sandbox: str = "local"
    """gymforge's sandbox for the agent's commands: local (bubblewrap) or docker."""
    max_steps: int = 50
    seed: int = 0
    keep: str = ""
    """A directory to keep each rollout's episode in (`<keep>/<trace id>/`: run config, trajectory, workspace);
    default: the runtime's working directory, removed with it."""


class GymforgeHarness(vf.Harness[GymforgeHarnessConfig]):
    NEEDS_CONTAINER = False  # the program is gymforge, which confines the agent's commands in its own sandbox

    async def launch(self, ctx: Any, trace: Any, runtime: Runtime, endpoint: str, secret: str,
                     mcp_urls: dict[str, str], data: vf.TaskData) -> ProgramResult:
        row = {k: getattr(data, k) for k in GymforgeData.model_fields if k not in vf.TaskData.model_fields}
        out = os.path.join(self.config.keep, trace.id) if self.config.keep else "gymforge-episode"
        command = [gymforge_python(self.config.python), "-m", BRIDGE, "episode", json.dumps(row),
                   "--base-url", endpoint, "--model", ctx.model, "--out", out, "--reward", REWARD_FILE,
                   "--sandbox", self.config.sandbox, "--max-steps", str(self.config.max_steps),
                   "--seed", str(self.config.seed)]
        if self.config.config:
            command += ["--config", os.path.abspath(self.config.config)]
        return await runtime.run_program(command, {**self.config.resolved_env, KEY_ENV: secret})


__all__ = ["GymforgeHarness", "GymforgeTaskset"]
