"""Route a chat-completions request body to the role the conversation asks for, and answer it.

The role is read from the most recent user message that opens with one of the pipeline's prompt
headings; a nudge ("Your last reply could not be used") or a repair ("## Validation errors") after
it asks for that role again. An agent conversation (its first user message is the agent's task
prompt) is answered by the agent policy, at the skill the model name asks for. Every answer is a
pure function of the request seed, the model name and the content, so the same body always gets
the same reply.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

import gymforge.offline.families
from gymforge.offline import agent_policy, coherence, proposals, topics

HEADINGS: dict[str, str] = {
    "## Sample research topics": "topics",
    "## Propose a task": "propose",
    "## Write the task configuration": "configs",
    "## Write the starter code": "code",
    "## Check the task's coherence": "coherence",
}
REPAIR_HEADING = "## Validation errors"
NUDGE_PREFIX = "Your last reply could not be used"
SEARCH_TOOL = "search_datasets"


class UnknownRequest(ValueError):
    """The conversation asks for nothing the offline teacher can play (a client error, not a crash)."""


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Reply:
    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()


def stable_seed(*parts: Any) -> int:
    """A 63-bit seed from JSON-able parts; unlike `hash()` it is the same in every process."""
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def text_of(message: dict[str, Any]) -> str:
    """Message content as text, whether a string or a list of content parts."""
    content = message.get("content")
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content or ""


def _role(text: str) -> str | None:
    stripped = text.lstrip()
    return next((role for heading, role in HEADINGS.items() if stripped.startswith(heading)), None)


def _json_block(text: str) -> Any:
    match = re.search(r"```json\s*\n(.*?)\n```", text, re.DOTALL)
    return json.loads(match.group(1)) if match else None


def _config_blocks(text: str) -> dict[str, str]:
    """The ```yaml blocks whose first line is `# <path>`, keyed by path."""
    return {path: body for path, body in re.findall(r"```ya?ml\s*\n#\s*(\S+)[ \t]*\n(.*?)\n?```", text, re.DOTALL)}


def _dataset(text: str) -> dict[str, Any] | None:
    dataset = _json_block(text)
    if not isinstance(dataset, dict):
        return None
    # The prompt says the id and the storage outside the JSON block; the code writer needs both.
    named = re.search(r"The dataset `([^`]+)`", text)
    if named:
        dataset.setdefault("id", named.group(1))
    dataset.setdefault("is_local", "load_from_disk" in text)
    return dataset


def respond(body: dict[str, Any]) -> Reply:
    """The assistant turn for a chat-completions request body."""
    messages: list[dict[str, Any]] = body.get("messages") or []
    conversation = [(str(m.get("role")), text_of(m)) for m in messages]
    if agent_policy.is_agent_conversation(conversation):
        return Reply(agent_policy.answer(conversation, seed=int(body.get("seed") or 0), model=body.get("model")))
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    requests = [i for i in users if _role(text_of(messages[i]))]
    if not requests:
        raise UnknownRequest("the offline teacher found no request it can answer in the user messages")
    index = requests[-1]
    request = text_of(messages[index])
    role = _role(request)
    last = text_of(messages[users[-1]]).lstrip()
    if users[-1] != index and not last.startswith((NUDGE_PREFIX, REPAIR_HEADING)):
        raise UnknownRequest("the last user message is neither a known request, a nudge nor a repair")
    nudged = users[-1] != index and last.startswith(NUDGE_PREFIX)
    attempt = sum(text_of(messages[i]).lstrip().startswith(REPAIR_HEADING) for i in users)
    seed = stable_seed(body.get("seed") or 0, role, request)
    history = messages[index + 1 :]

    if role == "topics":
        return Reply(topics.answer(request, seed=seed, nudged=nudged))
    if role == "coherence":
        return Reply(coherence.answer(request))
    if role == "propose":
        offered = body.get("tool_choice") != "none" and any(
            (tool.get("function") or {}).get("name") == SEARCH_TOOL for tool in body.get("tools") or []
        )
        turn = proposals.answer(request, history, seed=seed, tools=offered, nudged=nudged)
        if isinstance(turn, str):
            return Reply(turn)
        call_id = f"call_{stable_seed(seed, len(history), turn.query):016x}"
        return Reply(None, (ToolCall(call_id, SEARCH_TOOL, json.dumps({"query": turn.query})),))

    # Config and code generation live in their own package, written alongside this one (looked up per call).
    families = gymforge.offline.families
    if role == "configs":
        proposal = _json_block(request)
        if not isinstance(proposal, dict):
            raise UnknownRequest("the configuration request carries no ```json proposal block")
        return Reply(families.write_configs(proposal, seed=seed, attempt=attempt))
    configs = _config_blocks(request)
    if not configs:
        raise UnknownRequest("the starter-code request carries no ```yaml config blocks")
    return Reply(families.write_code(configs, _dataset(request), seed=seed, attempt=attempt))
