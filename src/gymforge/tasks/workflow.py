"""The workflow interface of post-training tasks (`agent.interface: workflow`, docs/post-training.md#workflow-interface):
AutoTrainess-style skills offered to the agent as commands (`gymforge.agent.commands`), each backed by real tools and
checks.

- `plan <text>`, `log <text>`: entries of `experiment_log.md` in the workspace.
- `data_validate <file>`: the file's format and duplicates (checked in the sandbox by `skills/data.py`, the same
  row rules `train` uses) and, here on the host, which of its rows reproduce held-out evaluation prompts (word
  n-grams, `posttraining.contaminated`, with the same index as the audit's `eval_overlap` watch: n-grams the task's
  own pool holds do not count): the report names the agent's own line numbers and their count, never a held-out
  prompt.
- `data_build <out> <in>...`: the inputs without malformed rows and duplicates, then `data_validate` of the result.
- `train <config.yaml>`: one tracked TRL run (`skills/train.py`: SFT or DPO, `runs/<k>/` with its config copy,
  train.log and checkpoint, an experiment-log entry), only on data that passed `data_validate` as it is now (a file
  not validated yet is validated first; the run checks the file's hash again before training).
- `evaluate`: the task's own evaluation of `final_model/` (the loop's `validate`), its score appended to the log.

The skills' sandbox side lives in `gymforge/skills/` (mounted read-only at `skills/`); every file of the workspace is
written there, by the agent's own sandbox. Host-side reads of the agent's files go through `gymforge.sandbox.beneath`
(no symlink followed, size-capped).
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gymforge.agent.commands import CommandHost, CommandResult
from gymforge.agent.loop import timed_out_note
from gymforge.agent.tools import ToolError, Workspace, split_args
from gymforge.core.prompts import render
from gymforge.sandbox import ExecResult, Mount, beneath
from gymforge.tasks.environment import TaskEnvironment
from gymforge.tasks.posttraining import OVERLAP_FILE_MAX, EvalNgrams, PostTraining, contaminated

SKILLS_DIR = Path(__file__).resolve().parents[1] / "skills"
SKILLS_MOUNT = "skills"
EXPERIMENT_LOG = "experiment_log.md"
NAMES = ("plan", "data_validate", "data_build", "train", "evaluate", "log")
MAX_CONFIG = 1 << 20
MAX_REPORTED = 10


def skills_mount() -> Mount:
    return Mount(host=SKILLS_DIR, target=SKILLS_MOUNT)


class SkillsEnvironment(TaskEnvironment):
    """A task environment whose sessions also get the skills, read-only at `skills/` (post-training tasks only)."""

    @property
    def mounts(self) -> list[Mount]:
        extra = [skills_mount()] if self.post_training is not None else []
        return [*super().mounts, *extra]


# -- the overlap check: host side, where the held-out prompts are ---------------------------------------------


def strings(value: Any) -> Iterable[str]:
    """Every string in a parsed JSON value, keys excluded."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)


def row_text(line: str) -> str:
    """The text of one line that the overlap check reads: its strings (the line itself when it is not JSON)."""
    try:
        parsed = json.loads(line)
    except (ValueError, RecursionError):
        return line
    return "\n".join(strings(parsed))


def overlapping_lines(text: str, index: EvalNgrams, share: float) -> list[int]:
    """Line numbers (from 1) of the lines that reproduce a held-out prompt (`posttraining.contaminated`)."""
    return [n for n, line in enumerate(text.splitlines(), 1)
            if line.strip() and contaminated(index, row_text(line), share)]


def result_line(output: str, tag: str) -> dict[str, Any] | None:
    """The JSON object of the last `<tag> {...}` line of a skill script's output."""
    for line in reversed(output.splitlines()):
        if line.startswith(tag + " "):
            try:
                value = json.loads(line[len(tag) + 1:])
            except ValueError:
                return None
            return value if isinstance(value, dict) else None
    return None


def _listing(lines: list[int]) -> str:
    shown = ", ".join(str(n) for n in lines[:MAX_REPORTED])
    return shown + (f" and {len(lines) - MAX_REPORTED} more" if len(lines) > MAX_REPORTED else "")


@dataclass
class Validation:
    """What `data_validate` found for one file, as it was read."""

    ok: bool
    sha256: str
    report: str
    overlap: list[int] = field(default_factory=list)


# -- the skills ----------------------------------------------------------------------------------------------


class WorkflowSkills:
    """The post-training skills of one episode (`gymforge.agent.commands.Commands`)."""

    names = frozenset(NAMES)

    def __init__(self, env: TaskEnvironment, post: PostTraining, baseline: dict[str, float] | None = None) -> None:
        self.env, self.post, self.baseline = env, post, baseline
        self.files = Workspace(env.workspace, env.workdir, env.mounts)
        self.validated: dict[str, str] = {}  # sandbox path -> sha256 of the content that passed data_validate
        self._index: EvalNgrams | None = None

    @property
    def index(self) -> EvalNgrams:
        if self._index is None:
            prompts = [str(r["prompt"]) for r in self.post.eval_rows(self.env.secrets_dir)]
            self._index = EvalNgrams(prompts, self.post.spec.ngram, self.post.pool_texts())  # as the audit's watch
        return self._index

    def instructions(self) -> str:
        return render("agent_workflow", skills=SKILLS_MOUNT, log=EXPERIMENT_LOG, ngram=self.post.spec.ngram)

    def run(self, action: str, host: CommandHost) -> CommandResult:
        name, _, rest = action.partition(" ") if " " in action.split("\n", 1)[0] else action.partition("\n")
        if name.strip() not in self.names:
            return CommandResult(f"Error: {name.strip()!r} is not a skill", exit_code=2)
        try:
            return getattr(self, f"_{name.strip()}")(rest.strip(), host)
        except ToolError as err:
            return CommandResult(f"Error: {err}", exit_code=2)

    # -- plan, log --------------------------------------------------------------------------------------------

    def _script(self, host: CommandHost, script: str, *args: str) -> ExecResult:
        argv = ["command", "python", f"{host.workdir}/{SKILLS_MOUNT}/{script}", *args]
        return host.shell(" ".join(shlex.quote(a) if i else a for i, a in enumerate(argv)))

    def _entry(self, kind: str, text: str, host: CommandHost, usage: str) -> CommandResult:
        if not text:
            raise ToolError(f"nothing to write. Usage: {usage}")
        result = self._script(host, "log.py", kind, text)
        return CommandResult(result.output.strip() or "(no output)", result.exit_code, result.timed_out, result.limit)

    def _plan(self, text: str, host: CommandHost) -> CommandResult:
        return self._entry("plan", text, host, "plan <what the next iteration changes, and why>")

    def _log(self, text: str, host: CommandHost) -> CommandResult:
        return self._entry("note", text, host, "log <note>")

    # -- data -------------------------------------------------------------------------------------------------

    def _read(self, path: str, cwd: str, limit: int) -> tuple[str, bytes]:
        """(sandbox path, content) of a file the agent names, read on the host by fd beneath its root."""
        loc = self.files.regular(self.files.locate(path, cwd), path)
        try:
            return loc.remote, beneath.read_bytes(loc.root, loc.rel, limit)
        except beneath.OutsideError as err:
            raise ToolError(f"{path} is a symlink or lies behind one") from err
        except OSError as err:  # larger than the limit, gone meanwhile, not a regular file
            raise ToolError(f"{path}: {err.strerror or err}") from err

    def validate(self, path: str, host: CommandHost) -> Validation:
        remote, data = self._read(path, host.cwd, OVERLAP_FILE_MAX)
        digest = hashlib.sha256(data).hexdigest()
        overlap = overlapping_lines(data.decode(errors="replace"), self.index, self.post.spec.overlap_share)
        result = self._script(host, "data.py", "validate", remote)
        found = result_line(result.output, "DATA_RESULT")
        lines = [result.output.strip()]
        if result.timed_out:
            lines.append(timed_out_note(self.env.timeout).strip())
        if overlap:
            lines.append(f"overlap with the held-out evaluation prompts ({self.post.spec.ngram}-word n-grams): "
                         f"{len(overlap)} rows: lines {_listing(overlap)}. Remove them: training on evaluation "
                         "prompts is flagged and costs the episode.")
        else:
            lines.append("overlap with the held-out evaluation prompts: none")
        ok = bool(found and found.get("ok")) and not overlap and result.exit_code == 0
        lines.append(f"data_validate {remote}: {'PASSED: ready for training' if ok else 'FAILED: fix the data first'}")
        if ok:
            self.validated[remote] = digest
        else:
            self.validated.pop(remote, None)
        return Validation(ok, digest, "\n".join(lines), overlap)

    def _data_validate(self, text: str, host: CommandHost) -> CommandResult:
        (path,) = split_args(text, "data_validate <file.jsonl>", 1, 1)
        found = self.validate(path, host)
        return CommandResult(found.report, exit_code=0 if found.ok else 1)

    def _data_build(self, text: str, host: CommandHost) -> CommandResult:
        usage = "data_build <out.jsonl> <in.jsonl> [<in.jsonl> ...] [--limit N]"
        args = split_args(text, usage, 2, 64)
        result = self._script(host, "data.py", "build", *args)
        if result.exit_code != 0:
            return CommandResult(result.output.strip(), result.exit_code, result.timed_out, result.limit)
        found = self.validate(args[0], host)
        return CommandResult(result.output.strip() + "\n" + found.report, exit_code=0 if found.ok else 1)

    # -- train ------------------------------------------------------------------------------------------------

    def _train(self, text: str, host: CommandHost) -> CommandResult:
        (path,) = split_args(text, "train <config.yaml>", 1, 1)
        remote, raw = self._read(path, host.cwd, MAX_CONFIG)
        try:
            config = yaml.safe_load(raw)
        except yaml.YAMLError as err:
            raise ToolError(f"{path} is not valid YAML ({str(err).splitlines()[0]})") from None
        if not isinstance(config, dict) or not isinstance(config.get("data"), str):
            raise ToolError(f"{path} must be a YAML mapping with `data: <training file>` (see {SKILLS_MOUNT}/train.py)")
        data_remote, data = self._read(config["data"], host.cwd, OVERLAP_FILE_MAX)
        digest = hashlib.sha256(data).hexdigest()
        notes = ""
        if self.validated.get(data_remote) != digest:
            found = self.validate(config["data"], host)
            notes = f"{config['data']} was not validated as it is now; data_validate first:\n{found.report}\n"
            if not found.ok:
                return CommandResult(notes + "train refused: the data failed validation.", exit_code=1)
            digest = found.sha256
        result = self._script(host, "train.py", remote, "--data-sha256", digest)
        observation = notes + result.output.strip()
        if result.timed_out:
            observation += timed_out_note(self.env.timeout)
        summary = result_line(result.output, "TRAIN_RESULT") or {}
        ok = result.exit_code == 0 and summary.get("status") == "ok"
        return CommandResult(observation, result.exit_code, result.timed_out, result.limit, trained=ok)

    # -- evaluate ---------------------------------------------------------------------------------------------

    def _evaluate(self, text: str, host: CommandHost) -> CommandResult:
        if text:
            raise ToolError("evaluate takes no arguments: it scores final_model/ only. Put the model to score there "
                            "(a train run with `export: true`, or `cp -r runs/<k>/checkpoint/. final_model/`)")
        observation, metrics = host.validate()
        if metrics is None:
            return CommandResult(observation, exit_code=1)
        args = [json.dumps(metrics), *([json.dumps(self.baseline)] if self.baseline else [])]
        entry = self._script(host, "log.py", "eval", *args)
        return CommandResult(f"{observation}\n{entry.output.strip()}", exit_code=entry.exit_code)


def skills_for(env: TaskEnvironment, baseline: dict[str, float] | None = None) -> WorkflowSkills | None:
    """The workflow skills of an installed task's episode, or None when the task is not a post-training task."""
    return WorkflowSkills(env, env.post_training, baseline) if env.post_training is not None else None
