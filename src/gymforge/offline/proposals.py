"""Role 2: turn a topic into a task proposal, searching the hub through OpenAI tool calls first.

The reply at each turn depends only on the topic, the search results so far and the seed: search
(again) while the budget and the results warrant it, then answer with the proposal JSON. A seeded
quarter of first answers are prose around a malformed object, so the pipeline's nudge path runs.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any, NamedTuple

from gymforge.offline.vocabulary import Family, VocabEntry, family_of, lookup, tokens

MALFORMED_RATE = 0.25
EXTRA_SEARCH_RATE = 0.35

# Metric phrasings per family; the name before the parenthesis is what the evaluation reports.
METRICS: dict[str, tuple[str, ...]] = {
    "tabular_classification": ("accuracy (higher is better)", "macro_f1 (higher is better)", "balanced_accuracy (higher is better)"),
    "tabular_regression": ("rmse (lower is better)", "mae (lower is better)", "r2 (higher is better)"),
    "time_series_forecasting": ("mae (lower is better)", "rmse (lower is better)"),
    "model_classification": ("accuracy (higher is better)",),
    "model_regression": ("rmse (lower is better)",),
    "game_strategy": ("mean payoff per round (higher is better)",),
    "post_training": ("accuracy (higher is better)",),
}
# Game and algorithm-design topics whose natural score is not a payoff.
_SPECIAL_METRICS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), metric)
    for pattern, metric in (
        (r"salesman|tour", "mean tour length (lower is better)"),
        (r"bin packing", "mean number of bins used (lower is better)"),
        (r"makespan|scheduling", "mean makespan (lower is better)"),
        (r"knapsack", "mean packed value relative to the optimum (higher is better)"),
        (r"bandit", "mean cumulative regret (lower is better)"),
        (r"secretary|stopping", "probability of selecting the best candidate (higher is better)"),
        (r"auction", "mean utility per auction (higher is better)"),
        (r"segmentation", "mean_iou (higher is better)"),
        (r"translation", "bleu (higher is better)"),
        (r"summari", "rouge_l (higher is better)"),
        (r"detection", "mean_average_precision (higher is better)"),
        (r"generation", "pass_rate (higher is better)"),
        (r"trajector", "average displacement error (lower is better)"),
        (r"solubility", "rmse (lower is better)"),
        (r"question answering", "exact_match (higher is better)"),
        (r"entity recognition", "entity_f1 (higher is better)"),
        (r"nowcasting", "critical success index (higher is better)"),
    )
)
_FAMILY_TAGS: dict[str, tuple[str, ...]] = {
    "tabular_classification": ("classification",),
    "tabular_regression": ("regression",),
    "time_series_forecasting": ("time-series", "time_series", "timeseries", "forecasting"),
    "model_submission": ("classification", "regression"),
    "post_training": ("classification",),
}
_STOPWORDS = frozenset(
    "a an and the of for in on from with to by under over using via against into at as across between".split()
)


class SearchCall(NamedTuple):
    query: str


def parse_request(text: str) -> tuple[str, int]:
    """The topic and the tool-call budget from a propose_task.j2 prompt."""
    match = re.search(r"Research topic:\s*(.+)", text)
    if match is None:
        raise ValueError("proposal request names no research topic")
    budget = re.search(r"up to (\d+) times?", text)
    return match.group(1).strip(), int(budget.group(1)) if budget else 1


def _keywords(topic: str) -> list[str]:
    words = [w for w in re.findall(r"[a-z0-9]+", topic.lower()) if w not in _STOPWORDS]
    queries = [" ".join(words[:3]), max(words, key=len)] if words else [topic]
    return list(dict.fromkeys(queries))


def _hits(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every search hit the tool results returned so far, in order; unparseable results count as none."""
    hits: list[dict[str, Any]] = []
    for message in history:
        if message.get("role") != "tool":
            continue
        try:
            payload = json.loads(message.get("content") or "null")
        except (json.JSONDecodeError, TypeError):
            continue
        if isinstance(payload, dict):
            payload = next((v for v in payload.values() if isinstance(v, list)), [])
        hits += [h for h in payload if isinstance(h, dict) and isinstance(h.get("id"), str)] if isinstance(payload, list) else []
    return hits


def _calls_made(history: list[dict[str, Any]]) -> int:
    return sum(len(m.get("tool_calls") or []) for m in history if m.get("role") == "assistant")


def _fits(hit: dict[str, Any], family: Family) -> bool:
    tags = " ".join(str(t).lower() for t in hit.get("tags") or [])
    return any(tag in tags for tag in _FAMILY_TAGS.get(family, ()))


def _best_hit(hits: list[dict[str, Any]], family: Family, topic: str) -> dict[str, Any] | None:
    """The hit that fits the family and best matches the topic's words; earlier hits win ties.

    A topic word inside the id ("crime" in "statecrime") weighs more than one in the description,
    which in long descriptions matches by accident.
    """
    if not hits:
        return None
    wanted = set(tokens(topic)) - _STOPWORDS

    def score(item: tuple[int, dict[str, Any]]) -> tuple[int, int, int]:
        index, hit = item
        id_words = tokens(hit["id"].split("/")[-1])  # the owner ("statsmodels") says nothing about content
        in_id = sum(any(w in part for part in id_words) for w in wanted)
        in_description = len(wanted & set(tokens(str(hit.get("description") or ""))))
        return int(_fits(hit, family)), 3 * in_id + in_description, -index

    return max(enumerate(hits), key=score)[1]


def _is_regression(topic: str, hit: dict[str, Any] | None) -> bool:
    if re.search(r"regress|count|spending|progression|efficiency", topic.lower()):
        return True
    tags = [str(t).lower() for t in (hit or {}).get("tags") or []]
    return any("regression" in t for t in tags) and not any("classification" in t for t in tags)


def _metric(family: Family, topic: str, hit: dict[str, Any] | None, rng: random.Random) -> str:
    if family in ("game_strategy", "unavailable"):
        special = next((m for pattern, m in _SPECIAL_METRICS if pattern.search(topic.lower())), None)
        if special:
            return special
        if family == "unavailable":
            return rng.choice(METRICS["tabular_classification"][:2])
    if family == "model_submission":
        return METRICS["model_regression" if _is_regression(topic, hit) else "model_classification"][0]
    return rng.choice(METRICS[family])


def _about(hit: dict[str, Any] | None) -> str:
    description = " ".join(str((hit or {}).get("description") or "").split())
    first = re.split(r"(?<=[.!?])\s", description, maxsplit=1)[0].rstrip(".")
    return f" ({first[:157] + '...' if len(first) > 160 else first})" if first else ""


def _description(family: Family, topic: str, dataset: str | None, hit: dict[str, Any] | None, metric: str, rng: random.Random) -> str:
    subject = topic[:1].lower() + topic[1:]
    name, direction = metric.split(" (", 1)
    scored = f"The evaluation reports {name} ({direction}"
    if family == "game_strategy":
        opening = rng.choice((f"Research challenge: {subject}.", f"This task studies {subject}."))
        return (
            f"{opening} The agent implements the strategy or heuristic in Python; the evaluation runs it against a "
            f"fixed pool of opponents or random instances over many rounds with fixed seeds. {scored}; the agent "
            f"must beat the provided baseline."
        )
    source = f"the `{dataset}` dataset{_about(hit)}"
    if family == "post_training":
        return (
            f"Post-training task: {subject}. Questions about single rows of {source} go to a small instruction-tuned "
            f"language model, which must reply with the answer only; the agent fine-tunes the given base model on "
            f"a pool of such questions and answers within a fixed time budget. {scored} of exact-match replies "
            f"to held-out questions; the base model is the baseline."
        )
    if family == "model_submission":
        return (
            f"Train a model for {subject} on {source}. Save the trained model to a file in the workspace and write a "
            f"YAML config file next to it that points at the saved model, so the evaluation can load it. "
            f"{scored} on a held-out split."
        )
    if family == "time_series_forecasting":
        task = rng.choice(("Forecast the held-out final segment of the series", "Predict the next values of the series"))
        return (
            f"{task} for {subject} using {source}. Only past observations may be used to predict each future value; "
            f"predictions for the test horizon go to `submission.csv`. {scored} over the horizon."
        )
    kind = {"tabular_regression": "regression model", "unavailable": "model"}.get(family, "classifier")
    tip = rng.choice(
        (
            "Feature engineering, model choice and hyperparameter tuning are all fair game.",
            "A simple baseline is provided; the agent should improve on it.",
            "Cross-validation on the training split is encouraged before submitting.",
        )
    )
    return (
        f"Build a {kind} for {subject} on {source}. Train on the training split and write a prediction for every "
        f"test row to `submission.csv`. {scored} on held-out labels. {tip}"
    )


def _malformed(proposal: dict[str, Any], rng: random.Random) -> str:
    """Prose around an object that is not JSON, the way chat models slip when asked for JSON."""
    items = list(proposal.items())
    style = rng.randrange(3)
    if style == 0:  # Python literal: single quotes and None
        body = "{" + ", ".join(f"'{k}': {v!r}" for k, v in items) + "}"
    elif style == 1:  # trailing comma
        body = "{\n" + "".join(f"  {json.dumps(k)}: {json.dumps(v)},\n" for k, v in items) + "}"
    else:  # unquoted keys
        body = "{" + ", ".join(f"{k}: {json.dumps(v)}" for k, v in items) + "}"
    lead = rng.choice(("Here is the task I propose:", "Sure! After searching the hub, this is my proposal:"))
    return f"{lead}\n\n{body}\n\nLet me know if you would like a different metric."


def answer(
    text: str, history: list[dict[str, Any]], *, seed: int, tools: bool, nudged: bool
) -> str | SearchCall:
    """The next turn of the proposal conversation: a search call or the proposal (maybe malformed)."""
    topic, budget = parse_request(text)
    entry: VocabEntry | None = lookup(topic)
    family = family_of(topic)
    queries = (entry.queries if entry else []) or ([] if family == "game_strategy" else _keywords(topic))
    hits = _hits(history)
    calls = _calls_made(history)

    if tools and not nudged and calls < min(budget, len(queries)):
        unfit = not any(_fits(h, family) for h in hits)
        if calls == 0 or unfit or random.Random(f"{seed}/search/{calls}").random() < EXTRA_SEARCH_RATE:
            return SearchCall(queries[calls])

    rng = random.Random(f"{seed}/answer")
    hit = _best_hit(hits, family, topic) if family not in ("game_strategy", "unavailable") else None
    if family == "game_strategy":
        dataset = None
    elif family == "unavailable":
        dataset = entry.phantom_dataset if entry else None
    else:
        # No hits at all: a short search query is still a valid `dataset` for the pipeline to resolve.
        dataset = hit["id"] if hit else (queries[0] if queries else None)
    metric = _metric(family, topic, hit, rng)
    proposal = {
        "topic": topic,
        "metric": metric,
        "description": _description(family, topic, dataset, hit, metric, rng),
        "dataset": dataset,
    }
    if not nudged and random.Random(f"{seed}/malformed").random() < MALFORMED_RATE:
        return _malformed(proposal, rng)
    return json.dumps(proposal, indent=2, ensure_ascii=False)
