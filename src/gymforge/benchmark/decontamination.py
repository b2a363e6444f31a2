"""Decontamination: no synthesized task may share a dataset or a task family with the benchmark
(docs/scores.md, Benchmark).

A synthesized task (an MLGym-layout tree: `configs/tasks/<id>.yaml` and its dataset configs) conflicts
with a benchmark task when
- dataset: one of its dataset identities equals one of the benchmark task's. A task's identities are its
  dataset configs' names, their `data_path` when it is a Hugging Face id, the `Source: <id>` line
  gymforge writes into a local dataset's description, a local `data_path` by its last directory (unless
  that is `data`), and any the caller adds (the proposal's dataset id). Identities are compared
  normalised: case, separators, an `org/` prefix and a trailing `data`/`dataset` do not count
  (`zalando-datasets/fashion_mnist` == `Fashion-MNIST`);
- family: one of the benchmark task's keyword phrases occurs, word for word, in the task's id (camelCase
  and snake_case split into words), name, description or the caller's extra text (the proposal's topic).
  Words are compared lower-cased, singularised and without apostrophes ("Prisoner's Dilemmas" matches
  "prisoners dilemma").

`check` returns a report; `write_report` stores it; `enforce` raises `ContaminationError` listing the
conflicts; `run` does both for the `gymforge decontamination` command. What a conflict does is the run's policy
(`decontamination.on_overlap`): `drop` (the default) keeps the build going and records the overlapping tasks in
the report's `dropped`, which the SFT data and the RL pool leave out; `fail` stops the build.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from gymforge.core import atomic
from gymforge.benchmark.suite import BenchmarkTask, load_benchmark
from gymforge.core.dedup import words as tokens

_SOURCE = re.compile(r"^\s*Source:\s*`?([^\s,`]+)`?", re.MULTILINE)


class ContaminationError(RuntimeError):
    """Synthesized tasks overlap the benchmark; the message lists every conflict."""

    def __init__(self, report: DecontaminationReport) -> None:
        self.report = report
        super().__init__(describe(report))


class Conflict(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task_id: str  # the synthesized task
    tree: str = ""  # its MLGym tree, as given to `check`
    benchmark_task: str
    kind: Literal["dataset", "family"]
    detail: str


class DecontaminationReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ok: bool
    benchmark: str
    checked: int  # synthesized tasks checked
    conflicts: list[Conflict] = Field(default_factory=list)
    on_overlap: Literal["drop", "fail"] = "fail"
    dropped: dict[str, str] = Field(default_factory=dict, description="Items left out of the SFT data and the RL "
                                    "pool under `on_overlap: drop` (a topic slot, or a tree when it has none), with "
                                    "the reason.")


class Extra(BaseModel):
    """What the caller knows of a synthesized task beyond its tree (e.g. from its proposal)."""

    model_config = ConfigDict(extra="forbid")

    text: str = ""  # scanned for family keywords, like the description
    datasets: list[str] = Field(default_factory=list)


# ---- normalisation -------------------------------------------------------------------------------------


def words(text: str) -> list[str]:
    """Lower-cased, singularised words: camelCase, snake_case, letters/digits and punctuation split them."""
    text = re.sub(r"['\u2019`]", "", text)
    text = re.sub(r"([a-z])([A-Z])", r"\1 \2", text)
    text = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1 \2", text)
    text = re.sub(r"(?<=[A-Za-z])(?=\d)|(?<=\d)(?=[A-Za-z])", " ", text)
    return tokens(text)


def dataset_key(identity: str) -> str:
    """`org/Some-Name_data` -> `somename`: what two identities of one dataset have in common."""
    name = identity.strip().rstrip("/").rsplit("/", 1)[-1].lower()
    key = re.sub(r"[^a-z0-9]", "", name)
    for suffix in ("dataset", "data"):
        if key.endswith(suffix) and len(key) > len(suffix):
            key = key[: -len(suffix)]
            break
    return key


def _find(phrase: list[str], text: list[str]) -> int | None:
    n = len(phrase)
    for i in range(len(text) - n + 1):
        if text[i : i + n] == phrase:
            return i
    return None


# ---- reading synthesized trees ---------------------------------------------------------------------------


class _Synth(BaseModel):
    id: str
    path: Path
    fields: dict[str, str]  # where -> text, for the family check
    datasets: list[tuple[str, str]]  # (identity, where it came from)


def _yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ValueError(f"{path}: cannot read it as YAML: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a YAML mapping, got {type(data).__name__}")
    return data


def _read_tree(tree: Path) -> list[_Synth]:
    if not tree.is_dir():
        raise FileNotFoundError(f"synthesized task tree {tree} does not exist")
    # A slot whose task was discarded leaves an empty tree behind: nothing to check there.
    configs = tree / "configs" / "tasks"
    paths = sorted(configs.glob("*.yaml")) if configs.is_dir() else []
    found = []
    for path in paths:
        task = _yaml(path)
        task_id = str(task.get("id") or path.stem)
        fields = {"id": task_id, "name": str(task.get("name") or ""),
                  "description": str(task.get("description") or "")}
        datasets: list[tuple[str, str]] = []
        for entry in task.get("dataset_configs") or []:
            dataset_path = tree / "configs" / str(entry)
            if not dataset_path.is_file():
                continue  # a broken tree is verification's business; nothing to compare here
            dataset = _yaml(dataset_path)
            label = f"dataset config {entry}"
            if dataset.get("name"):
                datasets.append((str(dataset["name"]), f"{label} (name)"))
            data_path = str(dataset.get("data_path") or "")
            if data_path and not dataset.get("is_local", False):
                datasets.append((data_path, f"{label} (data_path)"))
            elif data_path.rstrip("/").rsplit("/", 1)[-1] not in ("", "data"):
                datasets.append((data_path, f"{label} (local data_path)"))  # e.g. data/fashion_mnist
            for source in _SOURCE.findall(str(dataset.get("description") or "")):
                datasets.append((source.rstrip(".,;:"), f"{label} (description: Source)"))
        found.append(_Synth(id=task_id, path=path, fields=fields, datasets=datasets))
    return found


def _extra_for(extra: Mapping[str, Extra | str], tree: Path, synth: _Synth) -> Extra:
    for key in (str(tree), str(tree.resolve()), synth.id):
        if key in extra:
            value = extra[key]
            return Extra(text=value) if isinstance(value, str) else value
    return Extra()


# ---- the check -----------------------------------------------------------------------------------------------


def _benchmark_name(benchmark: Sequence[BenchmarkTask]) -> str:
    names = sorted({t.benchmark for t in benchmark})
    return names[0] if len(names) == 1 else "+".join(names) or "empty"


def check(
    benchmark: Sequence[BenchmarkTask],
    synthesized: Sequence[Path | str],
    extra: Mapping[str, Extra | str] | None = None,
    *,
    benchmark_name: str | None = None,
) -> DecontaminationReport:
    """Compare every task of the `synthesized` MLGym trees with every benchmark task.

    `extra` maps a tree path (as given) or a task id to more of that task's text and dataset identities;
    a plain string is text.
    """
    extra = extra or {}
    phrases = {t.id: [(kw, words(kw)) for kw in t.keywords if words(kw)] for t in benchmark}
    identities = {(t.id, dataset_key(d)): d for t in benchmark for d in t.datasets if dataset_key(d)}
    conflicts: list[Conflict] = []
    checked = 0
    for tree in map(Path, synthesized):
        for synth in _read_tree(tree):
            checked += 1
            more = _extra_for(extra, tree, synth)
            tokens = {field: words(text) for field, text in {**synth.fields, "extra text": more.text}.items()}
            datasets = [*synth.datasets, *((d, "extra datasets") for d in more.datasets)]
            for task in benchmark:
                for identity, source in datasets:
                    known = identities.get((task.id, dataset_key(identity)))
                    if known is not None:
                        conflicts.append(Conflict(
                            task_id=synth.id, tree=str(tree), benchmark_task=task.id, kind="dataset",
                            detail=f"{synth.path}: its dataset {identity!r} ({source}) is the benchmark dataset "
                                   f"{known!r} of {task.id}",
                        ))
                        break
                hit = next(((keyword, field, at, phrase) for keyword, phrase in phrases[task.id]
                            for field, text in tokens.items() if (at := _find(phrase, text)) is not None), None)
                if hit is not None:
                    keyword, field, at, phrase = hit
                    context = " ".join(tokens[field][max(0, at - 6) : at + len(phrase) + 6])
                    conflicts.append(Conflict(
                        task_id=synth.id, tree=str(tree), benchmark_task=task.id, kind="family",
                        detail=f"{synth.path}: its {field} names the {task.family} family of {task.id} "
                               f"(keyword {keyword!r}: \"... {context} ...\")",
                    ))
    return DecontaminationReport(ok=not conflicts, benchmark=benchmark_name or _benchmark_name(benchmark),
                                 checked=checked, conflicts=conflicts)


def describe(report: DecontaminationReport) -> str:
    """A human-readable summary: one line per conflict."""
    if report.ok:
        return f"decontamination: {report.checked} synthesized task(s) share no dataset or family with the " \
               f"{report.benchmark} benchmark"
    if report.on_overlap == "drop":
        head = (f"decontamination: {len(report.dropped)} of {report.checked} synthesized task(s) overlap the "
                f"{report.benchmark} benchmark and are left out of the SFT data and the RL pool "
                f"(decontamination.on_overlap: drop):")
    else:
        head = (f"decontamination failed: {len(report.conflicts)} conflict(s) between {report.checked} synthesized "
                f"task(s) and the {report.benchmark} benchmark (remove those tasks, change the benchmark, or set "
                f"decontamination.on_overlap: drop):")
    lines = [head]
    lines += [f"- {c.task_id} vs {c.benchmark_task} [{c.kind}]: {c.detail}" for c in report.conflicts]
    return "\n".join(lines)


def write_report(report: DecontaminationReport, out: Path | str) -> Path:
    """The report as JSON, written atomically."""
    return atomic.write_text(out, report.model_dump_json(indent=2) + "\n")


def enforce(report: DecontaminationReport) -> None:
    """Raise ContaminationError (listing every conflict) unless the report is clean or its policy drops them."""
    if not report.ok and report.on_overlap == "fail":
        raise ContaminationError(report)


def drop_overlaps(report: DecontaminationReport, item_of: Callable[[str], str] = str) -> DecontaminationReport:
    """`report` under the `drop` policy: every synthesized tree with a conflict goes to `dropped` (keyed by
    `item_of(tree)`, e.g. its topic slot), the reason naming the benchmark task and how it overlaps."""
    dropped: dict[str, str] = {}
    for c in report.conflicts:
        dropped.setdefault(item_of(c.tree), f"benchmark_overlap: {c.kind} of {c.benchmark_task} ({c.task_id})")
    return report.model_copy(update={"on_overlap": "drop", "dropped": dict(sorted(dropped.items()))})


def dropped_items(report_json: Path | str) -> dict[str, str]:
    """The items a written report leaves out of the SFT data and the RL pool (none under `fail`)."""
    return DecontaminationReport.model_validate_json(Path(report_json).read_text()).dropped


# ---- pipeline glue -------------------------------------------------------------------------------------------


def proposal_extra(proposal_json: Path | str) -> Extra:
    """Topic, proposal text and dataset id from a `results/proposals/<slot>.json`."""
    data = json.loads(Path(proposal_json).read_text())
    proposal = data.get("proposal") or {}
    texts = [data.get("topic"), proposal.get("topic"), proposal.get("description")]
    datasets = [(data.get("dataset") or {}).get("id"), proposal.get("dataset")]
    return Extra(text="\n".join(dict.fromkeys(str(t) for t in texts if t)),
                 datasets=[str(d) for d in dict.fromkeys(datasets) if isinstance(d, str) and d])


def run(
    evaluate_cfg: Any,
    synthesized: Sequence[Path | str],
    out: Path | str,
    extra: Mapping[str, Extra | str] | None = None,
    *,
    on_overlap: Literal["drop", "fail"] = "fail",
    item_of: Callable[[str], str] = str,
) -> DecontaminationReport:
    """Check against the configured benchmark and write the report to `out`; raise if it is not clean, unless
    `on_overlap` is `drop` (then the overlapping trees are the report's `dropped`, keyed by `item_of(tree)`)."""
    report = check(load_benchmark(evaluate_cfg), synthesized, extra, benchmark_name=evaluate_cfg.benchmark)
    if on_overlap == "drop":
        report = drop_overlaps(report, item_of)
    write_report(report, out)
    enforce(report)
    return report
