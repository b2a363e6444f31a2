"""Pieces every task family shares: seeded choices, names, column roles, the task spec and its facts.

The config writer and the code writer run in different requests with different seeds, so everything
the code must agree with (target, metric, game parameters...) travels in the task description as a
block of `- key: value` facts that the code writer parses back.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import jinja2

from gymforge.offline import vocabulary

Kind = Literal["numeric", "categorical", "time"]

HIGHER_IS_BETTER: dict[str, bool] = {
    "accuracy": True, "macro_f1": True, "rmse": False, "mae": False, "r2": True, "Score": True,
}
_METRIC_ALIASES: dict[str, str] = {
    "accuracy": "accuracy", "acc": "accuracy", "f1": "macro_f1", "macrof1": "macro_f1", "f1macro": "macro_f1",
    "rmse": "rmse", "rootmeansquarederror": "rmse", "mae": "mae", "meanabsoluteerror": "mae", "r2": "r2",
    "rsquared": "r2", "r2score": "r2", "coefficientofdetermination": "r2",
}
# Filler words left out of ids and topic matching.
_STOPWORDS = frozenset(
    "a an the of for to in on with by from and or using via under against versus vs before after across into over "
    "between within".split()
)
_ID_LIKE = re.compile(r"^(id|index|name|individual|row_?id)$", re.IGNORECASE)
_TIME_NAMES = frozenset(
    {"date", "time", "timestamp", "datetime", "ds", "year", "quarter", "month", "week", "day", "period"}
)
_ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}")
FACTS_HEADING = "Task facts:"

# The programs the offline teacher writes (evaluation scripts, baselines, the agent's improvements), each a whole
# file: Jinja templates in gymforge/offline/programs/ (package data). Whole-line `{% ... %}` tags vanish.
_PROGRAMS = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).resolve().parents[1] / "programs"), autoescape=False,
    keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)


def program(name: str, **context: object) -> str:
    """The program template `name` (gymforge/offline/programs/<name>) filled in with `context`."""
    return _PROGRAMS.get_template(name).render(**context)


def seeded(seed: int, *parts: Any) -> random.Random:
    """An RNG fixed by the seed and the inputs; sha256 because `hash()` is salted per process."""
    digest = hashlib.sha256(json.dumps([seed, *parts], sort_keys=True, default=str).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def normalize_metric(text: str) -> str | None:
    return _METRIC_ALIASES.get(re.sub(r"[^a-z0-9]", "", text.lower()))


def words(text: str) -> list[str]:
    return [w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in _STOPWORDS]


def join_words(parts: list[str], style: Literal["camel", "snake"]) -> str:
    if style == "snake":
        return "_".join(parts)
    return parts[0] + "".join(p[:1].upper() + p[1:] for p in parts[1:])


def other_style(identifier: str) -> str:
    """The same id in the other case style: what a hurried author types in the `id` field."""
    if "_" in identifier:
        return join_words(identifier.split("_"), "camel")
    return re.sub(r"(?<=[a-z0-9])([A-Z])", lambda m: "_" + m.group(1).lower(), identifier)


def make_id(parts: list[str], rng: random.Random) -> str:
    """snake_case or camelCase from the first three or four words; a leading digit breaks MLGym's id pattern."""
    parts = parts[: rng.choice((3, 4))] or ["task"]
    if parts[0][0].isdigit():
        parts = ["task", *parts]
    if len(parts) == 1:
        parts.append("task")  # one word reads the same in both styles, and the id-mismatch bug needs two
    return join_words(parts, rng.choice(("camel", "snake")))


def escape_braces(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


@dataclass(frozen=True)
class Column:
    name: str
    dtype: str
    kind: Kind
    examples: tuple[Any, ...] = ()

    @property
    def discrete(self) -> bool:
        return self.kind == "categorical" or self.dtype.startswith(("int", "uint", "class_label"))


def _kind(name: str, dtype: str, examples: list[Any], time_column: str | None) -> Kind:
    d = dtype.lower()
    if name == time_column or "timestamp" in d or "date" in d:
        return "time"
    if any(t in d for t in ("float", "int", "double")) and "class_label" not in d:
        return "numeric"
    if name.lower() in _TIME_NAMES and examples and all(isinstance(v, str) and _ISO_DATE.match(v) for v in examples):
        return "time"
    return "categorical"


def columns(dataset: dict[str, Any], time_column: str | None = None) -> list[Column]:
    """Dataset columns with their role-relevant kind, in schema order."""
    rows = dataset.get("example_rows") or []
    time_column = time_column or (dataset.get("card_data") or {}).get("time_column")
    out = []
    for name, dtype in (dataset.get("features") or {}).items():
        examples = [r[name] for r in rows if isinstance(r, dict) and r.get(name) is not None]
        out.append(Column(name, str(dtype), _kind(name, str(dtype), examples, time_column), tuple(examples)))
    return out


def n_rows(dataset: dict[str, Any]) -> int:
    """Rows in the whole dataset; the hub counts them before the pipeline splits train from test."""
    return sum((dataset.get("splits") or {}).values())


def is_id_like(column: Column) -> bool:
    return bool(_ID_LIKE.match(column.name))


def is_calendar(column: Column) -> bool:
    """A year, quarter or month column: it orders rows but is no quantity to predict."""
    return column.kind == "time" or column.name.lower() in _TIME_NAMES


def subject_words(topic: str) -> list[str]:
    """Singularised words of what a topic is about: "Penguin island prediction from bill size" -> penguin island
    prediction; the words after "from", "using"... name the inputs, not the target."""
    subject = re.split(r"\b(?:from|using|with|given|under|via|by|to)\b", topic.lower(), maxsplit=1)[0]
    return [w for w in vocabulary.tokens(subject) if w not in _STOPWORDS]


def topic_match(column: Column, topic_words: list[str]) -> int:
    """How many of the column name's words the topic words name (`invest` matches `investment`)."""
    names = vocabulary.tokens(column.name.replace("_", " "))
    return sum(any(w == t or (len(w) >= 5 and t.startswith(w)) for t in topic_words) for w in names)


@dataclass(frozen=True)
class Game:
    """Everything about a game the description states and the evaluation must agree with."""

    kind: str
    moves: tuple[str, ...] = ()
    payoff: tuple[tuple[float, ...], ...] = ()
    rounds: int = 0
    pie: int = 0
    items: tuple[int, int] = (0, 0)  # items per instance, inclusive
    sizes: tuple[int, int] = (0, 0)  # item sizes, inclusive
    capacity: int = 0
    instances: int = 0


@dataclass(frozen=True)
class TaskSpec:
    """What the code writer must know about a task; recoverable from the configs and the dataset."""

    family: str
    task_id: str
    metric: str
    problem: str = ""  # classification | regression | forecasting, for the data families
    target: str = ""
    time_column: str = ""
    columns: tuple[Column, ...] = ()
    n_rows: int = 0
    game: Game | None = None
    facts: tuple[tuple[str, str], ...] = ()  # the description's facts a family needs beyond the fields above

    @property
    def higher_is_better(self) -> bool:
        return HIGHER_IS_BETTER[self.metric]

    @property
    def direction(self) -> str:
        return "higher is better" if self.higher_is_better else "lower is better"

    def features(self) -> list[Column]:
        """Columns a model may use: not the target, not the time axis, not an identifier."""
        return [c for c in self.columns if c.name != self.target and c.kind != "time" and not is_id_like(c)]


def format_facts(facts: dict[str, str]) -> str:
    return FACTS_HEADING + "\n" + "\n".join(f"- {k}: {v}" for k, v in facts.items())


def parse_facts(description: str) -> dict[str, str]:
    """The `- key: value` lines under the facts heading, braces un-doubled."""
    _, _, tail = description.partition(FACTS_HEADING)
    facts = {}
    for line in tail.splitlines()[1:]:
        m = re.match(r"^- ([a-z ]+): (.*)$", line.strip())
        if not m:
            break
        facts[m.group(1)] = m.group(2).replace("{{", "{").replace("}}", "}")
    return facts


def markdown(files: dict[str, str]) -> str:
    """The teacher's answer: one fenced block per file, the path as a first-line comment."""
    lang = {"yaml": "yaml", "py": "python"}
    blocks = []
    for path, text in files.items():
        blocks.append(f"```{lang.get(path.rsplit('.', 1)[-1], '')}\n# {path}\n{text.rstrip()}\n```")
    return "\n\n".join(blocks) + "\n"


def proposal_text(proposal: dict[str, Any]) -> str:
    return str(proposal.get("description") or proposal.get("topic") or "").strip()


def description(intro: str, body: list[str], facts: dict[str, str], example: str, closing: str) -> str:
    """Intro, body paragraphs (already escaped), facts, a brace-bearing example, closing.

    Only the intro, the facts and the example can hold literal braces; they are escaped here.
    """
    parts = [escape_braces(intro), *body, escape_braces(format_facts(facts)), escape_braces(example), closing]
    return "\n\n".join(p for p in parts if p)
