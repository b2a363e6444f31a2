"""The MLGym-style research agent: one DISCUSSION and one command per turn, run until submit or a limit."""

from typing import Any

from gymforge.agent.errors import EvaluationFormatError, SubmissionNotFound
from gymforge.agent.parsing import FormatError, parse_reply
from gymforge.agent.trajectory import Trajectory, build_messages, read_trajectory

_LOOP = ("Agent", "AgentConfig", "AgentTask", "Session", "TaskEvaluator")

__all__ = [
    "Agent", "AgentConfig", "AgentTask", "EvaluationFormatError", "FormatError", "Session", "SubmissionNotFound",
    "TaskEvaluator", "Trajectory", "build_messages", "parse_reply", "read_trajectory",
]


def __getattr__(name: str) -> Any:
    if name in _LOOP:
        # deferred: the loop imports the LLM client (openai, ~0.5 s); the Snakefile imports agent.sources to plan
        from gymforge.agent import loop

        return getattr(loop, name)
    raise AttributeError(f"module 'gymforge.agent' has no attribute {name!r}")
