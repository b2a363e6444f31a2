"""The `.traj` file (MLGym's layout plus our extras; the models are `gymforge.core.records.Trajectory` and its
parts) and the per-run `results.json`, and the chat requests a trajectory's history stands for.

`build_messages` is what the agent loop sends the model at each turn; `sft_messages` (the SFT example of a
trajectory, `conversation` unit), `requests_of` (every request a trajectory sent, which the tests compare with the
endpoint's log and RL scores again) and `reply_chats` (the SFT examples of the `request` unit: each accepted reply
with the request it answered) rebuild those requests from the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from gymforge.core import atomic
from gymforge.core.prompts import render
from gymforge.core.records import Trajectory
from gymforge.core.tokens import Sampled, TokenRecord, decode_records

KEEP_OBSERVATIONS = 5  # observations kept in full in the prompt (`AgentConfig.keep_observations`' default)


def write_trajectory(path: str | Path, traj: Trajectory) -> Path:
    return atomic.write_json(path, traj.model_dump(mode="json"))


def read_trajectory(path: str | Path) -> Trajectory:
    return Trajectory.model_validate(json.loads(Path(path).read_text()))


def write_results(path: str | Path, traj: Trajectory, baseline: dict[str, float] | None) -> Path:
    return atomic.write_json(path, {"agent": traj.info.score, "baseline": baseline})


# ---- requests ---------------------------------------------------------------------------------------


def build_messages(history: list[dict[str, Any]], keep: int = KEEP_OBSERVATIONS) -> list[dict[str, str]]:
    """The chat messages the model is sent for this history: observations but the last `keep` elided."""
    observations = [i for i, m in enumerate(history) if m["role"] == "user"][1:]  # the first is the task
    elided = set(observations[: max(0, len(observations) - keep)])
    return [
        {
            "role": m["role"],
            "content": f"Old output omitted ({len(m['content'].splitlines())} lines)" if i in elided else m["content"],
        }
        for i, m in enumerate(history)
    ]


def _chat(messages: Iterable[dict[str, Any]]) -> list[dict[str, str]]:
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def sft_messages(traj: Trajectory, keep: int = KEEP_OBSERVATIONS) -> list[dict[str, str]] | None:
    """The example of a trajectory: its final request as the model was sent it, plus the final reply."""
    history = traj.history
    last = max((i for i, m in enumerate(history) if m["role"] == "assistant"), default=None)
    if last is None:
        return None
    return _chat(build_messages(history[: last + 1], keep))


def is_model_turn(step: Any) -> bool:
    """Whether a step's action is a reply the model wrote (and the loop accepted), not the loop's own exit ("Exit due
    to ..." with an `exit_<reason>` action, e.g. after three malformed replies in a row)."""
    return not (step.action.startswith("exit_") and step.thought.startswith("Exit due to"))


def reply_counts(traj: Trajectory) -> tuple[int, int]:
    """(well-formed, malformed) replies of a trajectory: the replies the loop accepted as actions, and those it
    rejected as format errors (each followed by a re-ask)."""
    return (sum(is_model_turn(step) for step in traj.trajectory),
            sum(len(step.format_errors) for step in traj.trajectory))


def requests_of(traj: Trajectory, keep: int = KEEP_OBSERVATIONS) -> list[list[dict[str, str]]]:
    """Every request the agent loop sent for this trajectory, rebuilt from the file, in order.

    A turn's first request is `build_messages` of the history before its reply; each rejected reply
    (`format_errors`) was followed by a re-ask carrying it and the format-error prompt. Requests that
    failed at the endpoint left no trace and are not rebuilt.
    """
    history = traj.history
    assistant = iter(i for i, m in enumerate(history) if m["role"] == "assistant")
    requests: list[list[dict[str, str]]] = []
    for step in traj.trajectory:
        model_turn = is_model_turn(step)
        position = next(assistant) if model_turn else len(history)
        if not model_turn and not step.format_errors:
            continue  # an auto-submission decided before asking the model
        base = _chat(build_messages(history[:position], keep))
        convos = [base]
        for rejected in step.format_errors:
            convos.append([*base, {"role": "assistant", "content": rejected["response"]},
                           {"role": "user", "content": render("agent_format_error", error=rejected["error"]).rstrip()}])
        if not model_turn:
            convos.pop()  # the re-ask after the last rejection was never sent: the run ended instead
        requests.extend(convos)
    return requests


def reply_tokens(traj: Trajectory) -> list[Sampled | None]:
    """The sampled tokens of every reply of a trajectory, in `requests_of`'s order (each step's rejected replies, then
    its accepted one): a served model's prompt ids (the exact request after the loop's elisions), reply ids and
    log-probs, or None for a reply recorded without them (a teacher, an external API, a trajectory from before they
    were kept)."""
    records: list[TokenRecord | None] = []
    for step in traj.trajectory:
        model_turn = is_model_turn(step)
        count = len(step.format_errors) + model_turn
        if step.tokens is not None and len(step.tokens) != count:
            raise ValueError(f"step {step.step}: {len(step.tokens)} token records for {count} replies")
        records.extend(step.tokens if step.tokens is not None else [None] * count)
    return decode_records(records)


def reply_chats(traj: Trajectory, keep: int = KEEP_OBSERVATIONS) -> list[list[dict[str, str]]]:
    """One chat per reply the loop accepted (each assistant turn of the history), in order: the exact request that
    reply answered (`requests_of`; after format re-asks, the last re-ask, which carries the rejected reply and the
    format-error prompt) followed by the reply. Rejected replies are no chat of their own. The last chat of a
    trajectory whose final reply needed no re-ask is `sft_messages`."""
    history = traj.history
    positions = [i for i, m in enumerate(history) if m["role"] == "assistant"]
    requests = iter(requests_of(traj, keep))
    chats: list[list[dict[str, str]]] = []
    for step in traj.trajectory:
        model_turn = is_model_turn(step)
        asked = [next(requests) for _ in range(len(step.format_errors) + model_turn)]  # as requests_of walks
        if model_turn:
            reply = history[positions[len(chats)]]
            chats.append([*asked[-1], {"role": "assistant", "content": reply["content"]}])
    for position in positions[len(chats):]:  # replies no step recorded (a run cut short): their plain request
        chats.append(_chat(build_messages(history[: position + 1], keep)))
    return chats
