"""The offline teacher, reached over HTTP with the real `openai` client exactly as the pipeline does."""

from __future__ import annotations

import json
import random
import sys
import types
from collections import Counter
from typing import Any

import openai
import pytest
from openai import OpenAI

import gymforge.offline as offline_teacher
from gymforge.offline import dispatch, ensure_server
from gymforge.offline.server import MODEL_ID
from gymforge.offline.topics import near_duplicate
from gymforge.offline.vocabulary import FAMILIES, QUALIFIERS, VOCABULARY, lookup, normalise
from gymforge.core.prompts import render
from gymforge.llm.json_reply import NotJSON, extract_json

SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search_datasets",
        "description": "Search the hub.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
}
WINE_HIT = {"id": "sklearn/wine", "description": "Chemical analysis of 178 wines from three cultivars.",
            "tags": ["tabular", "classification", "wine"], "downloads": 10}
CO2_HIT = {"id": "statsmodels/co2", "description": "Weekly atmospheric CO2 at Mauna Loa.",
           "tags": ["time-series", "forecasting", "climate"], "downloads": 10}


@pytest.fixture(scope="module")
def client() -> OpenAI:
    return OpenAI(base_url=ensure_server(), api_key="offline", max_retries=0)


def _chat(client: OpenAI, messages: list[dict[str, Any]], seed: int, **kwargs: Any) -> Any:
    return client.chat.completions.create(model=MODEL_ID, messages=messages, seed=seed, **kwargs).choices[0]


def _user(text: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": render("system_teacher")}, {"role": "user", "content": text}]


def _topics(client: OpenAI, n: int, seen: list[str], seed: int) -> list[str]:
    return extract_json(_chat(client, _user(render("topics", n=n, seen=seen)), seed).message.content, list)


def _propose(client: OpenAI, topic: str, seed: int, hits: list[dict[str, Any]]) -> tuple[dict[str, Any], list[str], int]:
    """Play the pipeline's side of a proposal conversation: (proposal, queries searched, nudges)."""
    messages = _user(render("propose_task", topic=topic, max_tool_calls=3))
    queries: list[str] = []
    nudges = 0
    for _ in range(8):
        choice = _chat(client, messages, seed, tools=[SEARCH_TOOL])
        message = choice.message
        messages.append(message.model_dump(exclude_none=True))
        if message.tool_calls:
            assert choice.finish_reason == "tool_calls" and message.content is None
            for call in message.tool_calls:
                assert call.function.name == "search_datasets"
                queries.append(json.loads(call.function.arguments)["query"])
                messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(hits)})
            continue
        try:
            return extract_json(message.content, dict), queries, nudges
        except NotJSON:
            nudges += 1
            messages.append({"role": "user", "content": render("nudge_json", problem="not JSON", shape="object")})
    raise AssertionError("the teacher never answered")


def test_models_endpoint_lists_the_teacher(client: OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL_ID]


def test_topics_are_n_strings_deterministic_per_seed(client: OpenAI) -> None:
    first = _topics(client, 6, [], seed=1)
    assert len(first) == 6 and all(isinstance(t, str) and t for t in first)
    assert _topics(client, 6, [], seed=1) == first
    assert _topics(client, 6, [], seed=2) != first
    assert all(lookup(t) is not None for t in first)


def test_later_topic_batches_repeat_or_vary_already_sampled_topics(client: OpenAI) -> None:
    seen: list[str] = []
    repeats = variants = later = 0
    for batch in range(6):
        topics = _topics(client, 8, seen, seed=batch)
        if seen:
            keys = {normalise(t) for t in seen}
            later += len(topics)
            repeats += sum(t in seen for t in topics)
            variants += sum(t not in seen and normalise(t) in keys for t in topics)
        seen += topics
    assert repeats > 0 and variants > 0
    assert 0.05 <= (repeats + variants) / later <= 0.35


def test_topic_replies_are_sometimes_fenced_but_plain_after_a_nudge(client: OpenAI) -> None:
    replies = [_chat(client, _user(render("topics", n=3, seen=[])), seed).message.content for seed in range(20)]
    assert any(r.startswith("```json") for r in replies) and any(r.startswith("[") for r in replies)
    fenced_seed = next(s for s, r in enumerate(replies) if r.startswith("```"))
    messages = _user(render("topics", n=3, seen=[])) + [
        {"role": "assistant", "content": replies[fenced_seed]},
        {"role": "user", "content": render("nudge_json", problem="bad", shape="array of 3 topic strings")},
    ]
    assert len(json.loads(_chat(client, messages, fenced_seed).message.content)) == 3


def test_near_duplicate_variants_still_resolve_to_their_entry() -> None:
    rng = random.Random(0)
    for entry in VOCABULARY:
        variant = near_duplicate(entry.text, rng)
        assert variant != entry.text and lookup(variant) is entry
        qualifier = QUALIFIERS[entry.family][0]
        assert lookup(f"{variant} {qualifier}") is entry


def test_proposer_searches_first_then_answers_with_the_fitting_hit(client: OpenAI) -> None:
    topic = "Wine cultivar classification from chemical analysis"
    first = _chat(client, _user(render("propose_task", topic=topic, max_tool_calls=3)), 0, tools=[SEARCH_TOOL])
    assert first.message.tool_calls and json.loads(first.message.tool_calls[0].function.arguments) == {"query": "wine"}
    proposal, queries, _ = _propose(client, topic, seed=0, hits=[CO2_HIT, WINE_HIT])
    assert proposal["dataset"] == "sklearn/wine"  # CO2 is ranked first but is a time series
    assert proposal["topic"] == topic and "higher is better" in proposal["metric"]
    assert queries[0] == "wine" and len(queries) <= 3


def test_proposal_conversation_is_deterministic(client: OpenAI) -> None:
    topic = "Atmospheric CO2 concentration forecasting"
    assert _propose(client, topic, 5, [CO2_HIT]) == _propose(client, topic, 5, [CO2_HIT])
    messages = _user(render("propose_task", topic=topic, max_tool_calls=3))
    ids = {_chat(client, messages, 5, tools=[SEARCH_TOOL]).message.tool_calls[0].id for _ in range(2)}
    assert len(ids) == 1


def test_some_first_answers_need_a_nudge_and_then_are_valid(client: OpenAI) -> None:
    entries = [e for e in VOCABULARY if e.family == "tabular_classification"][:12]
    nudges = [_propose(client, e.text, seed=3, hits=[WINE_HIT])[2] for e in entries]
    assert 0 < sum(nudges) < len(entries) and max(nudges) == 1


def test_model_submission_proposal_asks_for_a_model_and_yaml_config(client: OpenAI) -> None:
    proposal, _, _ = _propose(client, "Train and submit a wine cultivar classifier", seed=0, hits=[WINE_HIT])
    assert proposal["dataset"] == "sklearn/wine" and proposal["metric"].startswith("accuracy")
    assert "YAML config" in proposal["description"] and "model" in proposal["description"]


def test_unavailable_topics_propose_their_phantom_dataset(client: OpenAI) -> None:
    entry = next(e for e in VOCABULARY if e.family == "unavailable")
    proposal, queries, _ = _propose(client, entry.text, seed=0, hits=[WINE_HIT])
    assert queries and proposal["dataset"] == entry.phantom_dataset


def test_game_topics_propose_no_dataset_without_searching(client: OpenAI) -> None:
    entry = next(e for e in VOCABULARY if e.family == "game_strategy")
    proposal, queries, _ = _propose(client, entry.text, seed=0, hits=[WINE_HIT])
    assert proposal["dataset"] is None and queries == []


def test_unknown_topics_search_with_their_keywords(client: OpenAI) -> None:
    proposal, queries, _ = _propose(client, "Forecasting weekly CO2 levels", seed=0, hits=[WINE_HIT, CO2_HIT])
    assert queries[0] == "forecasting weekly co2" and proposal["dataset"] == "statsmodels/co2"


def test_streaming_returns_the_same_tool_call(client: OpenAI) -> None:
    messages = _user(render("propose_task", topic="Yearly sunspot activity forecasting", max_tool_calls=2))
    plain = _chat(client, messages, 1, tools=[SEARCH_TOOL]).message.tool_calls[0]
    stream = client.chat.completions.create(model=MODEL_ID, messages=messages, seed=1, tools=[SEARCH_TOOL], stream=True)
    calls = [c.choices[0].delta.tool_calls[0] for c in stream if c.choices and c.choices[0].delta.tool_calls]
    assert [(c.id, c.function.arguments) for c in calls] == [(plain.id, plain.function.arguments)]


def test_unknown_requests_are_client_errors(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "hello"}])


@pytest.fixture
def fake_families(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any, dict[str, Any]]]:
    """Record what the dispatcher hands the families package (written separately)."""
    calls: list[tuple[str, Any, dict[str, Any]]] = []
    fake = types.ModuleType("gymforge.offline.families")

    def write_configs(proposal: dict, *, seed: int, attempt: int) -> str:
        if proposal.get("topic") == "explode":
            raise RuntimeError("boom")
        calls.append(("configs", proposal, {"seed": seed, "attempt": attempt}))
        return "configs"

    def write_code(configs: dict, dataset: dict | None, *, seed: int, attempt: int) -> str:
        calls.append(("code", (configs, dataset), {"seed": seed, "attempt": attempt}))
        return "code"

    fake.write_configs = write_configs  # type: ignore[attr-defined]
    fake.write_code = write_code  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    monkeypatch.setattr(offline_teacher, "families", fake, raising=False)
    return calls


def _configs_prompt(proposal: dict[str, Any]) -> str:
    return render("write_configs", proposal_json=json.dumps(proposal, indent=2), has_dataset=True, local_data=True,
                  entrypoints=["CSVSubmissionTasks", "ModelSubmissionTasks"])


def test_config_writer_gets_the_proposal_and_repairs_count_attempts(fake_families: list) -> None:
    proposal = {"topic": "t", "metric": "accuracy (higher is better)", "description": "d", "dataset": "sklearn/wine"}
    messages = _user(_configs_prompt(proposal))
    assert dispatch.respond({"messages": messages, "seed": 4}).content == "configs"
    repair = render("repair", errors=["configs/tasks/x.yaml: id does not match the file name"])
    messages += [{"role": "assistant", "content": "configs"}, {"role": "user", "content": repair}]
    dispatch.respond({"messages": messages, "seed": 4})
    (_, got, first), (_, again, second) = fake_families
    assert got == again == proposal
    assert (first["attempt"], second["attempt"]) == (0, 1) and first["seed"] == second["seed"]


def test_code_writer_gets_configs_by_path_and_the_dataset(fake_families: list) -> None:
    configs = {"configs/tasks/wine_task.yaml": "id: wine_task\nname: Wine", "configs/datasets/wine.yaml": "name: wine"}
    dataset = {"features": {"alcohol": "float64", "cultivar": "int64"}, "splits": {"train": 142, "test": 36}}
    prompt = render(
        "write_code", configs=configs, dataset={"id": "sklearn/wine"}, dataset_json=json.dumps(dataset, indent=2),
        local_data=True, task_id="wine_task", entrypoint="CSVSubmissionTasks", artefact="submission.csv",
        eval_args="--submission_file", generic_packages=["numpy", "pandas"],
    )
    dispatch.respond({"messages": _user(prompt), "seed": 0})
    [(_, (got_configs, got_dataset), kwargs)] = fake_families
    assert got_configs == configs and kwargs["attempt"] == 0
    assert got_dataset == dataset | {"id": "sklearn/wine", "is_local": True}


def test_dispatch_failures_are_server_errors(client: OpenAI, fake_families: list) -> None:
    proposal = {"topic": "explode", "metric": "m", "description": "d", "dataset": None}
    with pytest.raises(openai.InternalServerError, match="boom"):
        _chat(client, _user(_configs_prompt(proposal)), 0)


def test_real_families_answer_over_http(client: OpenAI) -> None:
    families = pytest.importorskip("gymforge.offline.families")
    if not hasattr(families, "write_configs"):
        pytest.skip("the families package is not written yet")
    # A game needs no dataset, so the proposal is complete without the hub's details.
    proposal = {"topic": "Strategy for the iterated stag hunt against adaptive opponents",
                "metric": "mean payoff per round (higher is better)", "description": "Play the stag hunt.", "dataset": None}
    prompt = render("write_configs", proposal_json=json.dumps(proposal, indent=2), has_dataset=False,
                    local_data=False, entrypoints=["CSVSubmissionTasks", "ModelSubmissionTasks", "PythonSubmissionTasks"])
    reply = _chat(client, _user(prompt), 0).message.content
    assert "```" in reply and "configs/tasks/" in reply


def test_vocabulary_composition() -> None:
    counts = Counter(e.family for e in VOCABULARY)
    assert len(VOCABULARY) >= 100 and set(counts) == set(FAMILIES)
    assert len({e.text for e in VOCABULARY}) == len({normalise(e.text) for e in VOCABULARY}) == len(VOCABULARY)
    data_backed = ("tabular_classification", "tabular_regression", "time_series_forecasting", "model_submission")
    for e in VOCABULARY:
        assert (e.phantom_dataset is not None) == (e.family == "unavailable"), e.text
        assert bool(e.queries) == (e.family != "game_strategy"), e.text
        assert len(e.text.split()) <= 12
    assert 0.45 <= sum(counts[f] for f in data_backed[:3]) / len(VOCABULARY) <= 0.65
    # MLGym's own game tasks are the benchmark and must never be synthesised.
    held_out = ("prisoner", "battle of the sexes", "blotto")
    assert not [e.text for e in VOCABULARY if any(h in e.text.lower() for h in held_out)]
