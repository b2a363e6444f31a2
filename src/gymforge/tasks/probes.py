"""Evaluator probes: knowledge-free degenerate submissions that an honest evaluator must not score above
the baseline.

A probe is derived only from what any agent has: the task's entrypoint, its files (a sample submission,
the starter code) and the baseline's artefact. It never reads the answers and never trains anything. Each
probe is written into the task's workspace in place of the artefact and evaluated exactly as an agent's
submission is (`TaskEnvironment.evaluate`: same sandboxes, same evaluation contract); the artefact is put
back afterwards. A probe the evaluation accepts with a score strictly better than the baseline's shows a
gameable evaluator: the score could be had without solving the task.

The battery, per entrypoint:
- CSV: constant predictions (each class; the mean and median of the baseline's numeric predictions), one
  id on every row, duplicated, missing, extra, shuffled and unknown ids, header only, NaN / inf / huge /
  string predictions (everywhere and in either half of the rows), probability columns all 1 and all 0,
  columns in reverse order. Halves come in complementary pairs: an evaluator that scores only the rows it
  kept scores one of the two halves at least as well as the whole.
- Python: every public function of the submission module is wrapped; the wrapper calls the baseline's
  function (in the submission's sandbox, so it learns the return shape at run time) and returns a
  degenerate value of the same shape: empty, zeros, ones, the first element repeated, every index of the
  input, the input echoed, numbers made huge or hugely negative, None.
- Model: the pickled model is wrapped the same way; its `predict` returns a constant, the wrong shape, an
  empty array or NaN.
- Post-training (a `final_model/` folder, `gymforge.tasks.posttraining`): the base's weights with the final norm
  zeroed (every reply the same token, empty once decoded) and re-initialised at each tensor's scale (a foreign
  checkpoint, which admission must refuse).

A probe set is evidence, not a proof: an evaluator can be wrong in ways no knowledge-free submission
reveals, and exploits that need knowledge of the task (its answers, its instances) are out of scope.
"""

from __future__ import annotations

import ast
import io
import json
import math
import os
import random
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pandas as pd
import yaml

from gymforge.agent.errors import EvaluationFormatError, SubmissionNotFound
from gymforge.core.records import CheckReport, ProbeOutcome
from gymforge.sandbox import beneath
from gymforge.tasks import posttraining, probekit
from gymforge.tasks.environment import TaskEnvironment
from gymforge.tasks.probekit import python_probe

ORIGINAL_MODULE = "_gymforge_original"
PROBE_MODULE = "_gymforge_probe"
PROBE_PICKLE = "_gymforge_probe.pkl"
_EXCERPT = 600
_MAX_ARTEFACT = 64 << 20
NOT_APPLICABLE_EXIT = 97  # a Python probe's wrapper exits with it where its transform does not apply
MAX_CLASSES = 6  # constant-class probes for at most this many of the commonest labels


@dataclass(frozen=True)
class Probe:
    """One degenerate submission: the files it writes into the workspace (relative path -> bytes)."""

    name: str
    kind: str
    description: str
    files: dict[str, bytes]
    shown: str  # the file the report quotes as "the submission it wrote"


def better(score: float, baseline: float, higher_is_better: bool) -> bool:
    """Strictly better than the baseline, beyond float noise (1e-9 of the baseline's magnitude)."""
    margin = 1e-9 * max(1.0, abs(baseline))
    return score > baseline + margin if higher_is_better else score < baseline - margin


class CheckError(RuntimeError):
    """The task could not be checked: its baseline failed, or nothing gives a baseline score."""


# -- CSV ---------------------------------------------------------------------------------------------

_ID_NAME = re.compile(r"(^|_)id$|Id$|ID$", re.I)


def _id_column(frame: pd.DataFrame) -> str | None:
    """The submission's key: a column named like an id whose values are unique, else a unique first column."""
    unique = [c for c in frame.columns if frame[c].is_unique and frame[c].ne("").all()]
    named = [c for c in unique if _ID_NAME.search(str(c))]
    if named:
        return named[0]
    return frame.columns[0] if len(frame.columns) > 1 and frame.columns[0] in unique else None


def _numeric(values: pd.Series) -> pd.Series | None:
    parsed = pd.to_numeric(values, errors="coerce")
    return parsed if parsed.notna().all() and len(parsed) else None


def _labels(values: pd.Series) -> list[str]:
    """The commonest labels of a prediction column, most common first (ties by label), as written."""
    counts = values.value_counts()
    return sorted(counts.index, key=lambda v: (-counts[v], str(v)))[:MAX_CLASSES]


def _is_label_column(values: pd.Series) -> bool:
    """Class labels: text, or whole numbers with few distinct values."""
    parsed = _numeric(values)
    if parsed is None:
        return True
    return bool((parsed == parsed.round()).all()) and parsed.nunique() <= 20


def _csv(frame: pd.DataFrame) -> bytes:
    return frame.to_csv(index=False).encode()


def _number_text(value: float) -> str:
    return repr(int(value)) if float(value).is_integer() and abs(value) < 1e15 else repr(float(value))


# long: the CSV battery, one probe family after another over one frame, rng and `add`
def csv_probes(template: bytes, seed: int, artefact: str = "submission.csv", *, sample: bool = False) -> list[Probe]:
    """The CSV battery, built from `template`: the baseline's submission, or with `sample` the task's sample
    submission, whose predictions are replaced by a constant first (a sample may hold the answers)."""
    frame = pd.read_csv(io.BytesIO(template), dtype=str, keep_default_na=False)
    if frame.empty or len(frame.columns) == 0:
        return []
    rng = random.Random(seed)
    key = _id_column(frame)
    predicted = [c for c in frame.columns if c != key]
    if not predicted:
        return []
    labels = {c: _labels(frame[c]) for c in predicted if _is_label_column(frame[c])}
    if sample:
        for column in predicted:
            parsed = _numeric(frame[column])
            frame[column] = (_labels(frame[column])[0] if _is_label_column(frame[column])
                             else _number_text(parsed.median()) if parsed is not None else frame[column].iloc[0])
    n = len(frame)
    probes: list[Probe] = []

    def add(name: str, description: str, table: pd.DataFrame | bytes) -> None:
        data = table if isinstance(table, bytes) else _csv(table)
        probes.append(Probe(name, "csv", description, {artefact: data}, artefact))

    def with_predictions(values: dict[str, str], base: pd.DataFrame | None = None) -> pd.DataFrame:
        out = (frame if base is None else base).copy()
        for column, value in values.items():
            out[column] = value
        return out

    numeric = {c: parsed for c in predicted if c not in labels and (parsed := _numeric(frame[c])) is not None}
    probabilities = [c for c, v in numeric.items() if v.between(0, 1).all()] if len(predicted) > 1 else []
    constants: list[tuple[str, dict[str, str]]] = []
    if labels:
        first = next(iter(labels))
        constants += [(f"class_{label}", {first: label}) for label in labels[first]]
    if numeric:
        constants.append(("mean", {c: _number_text(v.mean()) for c, v in numeric.items()}))
        constants.append(("median", {c: _number_text(v.median()) for c, v in numeric.items()}))
    for tag, values in constants:
        add(f"constant_{tag}", f"every row predicts the same value ({values})", with_predictions(values))
    if key is not None:
        ids = frame[key]
        for tag, values in constants or [("baseline", {})]:
            repeated = with_predictions({key: ids.iloc[0], **values})
            add(f"repeat_id_{tag}", f"one id ({ids.iloc[0]}) on every row, predictions {values or 'as the baseline'}",
                repeated)
        halves = {"a": frame.iloc[0::2], "b": frame.iloc[1::2]}
        unknown = _unknown_ids(ids, n)
        for half, part in halves.items():
            filler = part.sample(n=n - len(part), replace=True, random_state=rng.randrange(2**31))
            add(f"duplicate_rows_{half}", "half of the rows kept, each id repeated to fill the row count",
                pd.concat([part, filler]).sort_index(kind="stable"))
            add(f"missing_rows_{half}", "only half of the rows, the other half missing", part)
            other = frame.drop(part.index).copy()
            other[key] = unknown[: len(other)]
            add(f"unknown_ids_{half}", "half of the ids replaced by ids the test set does not have (row count kept)",
                pd.concat([part, other]).sort_index(kind="stable"))
        add("duplicate_rows_appended", "every row twice", pd.concat([frame, frame]))
        extra = frame.copy()
        extra[key] = unknown
        add("extra_rows", "every row, then as many rows again with unknown ids", pd.concat([frame, extra]))
        shuffled = frame.copy()
        shuffled[key] = rng.sample(list(ids), n)
        add("shuffled_ids", "the ids shuffled against the predictions", shuffled)
        all_unknown = frame.copy()
        all_unknown[key] = unknown
        add("unknown_ids_all", "every id replaced by one the test set does not have", all_unknown)
    add("header_only", "the header and no rows", _csv(frame.iloc[0:0]))
    for tag, value in (("nan", ""), ("inf", "inf"), ("huge", "1e300"), ("string", "not_a_prediction")):
        everything = with_predictions(dict.fromkeys(predicted, value))
        add(f"{tag}_all", f"every prediction is {value!r}", everything)
        for half, rows in (("a", slice(0, None, 2)), ("b", slice(1, None, 2))):
            spoilt = frame.copy()
            for column in predicted:
                spoilt.iloc[rows, spoilt.columns.get_loc(column)] = value
            add(f"{tag}_half_{half}", f"every other prediction is {value!r}, the rest as the baseline's", spoilt)
    for tag, value in (("1", "1"), ("0", "0")):
        if probabilities:
            add(f"probabilities_all_{tag}", f"every probability column is {value}",
                with_predictions(dict.fromkeys(probabilities, value)))
    if len(frame.columns) > 1:
        add("reordered_columns", "the columns in reverse order", frame[list(reversed(frame.columns))])
    return probes


def _unknown_ids(ids: pd.Series, n: int) -> list[str]:
    parsed = pd.to_numeric(ids, errors="coerce")
    if parsed.notna().all():
        start = int(parsed.max()) + 1_000_001
        return [str(start + i) for i in range(n)]
    return [f"gymforge_unknown_{i}" for i in range(n)]


# -- Python ------------------------------------------------------------------------------------------

PYTHON_TRANSFORMS: dict[str, str] = {
    "empty": "an empty value of the baseline's type (None for a number)",
    "zeros": "the baseline's answer with every number set to 0",
    "ones": "the baseline's answer with every number set to 1",
    "first_repeated": "the baseline's first element repeated in every position",
    "all_indices": "every index of the input (select everything; all items in one group)",
    "echo": "the function's first argument returned as it came",
    "huge": "the baseline's answer with every number set to 10**12",
    "negative_huge": "the baseline's answer with every number set to -10**12",
    "none": "None",
}

def public_functions(source: str) -> list[str]:
    """The module's top-level public functions, read from its syntax (never run on the host)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    return [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and not n.name.startswith("_")]


def python_probes(module: str, source: bytes) -> list[Probe]:
    """The Python battery for the submission module at workspace path `module` with the baseline `source`."""
    functions = public_functions(source.decode(errors="replace"))
    if not functions:
        return []
    folder = PurePosixPath(module).parent
    original = str(folder / f"{ORIGINAL_MODULE}.py") if str(folder) != "." else f"{ORIGINAL_MODULE}.py"
    params = str(folder / python_probe.GYMFORGE_PROBE_PARAMS)
    wrapper = probekit.program("python_probe.py")
    probes = []
    for transform, description in PYTHON_TRANSFORMS.items():
        description = f"{', '.join(functions)} return {description}"  # names and our words: no quotes to escape
        settings = {"original": ORIGINAL_MODULE, "functions": functions, "transform": transform,
                    "not_applicable": NOT_APPLICABLE_EXIT}
        # A first line that says what this probe does: the report and the repair prompt quote the file's beginning.
        named = f'"""gymforge evaluator probe: {description}."""\n'.encode() + wrapper
        probes.append(Probe(transform, "python", description,
                            {module: named, original: source, params: json.dumps(settings).encode()}, module))
    return probes


# -- model -------------------------------------------------------------------------------------------

MODEL_TRANSFORMS: dict[str, str] = {
    "constant_first": "predict returns its first prediction for every row",
    "zeros": "predict returns 0 for every row",
    "mean": "predict returns the mean of its predictions for every row",
    "short": "predict returns one prediction fewer than there are rows",
    "first_half": "predict returns predictions for the first half of the rows only",
    "two_columns": "predict returns every prediction twice, as two columns",
    "empty": "predict returns an empty array",
    "nan": "predict returns NaN for every row",
}

def _pickle_call(module: str, function: str, *args: str) -> bytes:
    """A protocol-0 pickle of `module.function(*args)` (string arguments), written without importing it."""
    def text(s: str) -> bytes:
        return b"V" + s.encode("raw_unicode_escape") + b"\n"
    return b"c" + module.encode() + b"\n" + function.encode() + b"\n(" + b"".join(map(text, args)) + b"tR."


def model_probes(config_rel: str, config_text: bytes) -> list[Probe]:
    """The model battery for the config at `config_rel`: its numeric fields set to 0 and to extremes (a config
    may be the whole model, as a kernel's bandwidth), and, where its `model_path` names a pickle, that model
    wrapped so that its predictions become degenerate."""
    try:
        config = yaml.safe_load(config_text)
    except yaml.YAMLError:
        return []
    if not isinstance(config, dict):
        return []
    probes = []
    for tag, new in (("zeros", 0), ("huge", 10**12), ("negative_huge", -10**12)):
        changed = python_probe.set_numbers(config, new)
        if changed != config:
            probes.append(Probe(f"config_{tag}", "model", f"every number in {config_rel} set to {new}",
                                {config_rel: yaml.safe_dump(changed, sort_keys=False).encode()}, config_rel))
    if not isinstance(config.get("model_path"), str):
        return probes
    inner = config["model_path"]
    folder = PurePosixPath(config_rel).parent
    # The module at the workspace's top (the evaluation imports from its working directory); the pickle there
    # and, for an evaluator that resolves paths from the config's folder, beside the config too.
    candidates = dict.fromkeys([inner, str(folder / inner)])
    pickles = dict.fromkeys([PROBE_PICKLE, str(folder / PROBE_PICKLE)])
    for transform, description in MODEL_TRANSFORMS.items():
        probe_config = yaml.safe_dump({**config, "model_path": PROBE_PICKLE}, sort_keys=False).encode()
        pickled = _pickle_call(PROBE_MODULE, "make", transform, *candidates)
        files = {config_rel: probe_config, f"{PROBE_MODULE}.py": probekit.program("model_probe.py"),
                 **dict.fromkeys(pickles, pickled)}
        probes.append(Probe(transform, "model", description, files, f"{PROBE_MODULE}.py"))
    return probes


# -- running -----------------------------------------------------------------------------------------

# -- post-training ----------------------------------------------------------------------------------------------


def posttraining_probes(base: Path, seed: int) -> list[Probe]:
    """Models built from the base's weights alone (a single `model.safetensors`): the final norm zeroed, so every
    logit is 0 and every reply the same token (empty once decoded), and a re-initialised model of the same shapes
    (a foreign checkpoint, which admission must refuse)."""
    import torch
    from safetensors.torch import load_file, save

    if not (base / "model.safetensors").is_file():
        return []
    weights = load_file(str(base / "model.safetensors"))
    rel = f"{posttraining.ARTEFACT}/model.safetensors"
    norms = [n for n in weights if n.endswith("norm.weight") and ".layers." not in n]
    probes = []
    if norms:
        flat = {**weights, norms[-1]: torch.zeros_like(weights[norms[-1]])}
        probes.append(Probe("empty_generation", "posttraining",
                            f"the base with {norms[-1]} zeroed: every logit 0, the same token each step", {rel: save(flat)},
                            rel))
    generator = torch.Generator().manual_seed(seed)
    foreign = {n: (torch.randn(t.shape, generator=generator) * float(t.float().std().nan_to_num(0.02))).to(t.dtype)
               for n, t in weights.items()}
    probes.append(Probe("foreign_checkpoint", "posttraining",
                        "weights of the base's shapes, re-initialised (not fine-tuned from the base)", {rel: save(foreign)},
                        rel))
    return probes


def submission_modules(env: TaskEnvironment) -> list[str]:
    """The Python files of a PythonSubmissionTasks task that the agent writes (workspace paths).

    The baseline script when the task has one (other than the evaluation); else the starter `.py` files other than the evaluation that
    the description names (MLGym's games name `strategy.py`, not the opponent's `target.py`), or all of them
    when it names none."""
    evaluation = set(env.task.evaluation_paths)
    if env.task.baseline_paths and env.task.baseline_paths[0] not in evaluation:
        return [env.task.baseline_paths[0]]  # (MLGym's games name their evaluation as the baseline)
    layout = env.installation.layout()
    candidates = [d for d in layout if d.endswith(".py") and d not in evaluation
                  and not PurePosixPath(d).name.startswith("_")]
    named = [c for c in candidates if re.search(rf"(?<![\w/]){re.escape(PurePosixPath(c).name)}\b",
                                                env.task.description)]
    return named or candidates


class _Workspace:
    """Writes a probe's files into the workspace and puts back what was there (never through a link)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def read(self, rel: str, limit: int = _MAX_ARTEFACT) -> bytes | None:
        try:
            return beneath.read_bytes(self.root, rel, limit)
        except OSError:
            return None

    def _unlink(self, rel: str) -> None:
        with beneath.parent_of(self.root, rel) as (dfd, name):
            try:
                os.unlink(name, dir_fd=dfd)
            except FileNotFoundError:
                pass

    def _put(self, rel: str, data: bytes | None) -> None:
        self._unlink(rel)
        if data is not None:
            beneath.write_bytes(self.root, rel, data, create=True)

    def apply(self, files: dict[str, bytes]) -> dict[str, bytes | None]:
        # A probe's weights replace the baseline's of about the same size (post-training models: hundreds of MB).
        saved = {rel: self.read(rel, max(_MAX_ARTEFACT, 2 * len(data))) for rel, data in files.items()}
        for rel, data in files.items():
            self._put(rel, data)
        return saved

    def restore(self, saved: dict[str, bytes | None]) -> None:
        for rel, data in saved.items():
            self._put(rel, data)


def _excerpt(data: bytes) -> str:
    text = data.decode(errors="replace")
    return text if len(text) <= _EXCERPT else text[:_EXCERPT] + f"\n[... {len(text) - _EXCERPT} more characters]"


def _metric_value(metrics: dict[str, float], metric: str) -> float | None:
    """The priority metric, matched without regard to case; a single metric stands for it."""
    for name, value in metrics.items():
        if name.lower() == metric.lower():
            return value
    return next(iter(metrics.values())) if len(metrics) == 1 else None


def build_probes(env: TaskEnvironment, *, seed: int, sample: bytes | None = None) -> list[Probe]:
    """The probes for `env`'s task, from the artefact the baseline left in its workspace (or `sample`)."""
    ws = _Workspace(env.workspace)
    entrypoint = env.task.task_entrypoint
    if env.post_training is not None:
        return posttraining_probes(env.post_training.base_dir, seed)
    if entrypoint == "CSVSubmissionTasks":
        template = ws.read("submission.csv")
        if template is not None:
            return csv_probes(template, seed)
        return csv_probes(sample, seed, sample=True) if sample else []
    if entrypoint == "PythonSubmissionTasks":
        return [p for module in submission_modules(env) if (source := ws.read(module)) is not None
                for p in python_probes(module, source)]
    if entrypoint == "ModelSubmissionTasks":
        try:
            config = env.scoring.artefact()
        except SubmissionNotFound:
            return []
        text = ws.read(config) if config else None
        return model_probes(config, text) if text is not None else []
    return []


def run_probes(env: TaskEnvironment, probes: Iterable[Probe], *, baseline: float, metric: str,
               higher_is_better: bool, stop_at_first: bool = False) -> list[ProbeOutcome]:
    """Evaluate each probe in `env`'s workspace, as a submission; the workspace is put back after each.
    A task's probes share one scorer sandbox where the task and the backend allow (`Scoring.evaluate_each`: the same
    outcomes, without a fresh scorer per probe). `stop_at_first`: stop at the first gameable probe (one
    suffices to send a draft back for repair)."""
    probes = list(probes)
    ws = _Workspace(env.workspace)
    batched: list[dict[str, float] | Exception | None] = [None] * len(probes)
    if probes and env.scoring.batches():
        started = time.monotonic()
        batched = env.scoring.evaluate_each([p.files for p in probes])
        each_s = (time.monotonic() - started) / len(probes)
        for i, run in enumerate(env.scoring.each_submission_runs):
            if isinstance(batched[i], Exception) and run is not None and run.exit_code == NOT_APPLICABLE_EXIT:
                batched[i] = _NotApplicable()
    outcomes = []
    for probe, scored in zip(probes, batched, strict=True):
        outcome = ProbeOutcome(name=probe.name, kind=probe.kind, description=probe.description,
                               submission_file=probe.shown, submission=_excerpt(probe.files[probe.shown]))
        if scored is None:
            started = time.monotonic()
            saved = ws.apply(probe.files)
            try:
                scored = _evaluate(env)
            finally:
                ws.restore(saved)
            outcome.seconds = round(time.monotonic() - started, 3)
        else:
            outcome.seconds = round(each_s, 3)
        if isinstance(scored, _NotApplicable):
            outcome.applicable = False
            outcome.rejected = "not applicable: the baseline's answer has no such degenerate form"
        elif isinstance(scored, Exception):
            outcome.rejected = str(scored).splitlines()[0][:300]
        else:
            outcome.metrics = scored
            outcome.score = _metric_value(scored, metric)
            if outcome.score is None:
                outcome.rejected = f"the evaluation printed no {metric!r}"
            elif not math.isfinite(outcome.score):
                outcome.rejected = f"{metric} is not finite"
            else:
                outcome.gameable = better(outcome.score, baseline, higher_is_better)
        outcomes.append(outcome)
        if stop_at_first and outcome.gameable:
            break
    return outcomes


class _NotApplicable(Exception):
    """A Python probe's wrapper found that its transform does not apply to the baseline's answer."""


def _evaluate(env: TaskEnvironment) -> dict[str, float] | Exception:
    """The metrics of the workspace's artefact, or why it was rejected."""
    try:
        return env.evaluate()[0]
    except (EvaluationFormatError, SubmissionNotFound) as err:
        runs = (env.last_evaluation, env.last_submission_run)
        if any(r is not None and r.exit_code == NOT_APPLICABLE_EXIT for r in runs):
            return _NotApplicable()
        return err


def check_report(task_id: str, entrypoint: str, metric: str, higher_is_better: bool, baseline: float,
                 baseline_source: str, outcomes: list[ProbeOutcome], seconds: float) -> CheckReport:
    return CheckReport(task_id=task_id, entrypoint=entrypoint, metric=metric, higher_is_better=higher_is_better,
                       baseline=baseline, baseline_source=baseline_source, probes=outcomes,
                       gameable=any(o.gameable for o in outcomes), seconds=round(seconds, 3))


def _recorded(env: TaskEnvironment) -> dict[str, float] | None:
    return dict(env.task.baseline_scores[0]) if env.task.baseline_scores else None


def measure_baseline(env: TaskEnvironment) -> tuple[dict[str, float], str]:
    """(metrics, "measured" | "recorded"): the baseline run and scored, the installed starter scored, or
    the task's recorded baseline scores when it has neither a baseline script nor a scorable starter."""
    if env.task.baseline_paths:
        return env.run_baseline().metrics, "measured"
    try:
        return env.evaluate()[0], "measured"
    except (SubmissionNotFound, EvaluationFormatError) as err:
        recorded = _recorded(env)
        if recorded is None:
            raise CheckError(f"{env.task.id} has no baseline script, its starter files cannot be scored ({err}) "
                             "and it records no baseline_scores") from None
        return recorded, "recorded"


def probe_environment(env: TaskEnvironment, *, seed: int, metric: str, higher_is_better: bool,
                      baseline: tuple[dict[str, float], str], stop_at_first: bool = False) -> CheckReport:
    """Probe an installed task whose workspace holds the baseline's artefact; `baseline`: its metrics and
    where they come from ("measured" or "recorded"); `metric` ranks scores."""
    started = time.monotonic()
    metrics, source = baseline
    value = next((v for k, v in metrics.items() if k.lower() == metric.lower()), None)
    if value is None:
        raise CheckError(f"the baseline's scores {metrics} have no {metric!r}")
    sample = None
    if env.task.sample_submission and (env.root / env.task.sample_submission).is_file():
        sample = (env.root / env.task.sample_submission).read_bytes()
    probes = build_probes(env, seed=seed, sample=sample)
    outcomes = run_probes(env, probes, baseline=value, metric=metric, higher_is_better=higher_is_better,
                          stop_at_first=stop_at_first)
    return check_report(env.task.id, env.task.task_entrypoint, metric, higher_is_better, value, source, outcomes,
                        time.monotonic() - started)


def evidence(report: CheckReport, limit: int = 3) -> str:
    """What a task's author is told about a gameable evaluator: the probes, their submissions and scores."""
    direction = "higher" if report.higher_is_better else "lower"
    lines = [f"The evaluation is gameable: {sum(o.gameable for o in report.probes)} knowledge-free degenerate "
             f"submission(s) were accepted and scored better than the baseline ({report.metric} = "
             f"{report.baseline:g}, {direction} is better). Validate the submission (ids: no duplicates, none "
             "missing, none unknown; types; finite values; the problem's constraints) and recompute every quantity "
             "you report, so that each of these is rejected or scores no better than the baseline."]
    for o in [o for o in report.probes if o.gameable][:limit]:
        lines.append(f"- probe `{o.name}` ({o.description}) scored {report.metric} = {o.score:g}; "
                     f"its {o.submission_file} began:\n{o.submission[:300]}")
    return "\n".join(lines)
