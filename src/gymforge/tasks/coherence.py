"""Does a task say what it scores? Its text checked against its own config, evaluator and installed data.

An agent reads a task's description and optimizes what it says. A description that names MAE while the evaluator
prints RMSE, that asks for 1-based ids the evaluator refuses, or that names a split the data does not have sends
the agent (and the student that learns from its trajectories) the wrong way. The check, deterministic first:

- **metric**: every metric the text names by a known name (the facts list, a scorer-output example, a sentence
  that says how the task is scored) must be one the evaluation prints; `baseline_scores` and the declared metric
  must be printed too (`gymforge.tasks.metrics` knows "macro-averaged F1" is `macro_f1`);
- **direction**: a direction stated for the evaluation's metric must be the declared one, and a known metric's
  declared direction its natural one (RMSE is lower-better);
- **submission format** (CSV tasks): the file name, the columns and the id base the text gives must be those of
  the baseline's accepted artefact; then a submission written as the text says is scored by the evaluation;
- **data**: a dataset id, a split or a target column the text names must be the installed ones;
- **template**: no unrendered placeholder but MLGym's `{dataset_docs}`.

What the rules cannot read (a metric described in words, a direction implied) goes to the teacher
(`check_coherence.j2`, a structured verdict), when the rules found nothing and a teacher is given.
"""

from __future__ import annotations

import csv
import io
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gymforge.agent.errors import EvaluationFormatError, SubmissionNotFound
from gymforge.core.prompts import render
from gymforge.core.records import CoherenceFinding, CoherenceReport
from gymforge.llm.json_reply import ask_for_json
from gymforge.tasks.metrics import (canonical_metric, direction_in, known_metric, metrics_named, natural_direction,
                                    same_metric)

DATASET_DOCS = "{dataset_docs}"
# A sentence that says how the task is scored: the metric it names is a claim about the evaluation.
_SCORING = re.compile(r"\b(report|reports|reported|score|scored|scores|scoring|evaluat\w*|metric|measured|graded|"
                      r"judged|ranked|optimi[sz]e|maximi[sz]e|minimi[sz]e|is better)\b", re.I)
# Prose words that are metric names only in a scoring sentence ("numerical precision" is no metric).
_AMBIGUOUS = frozenset({"precision", "recall", "acc", "f1"})
_PERCENTAGE = re.compile(r"\bpercentage\b|\bin percent\b|\bas a percent\b", re.I)
_PLACEHOLDER = re.compile(r"(?<!\{)\{([A-Za-z_][\w.]*)\}(?!\})")
_JINJA = re.compile(r"\{\{\s*([A-Za-z_][\w.]*)\s*\}\}")
_FACT = re.compile(r"^\s*-\s*([a-z ]+):\s*(.+?)\s*$", re.M)
_JSON_OBJECT = re.compile(r"\{[^{}]*\}")
_CSV_NAME = re.compile(r"(?<![\w/.-])([\w.-]+\.csv)\b")
_DATASET_ID = re.compile(r"`([A-Za-z0-9][\w.-]*/[\w.-]+)`")
_SPLIT = re.compile(r"\bsplits?\s+((?:`\w+`(?:,\s*|\s+and\s+|\s*,\s*and\s+)?)+)", re.I)
_SPLIT_NAMED = re.compile(r"(?:held-out|the)\s+`(\w+)`\s+split", re.I)
_TARGET = (re.compile(r"^\s*-\s*target column:\s*`?([\w .-]+?)`?\s*$", re.M),
           re.compile(r"\bpredict the (?:[\w-]+ )?column `([^`]+)`", re.I))
_COLUMNS = re.compile(r"\bcolumns?\s+((?:`?[\w.-]+`?(?:,\s*|\s+and\s+))+`?[\w.-]+`?)", re.I)
_ZERO = re.compile(r"\b(0-based|zero-based|starting (?:at|from) 0|ids? 0\s*(?:\.\.|to|-))", re.I)
_ONE = re.compile(r"\b(1-based|one-based|starting (?:at|from) 1|ids? 1\s*(?:\.\.|to|-))", re.I)


def sentences(text: str) -> list[str]:
    """The text's sentences and list lines, whitespace collapsed."""
    parts = re.split(r"(?<=[.!?])\s+(?=[A-Z`({])|\n\s*\n|\n(?=\s*-\s)", text)
    return [" ".join(p.split()) for p in parts if p.strip()]


def rendered(description: str) -> str:
    """The description as the agent reads it, `{dataset_docs}` left out: doubled braces undone."""
    return description.replace(DATASET_DOCS, "").replace("{{", "{").replace("}}", "}")


def facts_of(text: str) -> dict[str, str]:
    """The `- key: value` lines of a text (the offline teacher's facts list, MLGym's bullet lists)."""
    return {k.strip(): v for k, v in _FACT.findall(text)}


def _finding(kind: str, evidence: str, stated: str, actual: str, file: str, by: str = "rules") -> CoherenceFinding:
    return CoherenceFinding(kind=kind, evidence=evidence[:400], stated=stated, actual=actual, file=file, by=by)


# -- the template -----------------------------------------------------------------------------------------


def check_placeholders(description: str, file: str) -> list[CoherenceFinding]:
    """Single-brace fields other than `{dataset_docs}` (str.format would fail or fill them) and Jinja's
    `{{ name }}` (rendered as `{ name }`)."""
    found = []
    for pattern in (_PLACEHOLDER, _JINJA):
        for m in pattern.finditer(description):
            if m.group(0) == DATASET_DOCS:
                continue
            line = next(s for s in description.splitlines() if m.group(0) in s)
            found.append(_finding("placeholder", line.strip(), m.group(0), "nothing fills it: the agent reads it "
                                  "as written (only {dataset_docs} is filled)", file))
    return found


# -- the metric and its direction -------------------------------------------------------------------------


def _printed_names(printed: dict[str, float]) -> str:
    return ", ".join(printed) or "nothing"


def _stated_metrics(text: str) -> list[tuple[str, str, str]]:
    """(metric as written, its direction text or "", evidence) of every claim the text makes about the metric."""
    claims: list[tuple[str, str, str]] = []
    for key, value in facts_of(text).items():
        if key in ("metric", "metrics", "evaluation metric", "scoring"):
            name = re.split(r"\s*[(;,]", value, maxsplit=1)[0].strip(" `")
            claims.append((name, value, f"- {key}: {value}"))
    for sentence in sentences(text):
        if sentence.lstrip().startswith("- "):
            continue
        for obj in _JSON_OBJECT.findall(sentence):
            try:
                parsed = json.loads(obj)
            except json.JSONDecodeError:
                continue
            if isinstance(parsed, dict) and parsed and all(isinstance(v, (int, float)) for v in parsed.values()) \
                    and any(known_metric(k) for k in parsed) and "id" not in parsed:
                claims += [(k, "", sentence) for k in parsed]
        if _SCORING.search(sentence):
            for _, written in metrics_named(sentence.replace("`", "")):
                claims.append((written, sentence, sentence))
    return claims


def stated_metric(description: str) -> str | None:
    """The metric the text states first (its facts list first), for the prompts that carry it forward."""
    claims = _stated_metrics(rendered(description))
    return claims[0][0] if claims else None


def check_metric(description: str, printed: dict[str, float], recorded: list[dict[str, float]],
                 metric: str | None, higher_is_better: bool | None, file: str,
                 evaluator: str) -> list[CoherenceFinding]:
    """Metric names (and directions) the text states against what the evaluation printed, `baseline_scores`
    and the declared metric."""
    text = rendered(description)
    found: list[CoherenceFinding] = []
    if printed:
        for name in dict.fromkeys(k for entry in recorded for k in entry):
            if not any(same_metric(name, p) for p in printed):
                found.append(_finding("metric", f"baseline_scores: {recorded}", name,
                                      f"the evaluation prints {_printed_names(printed)}", file))
        if metric and not any(same_metric(metric, p) for p in printed):
            found.append(_finding("metric", f"the task's declared metric: {metric}", metric,
                                  f"the evaluation prints {_printed_names(printed)}", evaluator))
    seen: set[tuple[str, str]] = set()
    for name, direction_text, evidence in _stated_metrics(text):
        if (canonical_metric(name), evidence) in seen:
            continue
        seen.add((canonical_metric(name), evidence))
        words = name.lower()
        if words in _AMBIGUOUS and not _SCORING.search(evidence):
            continue
        match = next((p for p in printed if same_metric(name, p)), None)
        if printed and match is None:
            # A sentence naming the printed metric beside another (RMSE, unlike MAE, ...) is no claim about it.
            if direction_text and any(same_metric(n, p) for n, _ in metrics_named(evidence) for p in printed):
                continue
            found.append(_finding("metric", evidence, name, f"the evaluation prints {_printed_names(printed)}",
                                  file))
            continue
        values = printed or (recorded[0] if recorded else {})
        value = next((v for k, v in values.items() if same_metric(name, k)), None)
        if value is not None and 0 <= value <= 1 and _PERCENTAGE.search(evidence) and _SCORING.search(evidence):
            found.append(_finding("metric", evidence, f"{name} as a percentage",
                                  f"the evaluation gives {match or name} as a fraction ({value:g})", file))
            continue
        stated = direction_in(direction_text) if direction_text else None
        if stated is not None and higher_is_better is not None and (match or metric) \
                and same_metric(name, match or metric or "") and stated != higher_is_better \
                and len({c for c, _ in metrics_named(evidence)}) <= 1:
            found.append(_finding("direction", evidence, "higher is better" if stated else "lower is better",
                                  f"{match or metric} is ranked {'higher' if higher_is_better else 'lower'} "
                                  "is better", file))
    if metric and higher_is_better is not None and (natural := natural_direction(metric)) is not None \
            and natural != higher_is_better:
        found.append(_finding("direction", f"the task's declared metric: {metric}",
                              "higher is better" if higher_is_better else "lower is better",
                              f"{metric} is {'higher' if natural else 'lower'} is better", file))
    return found


# -- the submission format --------------------------------------------------------------------------------


def submission_statement(description: str, workspace_files: set[str]) -> dict[str, Any]:
    """What the text says a CSV submission looks like: file names, columns, id base (0 or 1), the evidence."""
    text = rendered(description)
    out: dict[str, Any] = {"files": {}, "columns": None, "id_base": None, "evidence": {}}
    for sentence in sentences(text):
        about = re.search(r"submi|predict|write|writes|save|output", sentence, re.I)
        for name in _CSV_NAME.findall(sentence):
            if about and name not in workspace_files and not name.startswith(("train", "test", "val", "sample")):
                out["files"].setdefault(name, sentence)
        if re.search(r"submission|first row", sentence, re.I):
            if out["columns"] is None and (m := _COLUMNS.search(sentence)):
                out["columns"] = _column_list(m.group(1))
                out["evidence"]["columns"] = sentence
            elif out["columns"] is None:
                for obj in _JSON_OBJECT.findall(sentence):
                    try:
                        row = json.loads(obj)
                    except json.JSONDecodeError:
                        continue
                    if isinstance(row, dict) and "id" in {k.lower() for k in row}:
                        out["columns"], out["evidence"]["columns"] = list(row), sentence
                        break
        for base, pattern in ((0, _ZERO), (1, _ONE)):
            if out["id_base"] is None and pattern.search(sentence) and re.search(r"\bids?\b|row", sentence, re.I):
                out["id_base"], out["evidence"]["id_base"] = base, sentence
    return out


def _column_list(text: str) -> list[str]:
    """The names of "id, species" or "id and cluster, one row per point": a list ends at the item after "and"."""
    names, parts = [], re.split(r"(,\s*(?:and\s+)?|\s+and\s+)", text)
    for i in range(0, len(parts), 2):
        names.append(parts[i].strip("` "))
        if i + 1 < len(parts) and "and" in parts[i + 1]:
            names.append(parts[i + 2].strip("` "))
            break
    return names


def read_artefact(path: Path) -> tuple[list[str], list[list[str]]] | None:
    """(header, rows) of a CSV artefact, None when it is absent or unreadable."""
    try:
        rows = list(csv.reader(io.StringIO(path.read_text(errors="replace"))))
    except OSError:
        return None
    return (rows[0], rows[1:]) if rows else None


def check_submission_format(statement: dict[str, Any], artefact: str, header: list[str] | None,
                            rows: list[list[str]], file: str) -> list[CoherenceFinding]:
    """The text's file name, columns and id base against the baseline's artefact, which the evaluation accepted."""
    found = []
    for name, sentence in statement["files"].items():
        if name != artefact:
            found.append(_finding("file_name", sentence, name, f"the evaluation reads {artefact}", file))
    if header is not None and statement["columns"] is not None and statement["columns"] != header:
        found.append(_finding("columns", statement["evidence"]["columns"], ", ".join(statement["columns"]),
                              f"the evaluation accepts the columns {', '.join(header)} (the baseline's {artefact})",
                              file))
    if header is not None and statement["id_base"] is not None and "id" in header and rows:
        try:
            low = min(int(float(r[header.index("id")])) for r in rows if len(r) == len(header))
        except ValueError:
            low = None
        if low in (0, 1) and low != statement["id_base"]:
            found.append(_finding("id_base", statement["evidence"]["id_base"], f"{statement['id_base']}-based ids",
                                  f"the evaluation accepts {low}-based ids (the baseline's {artefact})", file))
    return found


_MODULE = re.compile(r"`?\b([A-Za-z_]\w*\.py)\b`?")
_FUNCTION = re.compile(r"`([A-Za-z_]\w*)\(|\bdefining ([A-Za-z_]\w*)\(|`([A-Za-z_]\w*)`\s+function")


def check_python_submission(description: str, workspace: Path, evaluator: str, file: str) -> list[CoherenceFinding]:
    """A Python submission's module and function as the text names them: the module must be a file of the installed
    workspace and the function be named in that module or in the evaluation script (`evaluator`, its source)."""
    found: list[CoherenceFinding] = []
    text = rendered(description)
    for sentence in sentences(text):
        if not re.search(r"submi|modify|implement|defin|edit|strategy|heuristic|function", sentence, re.I):
            continue
        modules = [m for m in _MODULE.findall(sentence) if m not in ("evaluate.py", "baseline.py")]
        for module in dict.fromkeys(modules):
            if workspace.is_dir() and not (workspace / module).is_file():
                found.append(_finding("file_name", sentence, module, "the workspace has no such file (it has "
                                      f"{', '.join(sorted(p.name for p in workspace.glob('*.py')))})", file))
        for groups in _FUNCTION.findall(sentence):
            name = next(g for g in groups if g)
            sources = [evaluator] + [p.read_text(errors="replace") for p in workspace.glob("*.py")
                                     if p.name != "evaluate.py"] if workspace.is_dir() else [evaluator]
            if evaluator and not any(re.search(rf"\b{re.escape(name)}\b", src) for src in sources):
                found.append(_finding("submission", sentence, f"a function {name}()", "neither the evaluation nor "
                                      "the starter code names it", file))
    return found


def submission_from_text(statement: dict[str, Any], header: list[str], rows: list[list[str]]) -> str | None:
    """The baseline's predictions rewritten as the text says: its columns in its order, its id base. None when
    the text says nothing about either."""
    columns, base = statement["columns"], statement["id_base"]
    if columns is None and base is None:
        return None
    columns = columns or header
    values = {name.lower(): i for i, name in enumerate(header)}
    # A column the text names but the artefact lacks gets the artefact's prediction column's values.
    fallback = next((i for i, n in enumerate(header) if n.lower() != "id"), 0)
    low = None
    if "id" in values:
        try:
            low = min(int(float(r[values["id"]])) for r in rows)
        except ValueError:
            low = None
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for r in rows:
        row = []
        for name in columns:
            value = r[values.get(name.lower(), fallback)]
            if name.lower() == "id" and base is not None and low is not None:
                value = str(int(float(value)) - low + base)
            row.append(value)
        writer.writerow(row)
    return out.getvalue()


# -- the data ---------------------------------------------------------------------------------------------


def installed_data(workspace: Path) -> dict[str, Any] | None:
    """Splits and each split's columns of the workspace's `data/` (a `datasets` save_to_disk), from its JSON
    metadata only (no task code or data is loaded here); None for other layouts."""
    root = workspace / "data"
    try:
        splits = json.loads((root / "dataset_dict.json").read_text())["splits"]
        columns = {s: list(json.loads((root / s / "dataset_info.json").read_text()).get("features") or {})
                   for s in splits}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return {"splits": list(splits), "columns": columns}


def check_data(description: str, datasets: list[Any], data: dict[str, Any] | None, answer_columns: set[str],
               dataset_id: str | None, file: str) -> list[CoherenceFinding]:
    """Dataset ids, splits and the target column the text names against the configs and the installed data."""
    text = rendered(description)
    found = []
    known = {str(d.data_path).strip("/") for d in datasets} | {d.name for d in datasets}
    known |= {m for d in datasets for m in re.findall(r"[A-Za-z0-9][\w.-]*/[\w.-]+", str(d.description or ""))}
    if dataset_id:
        known.add(dataset_id)
    for sentence in sentences(text):
        for named in _DATASET_ID.findall(sentence):
            if "." in named.rsplit("/", 1)[-1] or named.startswith(("data/", "./")):
                continue  # a file path, not a dataset id
            if datasets and named not in known and named.rstrip("/") not in known:
                found.append(_finding("dataset", sentence, named,
                                      f"the task installs {', '.join(sorted(str(d.data_path) for d in datasets))}",
                                      file))
        if data is None:
            continue
        names = [s for m in _SPLIT.finditer(sentence) for s in re.findall(r"`(\w+)`", m.group(1))]
        names += _SPLIT_NAMED.findall(sentence)
        for split in dict.fromkeys(names):
            if split not in data["splits"]:
                found.append(_finding("split", sentence, split,
                                      f"the installed data has the splits {', '.join(data['splits'])}", file))
    if data is not None:
        columns = {c for cols in data["columns"].values() for c in cols} | answer_columns
        for pattern in _TARGET:
            for m in pattern.finditer(text):
                target = m.group(1).strip()
                if target not in columns:
                    line = next((s for s in sentences(text) if target in s), m.group(0))
                    found.append(_finding("target", line, target, "the installed data has no such column (it has "
                                          f"{', '.join(sorted(columns))})", file))
    return found


# -- the whole check --------------------------------------------------------------------------------------

Judge = Callable[[dict[str, Any]], tuple[str, list[CoherenceFinding]]]


def check_coherence(env: Any, printed: dict[str, float], *, metric: str | None, higher_is_better: bool | None,
                    dataset_id: str | None = None, judge: Judge | None = None,
                    score_submission: bool = True) -> CoherenceReport:
    """The coherence of the installed task `env` (a `TaskEnvironment` whose workspace holds the baseline's
    artefact, scored as `printed`): the rules, then a submission written from the text and scored, then (when
    the rules found nothing and `judge` is given) the teacher's reading of the prose."""
    started = time.monotonic()
    task = env.task
    try:
        file = str(Path(env.task_yaml).resolve().relative_to(Path(env.root).resolve()))
    except (ValueError, TypeError, AttributeError):
        file = f"configs/tasks/{task.id}.yaml"
    evaluator = next(iter(task.evaluation_paths), file)
    description = task.description or ""
    report = CoherenceReport(printed=dict(printed))
    findings: list[CoherenceFinding] = []
    findings += check_placeholders(description, file)
    report.checked.append("placeholder")
    if printed or task.baseline_scores:
        findings += check_metric(description, printed, list(task.baseline_scores or []), metric, higher_is_better,
                                 file, evaluator)
        report.checked += ["metric", "direction"]
    header = rows = None
    if task.task_entrypoint == "CSVSubmissionTasks":
        artefact = "submission.csv"
        files = {p.name for p in env.workspace.rglob("*.csv")} if env.workspace.is_dir() else set()
        read = read_artefact(env.workspace / artefact)
        if read is not None:
            header, rows = read
        statement = submission_statement(description, files - {artefact})
        findings += check_submission_format(statement, artefact, header, rows or [], file)
        report.checked.append("submission_format")
        if score_submission and header is not None and rows:
            written = submission_from_text(statement, header, rows)
            if written is not None:
                report.checked.append("submission_scored")
                outcome = _score_written(env, artefact, written)
                report.submission = {"file": artefact, "header": written.splitlines()[0],
                                     "first_row": (written.splitlines()[1:2] or [""])[0], **outcome}
                if "rejected" in outcome and not any(f.kind in ("columns", "id_base", "file_name") for f in findings):
                    findings.append(_finding("submission", report.submission["header"], "a submission written as "
                                             "the text says", f"the evaluation refused it: {outcome['rejected']}",
                                             evaluator, by="submission"))
    elif task.task_entrypoint == "PythonSubmissionTasks":
        script = env.workspace / evaluator
        source = script.read_text(errors="replace") if script.is_file() else ""
        findings += check_python_submission(description, env.workspace, source, file)
        report.checked.append("submission_format")
    data = installed_data(env.workspace) if env.workspace.is_dir() else None
    answers = {c for cols in (env.hidden_columns or {}).values() for c in cols}
    findings += check_data(description, list(env.datasets or []), data, answers, dataset_id, file)
    report.checked.append("data")
    if judge is not None and not findings:
        report.checked.append("teacher")
        context = {"description": rendered(description), "printed": printed, "metric": metric,
                   "higher_is_better": higher_is_better, "header": header, "file": file}
        try:
            report.teacher, judged = judge(context)
            findings += judged
        except Exception as err:  # noqa: BLE001 - the verdict is advisory: a failed ask is recorded, not fatal
            report.teacher = f"failed: {type(err).__name__}: {err}"[:300]
    report.findings, report.coherent = findings, not findings
    report.seconds = round(time.monotonic() - started, 3)
    return report


def _score_written(env: Any, artefact: str, written: str) -> dict[str, Any]:
    """The evaluation of `written` as the workspace's artefact; the baseline's artefact is put back after."""
    path = env.workspace / artefact
    saved = path.read_bytes()
    try:
        path.write_text(written)
        metrics, _ = env.evaluate()
        return {"metrics": metrics}
    except (SubmissionNotFound, EvaluationFormatError) as err:
        detail = getattr(err, "detail", "") or ""
        return {"rejected": (str(err) + (f": {detail.strip().splitlines()[-1]}" if detail.strip() else ""))[:300]}
    finally:
        path.write_bytes(saved)


# -- the teacher's reading --------------------------------------------------------------------------------

VERDICT_SHAPE = ('{"coherent": true|false, "contradictions": [{"kind": "metric|direction|format|data", '
                 '"sentence": "...", "states": "...", "actual": "..."}]}')
_KINDS = {"metric": "metric", "direction": "direction", "format": "columns", "data": "dataset"}


def teacher_messages(context: dict[str, Any]) -> list[dict[str, str]]:
    """The conversation that asks the teacher for a verdict on a task's prose (`check_coherence.j2`)."""
    return [{"role": "system", "content": render("system_teacher")},
            {"role": "user", "content": render("check_coherence", description=context["description"],
                                               facts=json.dumps({k: context[k] for k in (
                                                   "printed", "metric", "higher_is_better", "header")}, indent=2),
                                               shape=VERDICT_SHAPE)}]


def parse_verdict(value: Any, file: str) -> tuple[str, list[CoherenceFinding]]:
    """("coherent" | "incoherent", findings) of the teacher's JSON verdict; ValueError when it has not the shape."""
    if not isinstance(value, dict) or not isinstance(value.get("coherent"), bool):
        raise ValueError(f"the verdict must be an object shaped {VERDICT_SHAPE}")
    items = value.get("contradictions") or []
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise ValueError("`contradictions` must be a list of objects")
    findings = [_finding(_KINDS.get(str(i.get("kind")), "metric"), str(i.get("sentence", "")),
                         str(i.get("states", "")), str(i.get("actual", "")), file, by="teacher") for i in items]
    if value["coherent"] and findings:
        raise ValueError("a coherent verdict lists no contradictions")
    if not value["coherent"] and not findings:
        raise ValueError("an incoherent verdict names its contradictions")
    return ("coherent" if value["coherent"] else "incoherent"), findings


def teacher_judge(client: Any, seed: int, max_nudges: int = 1) -> Judge:
    """A `Judge` that asks `client` (an `LLMClient`) for the verdict, nudging once on a malformed reply."""
    def judge(context: dict[str, Any]) -> tuple[str, list[CoherenceFinding]]:
        value, _ = ask_for_json(lambda m: client.chat(m, seed=seed), teacher_messages(context), dict,
                                shape=VERDICT_SHAPE, max_nudges=max_nudges,
                                validate=lambda v: parse_verdict(v, context["file"]))
        return value

    return judge
