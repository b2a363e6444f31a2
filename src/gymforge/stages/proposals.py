"""Proposals stage: turn a topic into a task proposal grounded in a real dataset, via a tool-calling loop."""

from __future__ import annotations

import difflib
import json
from pathlib import Path

from pydantic import ValidationError

from gymforge.core import atomic
from gymforge.core.config import GymforgeConfig
from gymforge.hub.base import DatasetCard, DatasetHub, DatasetNotFound
from gymforge.core.prompts import render
from gymforge.core.records import ProposalRecord, TaskProposal, UsageRecord, derive_seed
from gymforge.stages.topics import load_slot
from gymforge.llm.json_reply import NotJSON, extract_json
from gymforge.hub import get_hub
from gymforge.llm.client import make_client

SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search_datasets",
        "description": "Search the Hugging Face Hub for datasets. Returns the best matches with id, description, tags and downloads.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "Free-text query or a dataset id."}},
            "required": ["query"],
        },
    },
}
# Below this similarity between the proposed name and a search hit's id, the hit is a different dataset.
MIN_ID_SIMILARITY = 0.6


def _hit_summary(card: DatasetCard) -> dict:
    return {"id": card.id, "description": card.description[:300], "tags": card.tags[:8], "downloads": card.downloads}


def resolve_dataset(hub: DatasetHub, proposed: str, limit: int) -> str | None:
    """Map the teacher's dataset string (an id or a query) to the closest real id the search returns."""
    hits = hub.search(proposed, limit=limit)
    if not hits:
        return None
    wanted = proposed.strip().lower()
    for hit in hits:
        if hit.id.lower() == wanted:
            return hit.id

    def closeness(card: DatasetCard) -> float:
        name = card.id.lower().split("/")[-1]
        return max(difflib.SequenceMatcher(None, wanted, card.id.lower()).ratio(),
                   difflib.SequenceMatcher(None, wanted.split("/")[-1], name).ratio())

    best = max(hits, key=closeness)
    # A free-text query (no owner part) is a search, so the top-ranked hit is the answer.
    if "/" not in wanted:
        return hits[0].id
    return best.id if closeness(best) >= MIN_ID_SIMILARITY else None


def proposal(cfg: GymforgeConfig, slot: str, batch_file: Path, out: Path, hub: DatasetHub | None = None) -> ProposalRecord:
    topic = load_slot(batch_file, slot)
    if topic.status != "ok":
        record = ProposalRecord(item=slot, status="skipped", reason_code=topic.reason_code,
                                reason=topic.reason, topic=topic.topic)
        atomic.write_text(out, record.model_dump_json(indent=2))
        return record

    hub = hub or get_hub(cfg)
    limits = cfg.proposals
    messages = [
        {"role": "system", "content": render("system_teacher")},
        {"role": "user", "content": render("propose_task", topic=topic.topic, max_tool_calls=limits.max_tool_calls)},
    ]
    seed = derive_seed(cfg.seed, "proposal", slot)
    searches: list[str] = []
    nudges = 0
    proposal: TaskProposal | None = None
    failure: tuple[str, str] | None = None
    with make_client(cfg, "proposals") as client:
        # Each turn either runs tool calls or is an answer; both kinds are bounded.
        for _ in range(limits.max_tool_calls + limits.max_nudges + 2):
            reply = client.chat(messages, tools=[SEARCH_TOOL], seed=seed)
            messages.append(reply.assistant_message())
            if reply.tool_calls:
                for call in reply.tool_calls:
                    messages.append({"role": "tool", "tool_call_id": call.id,
                                     "content": _run_tool(hub, call.name, call.arguments, searches, cfg)})
                continue
            try:
                proposal = TaskProposal.model_validate(extract_json(reply.content, dict))
                break
            except (NotJSON, ValidationError) as err:
                problem = str(err).splitlines()[0]
                if nudges >= limits.max_nudges:
                    failure = ("invalid_json", f"no valid proposal JSON after {nudges} nudges: {problem}")
                    break
                nudges += 1
                messages.append({"role": "user", "content": render(
                    "nudge_json", problem=problem, shape="object with keys topic, metric, description, dataset")})
        else:
            failure = ("no_answer", "teacher kept calling tools without answering")
        usage = UsageRecord.model_validate(client.usage.model_dump())

    record = ProposalRecord(item=slot, status="ok", topic=topic.topic, proposal=proposal,
                            searches=searches, nudges=nudges, usage=usage)
    if failure is None and proposal.dataset:
        dataset_id = resolve_dataset(hub, proposal.dataset, cfg.datasets.search_limit)
        if dataset_id is None:
            failure = ("no_dataset_match", f"no dataset on the {hub.name} hub matches {proposal.dataset!r}")
        else:
            try:
                details = hub.describe(dataset_id, n_rows=cfg.datasets.example_rows)
                record.dataset = details.model_dump(mode="json")
            except DatasetNotFound as err:
                failure = ("no_dataset_match", str(err))
    if failure:
        record.status, (record.reason_code, record.reason) = "discarded", failure
    atomic.write_text(out, record.model_dump_json(indent=2))
    return record


def _run_tool(hub: DatasetHub, name: str, arguments: str, searches: list[str], cfg: GymforgeConfig) -> str:
    if name != "search_datasets":
        return json.dumps({"error": f"unknown tool {name!r}; the only tool is search_datasets"})
    if len(searches) >= cfg.proposals.max_tool_calls:
        return json.dumps({"error": "search limit reached; answer with the JSON proposal now"})
    try:
        query = str(json.loads(arguments or "{}")["query"])
    except (json.JSONDecodeError, KeyError, TypeError):
        return json.dumps({"error": "arguments must be a JSON object with a string 'query'"})
    searches.append(query)
    return json.dumps([_hit_summary(c) for c in hub.search(query, limit=cfg.datasets.search_limit)])
