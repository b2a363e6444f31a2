"""Extra commands an episode can offer the model beside the shell and the file commands: the extension point
through which a task kind adds its skills (post-training's workflow interface: `gymforge.tasks.workflow`).

The loop hands an action whose first word is one of `Commands.names` to `Commands.run`, in the episode's worker
thread, with a `CommandHost`: the episode's shell (training commands get the task's training timeout, as in the
loop) and its evaluation (the `validate` path: the score is recorded and shown as for `validate`). The action is
recorded in the trajectory like any other; `instructions()` is added to the task's first message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gymforge.sandbox import ExecResult


@dataclass
class CommandResult:
    """What an extra command did; a non-zero `exit_code` or `timed_out` counts it as a failed action."""

    observation: str
    exit_code: int = 0
    timed_out: bool = False
    limit: str | None = None  # the sandbox limit that stopped it, in words
    trained: bool = False  # it finished a training run (a train-to-eval iteration begins)


class CommandHost(Protocol):
    """What the loop lends an extra command while it runs."""

    @property
    def cwd(self) -> str:
        """The shell's directory, as the sandboxed code sees it."""
        ...

    @property
    def workdir(self) -> str:
        """The workspace, as the sandboxed code sees it."""
        ...

    def shell(self, command: str) -> ExecResult:
        """Run `command` in the episode's shell (the task's training timeout for a training command)."""
        ...

    def validate(self) -> tuple[str, dict[str, float] | None]:
        """Evaluate the current artefact as `validate` does: (the observation `validate` shows, the metrics or None
        when there was nothing to score)."""
        ...


class Commands(Protocol):
    """A set of extra commands (a task kind's skills)."""

    names: frozenset[str]

    def instructions(self) -> str:
        """What the model is told about the commands and their rules (added to the task's first message)."""
        ...

    def run(self, action: str, host: CommandHost) -> CommandResult:
        """Carry out `action` (its first word is one of `names`); errors the model can fix are observations."""
        ...
