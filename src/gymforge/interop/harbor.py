"""Harbor task folders, out and in (docs/interop.md).

Out: `export_task` writes one verified gymforge task as a Harbor task folder in the format of harbor 0.25
(`task.toml` schema_version "1.4", read by Harbor's `TaskConfig`):

    <task id>/
      task.toml                timeouts, cpus, memory, storage, gpus; a separate verifier; the artefact carried to it
      instruction.md           the task's own text, as the agent loop shows it, and where its files are
      environment/Dockerfile   FROM a configurable base image; the agent's files in /app
      environment/app/         the workspace as gymforge installs it: starter files and the data the agent may see
      tests/Dockerfile         the verifier's own image (the same base)
      tests/test.sh            runs verify.py, which writes /logs/verifier/reward.json
      tests/verify.py          (gymforge.interop.harbor_verifier, standard library only)
      tests/score.py           gymforge's scorer launcher (evalkit/score.py)
      tests/task/              the task's pristine evaluation script, starter files and data
      tests/answers/           the held-out answers (secret files, hidden columns); never in environment/
      tests/meta.json          metric, direction, baseline, artefact, the evaluation's arguments
      solution/solve.sh        reproduces the baseline

Only tasks whose artefact is data can leave this way today (CSVSubmissionTasks): their evaluation reads nothing of
the agent's code, so a verifier container with the answers is safe. The others are refused with the reason.

In: reading and running Harbor task folders is `gymforge.tasks.harbor`'s (re-exported here): `HarborTask`,
`run_harbor_task`, `docker_trial`, `HarborEnvironment`, `run_harbor_episode`; `sandbox_for_task` is the configured
backend with the GPUs a task declares.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gymforge.core import atomic
from gymforge.core.config import GymforgeConfig
from gymforge.core.records import VerificationReport
from gymforge.interop import harbor_verifier
from gymforge.interop.trl_env import task_rows
from gymforge.rl.rollouts import load_task
from gymforge.runtime import gpus
from gymforge.runtime.gpus import gpu_count, visible_devices
from gymforge.sandbox import Limits, SandboxBackend
from gymforge.tasks.environment import EVALKIT, TaskEnvironment
from gymforge.tasks.episode import sandbox_for
from gymforge.tasks.harbor import (HarborEnvironment, HarborRun, HarborTask, agent_image_tag, copy_tree, docker_trial,
                                   folder_digest, is_harbor_folder, run_harbor_episode, run_harbor_task)

__all__ = ["DEFAULT_IMAGE", "Exported", "HarborEnvironment", "HarborExportError", "HarborRun", "HarborTask",
           "SCHEMA_VERSION", "agent_image_tag", "docker_trial", "dump_toml", "export_results", "export_task",
           "harbor_task", "is_harbor_folder", "leased_sandbox", "run_harbor_episode", "run_harbor_task", "sandbox_for_task"]

SCHEMA_VERSION = "1.4"  # task.toml's schema_version in harbor 0.25.0 (harbor/models/task/config.py, TaskConfig)
HARBOR_VERSION = "0.25.0"
WORKDIR = "/app"
DEFAULT_IMAGE = "python:3.11-slim"
SUPPORTED = ("CSVSubmissionTasks",)


class HarborExportError(ValueError):
    """The task cannot be written as a Harbor task folder; the message says why."""


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string: JSON's escapes are TOML's
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {type(value).__name__}")


def dump_toml(data: dict[str, Any]) -> str:
    """TOML of a dict whose values are scalars, lists of scalars or (nested) tables of them."""
    lines: list[str] = []

    def table(prefix: str, body: dict[str, Any]) -> None:
        scalars = {k: v for k, v in body.items() if not isinstance(v, dict) and v is not None}
        if prefix and scalars:
            lines.append(f"\n[{prefix}]")
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in scalars.items())
        for k, v in body.items():
            if isinstance(v, dict):
                table(f"{prefix}.{k}" if prefix else k, v)

    table("", data)
    return "\n".join(lines).lstrip("\n") + "\n"


def _script(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


@dataclass
class Exported:
    task_id: str
    path: Path
    written: bool  # False: the folder was already there with the same contents


def export_task(task_yaml: Path, dest: Path, *, sandbox: SandboxBackend, root: Path | None = None,
                baseline: dict[str, float] | None = None, metric: str = "", higher_is_better: bool = True,
                hidden_columns: dict[str, list[str]] | None = None, limits: Limits | None = None,
                base_image: str = DEFAULT_IMAGE, scale_floor: float = 0.01, gpus: int = 0) -> Exported:
    """Write the Harbor task folder of one task at `dest` (atomically; left untouched when its contents would not
    change)."""
    limits = limits or Limits()
    with tempfile.TemporaryDirectory(prefix="harbor-export-") as scratch:
        env = TaskEnvironment(Path(task_yaml), root=root, sandbox=sandbox, run_dir=Path(scratch) / "run",
                              limits=limits, hidden_columns=hidden_columns, gpus=gpus)
        task = env.task
        if task.task_entrypoint not in SUPPORTED:
            raise HarborExportError(f"{task.id}: a {task.task_entrypoint} task cannot be exported yet: only tasks "
                                    f"whose artefact is data ({', '.join(SUPPORTED)}) run in a verifier container "
                                    "that holds the answers without running the agent's code")
        if any(not d.is_local for d in env.datasets):
            raise HarborExportError(f"{task.id}: loads a dataset from the hub by id; only local data is exported")
        env.install()
        name = metric or (next(iter(baseline)) if baseline else "")
        build = Path(scratch) / "folder"
        app = build / "environment" / "app"
        copy_tree(env.workspace, app)
        (build / "environment" / "Dockerfile").write_text(
            f"FROM {base_image}\nWORKDIR {WORKDIR}\nCOPY app/ {WORKDIR}/\n")
        tests = build / "tests"
        env.scoring._place_pristine(tests / "task", everything=True)  # the task's own files, never an agent's
        for target in env.installation.data_targets():
            copy_tree(env.workspace / target, tests / "task" / target)
        (tests / "answers").mkdir(parents=True)
        if env.secrets_dir.is_dir():
            copy_tree(env.secrets_dir, tests / "answers")
        shutil.copyfile(EVALKIT / "score.py", tests / "score.py")
        shutil.copyfile(harbor_verifier.__file__, tests / "verify.py")
        meta = {"task_id": task.id, "entrypoint": task.task_entrypoint, "artefact": "submission.csv",
                "script": task.evaluation_paths[0], "argv": ["--submission_file", "{scorer}/submission.csv"],
                "metric": name, "higher_is_better": higher_is_better,
                "baseline": (baseline or {}).get(name), "scale_floor": scale_floor, "timeout_s": env.timeout}
        (tests / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
        (tests / "Dockerfile").write_text(f"FROM {base_image}\nCOPY . /tests/\n")
        _script(tests / "test.sh", "#!/bin/bash\n# The task's own evaluation of the artefact in /app; writes "
                "/logs/verifier/reward.json.\nmkdir -p /logs/verifier\n"
                f"exec python3 /tests/verify.py /tests {WORKDIR} /logs/verifier\n")
        baseline_script = task.baseline_paths[0] if task.baseline_paths else None
        if baseline_script is None:
            raise HarborExportError(f"{task.id}: no baseline_paths, so there is no solution to write")
        _script(build / "solution" / "solve.sh", "#!/bin/bash\n# The task's baseline, as gymforge verified it.\n"
                f"set -e\ncd {WORKDIR}\npython3 {shlex.quote(baseline_script)}\n")
        (build / "instruction.md").write_text(
            f"{env.description.rstrip()}\n\nYour working directory is `{WORKDIR}`: the task's files are there, and "
            f"the evaluation reads `{WORKDIR}/submission.csv`.\n")
        config = {
            "schema_version": SCHEMA_VERSION,
            "source": "gymforge",
            "artifacts": [WORKDIR],
            "task": {"name": f"gymforge/{task.id}", "description": task.name or task.id},
            "metadata": {"gymforge_task": task.id, "metric": name, "higher_is_better": higher_is_better,
                         **({"baseline": float(baseline[name])} if baseline and name in baseline else {})},
            "verifier": {"timeout_sec": float(env.timeout) + 60.0, "environment_mode": "separate",
                         "network_mode": "no-network"},
            "agent": {"timeout_sec": float(env.timeout) * 4},
            "environment": {"network_mode": "no-network", "workdir": WORKDIR, "cpus": 1,
                            "memory_mb": int(limits.memory_mb), "storage_mb": int(limits.disk_mb), "gpus": int(gpus)},
        }
        (build / "task.toml").write_text(dump_toml(config))
        dest = Path(dest)
        if dest.is_dir() and folder_digest(dest) == folder_digest(build):
            return Exported(task.id, dest, False)
        with atomic.directory(dest) as tmp:
            copy_tree(build, tmp)
            for script in (tmp / "tests" / "test.sh", tmp / "solution" / "solve.sh"):
                script.chmod(0o755)
        return Exported(task.id, dest, True)


def export_results(results: Path, out: Path, *, sandbox: SandboxBackend, micro: bool = False,
                   base_image: str = DEFAULT_IMAGE, limits: Limits | None = None,
                   scale_floor: float = 0.01) -> tuple[list[Exported], dict[str, str]]:
    """Every verified environment of a results directory (`micro`: its micro variants) as Harbor task folders under
    `out/<task id>`; (what was exported, {slot: why it was not})."""
    done, refused = [], {}
    for row in task_rows(results, micro=micro):
        try:
            done.append(export_task(
                Path(row["task"]), Path(out) / Path(row["task"]).stem, sandbox=sandbox, root=Path(row["root"]),
                baseline=json.loads(row["baseline"]) if row["baseline"] else None, metric=row["metric"],
                higher_is_better=row["higher_is_better"], base_image=base_image, limits=limits,
                hidden_columns=json.loads(row["hidden_columns"]) if row["hidden_columns"] else None,
                scale_floor=scale_floor))
        except HarborExportError as err:
            refused[row["slot"]] = str(err)
    return done, refused


def sandbox_for_task(cfg: GymforgeConfig, task: HarborTask) -> SandboxBackend:
    """The configured backend with the GPUs the task declares."""
    return sandbox_for(cfg, task.gpus)


@contextlib.contextmanager
def leased_sandbox(cfg: GymforgeConfig, task: HarborTask, *, say: Callable[[str], None] = print,
                   env: dict[str, str] | None = None) -> Iterator[SandboxBackend]:
    """The configured backend for a Harbor task run by hand (`run-task`, `check-task`, `harbor-run`), with the GPUs
    its task.toml declares leased as Snakemake jobs lease theirs (`gymforge.runtime.gpus`): a process that already
    sees a lease or a scheduler's devices (CUDA_VISIBLE_DEVICES set, as `gymforge with-gpus` sets it) uses those; else
    the devices are locked for as long as the block runs and CUDA_VISIBLE_DEVICES names them. A task that declares
    more GPUs than there are here runs with those there are (none on a CPU-only machine), and `say` tells so."""
    env = os.environ if env is None else env
    want = task.gpus
    have = len(ids) if (ids := visible_devices(env)) is not None else gpu_count(env)
    n = min(want, have)
    if n < want:
        say(f"{task.folder.name}: task.toml declares {want} GPU(s) and {have} are here: it runs with {n}")
    if n == 0 or visible_devices(env) is not None:
        yield sandbox_for(cfg, n)
        return
    with gpus.lease(n) as leased:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(leased)  # unset before (checked above): unset again after
        try:
            yield sandbox_for(cfg, n)
        finally:
            env.pop("CUDA_VISIBLE_DEVICES", None)


# -- the Snakemake step: one slot's Harbor folder (rule harbor_task, target `harbor`) ---------------------------

def harbor_task(cfg: GymforgeConfig, slot: str, report: Path, env: Path, proposal: Path, out: Path) -> str:
    """The Harbor task folder of one topic slot's verified environment at `out` (rule `harbor_task`; base image
    `sandbox.image`); a slot that was not verified, or whose task cannot leave, gets `out/not_exported.json` with
    the reason instead, so the target's folders are known before the run."""
    task = load_task(slot, Path(report), Path(env), Path(proposal) if Path(proposal).exists() else None)
    why = None
    if task is None:
        why = f"not verified ({VerificationReport.model_validate_json(Path(report).read_text()).status})"
    else:
        try:
            made = export_task(task.task_yaml, Path(out), sandbox=sandbox_for(cfg, 0), root=task.tree,
                               baseline=task.baseline, metric=task.metric.metric,
                               higher_is_better=task.metric.higher_is_better, hidden_columns=task.hidden_columns,
                               limits=Limits.from_config(cfg.sandbox), base_image=cfg.sandbox.image,
                               scale_floor=cfg.rl.reward.scale_floor)
            return f"{slot}: {made.task_id} {'written' if made.written else 'unchanged'}"
        except HarborExportError as err:
            why = str(err)
    with atomic.directory(Path(out)) as tmp:
        (tmp / "not_exported.json").write_text(json.dumps({"slot": slot, "reason": why}, indent=1) + "\n")
    return f"{slot}: not exported: {why}"
