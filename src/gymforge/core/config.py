"""The whole pipeline configuration as one Pydantic model.

Snakemake loads `config.yaml` (plus `--config` overrides) into a dict; `validate_config` turns it
into a `GymforgeConfig` before any job is scheduled, so a bad value fails with its key path. The sections' models
live in `gymforge.core.sections` (one module per part of the pipeline) and are re-exported here, the one import
path for code and users.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from collections.abc import Iterable
from typing import Any

import yaml
from pydantic import Field, ValidationError

from gymforge.core.sections.base import ConfigError, Strict
from gymforge.core.sections.evaluation import EvaluateConfig, ModelSpec, ServingConfig
from gymforge.core.sections.llm import CLIENT_FIELDS, EndpointConfig, LLMConfig, Price, RequestOptions
from gymforge.core.sections.tasks import (AgentSettings, DatasetsConfig, DecontaminationConfig, GenerationConfig,
                                          MicroConfig, PostTrainingConfig, ProposalsConfig, ReferenceSftConfig,
                                          SandboxConfig, TopicsConfig, VerificationConfig)
from gymforge.core.sections.training import (MILESTONE_PREFIX, TRAIN_SAVING, FilterConfig, LoraConfig, RewardConfig,
                                             RLConfig, SftConfig, TinyStudentConfig, TrackingConfig,
                                             TrainConfig, TrajectoriesConfig)

__all__ = [
    "AgentSettings", "BASE_KEY", "CLIENT_FIELDS", "ConfigError", "DEFAULT_CONFIG_FILE", "DatasetsConfig",
    "DecontaminationConfig", "Digest", "EndpointConfig", "EvaluateConfig", "FilterConfig", "GenerationConfig",
    "GymforgeConfig", "LLMConfig", "LoraConfig", "MILESTONE_PREFIX", "MicroConfig", "ModelSpec", "PostTrainingConfig",
    "Price", "ProposalsConfig", "READABLE_EVERYWHERE", "RLConfig", "ReferenceSftConfig", "RequestOptions",
    "RewardConfig", "SECTION_KEYS", "SandboxConfig", "ServingConfig", "SftConfig", "TRAIN_SAVING",
    "TinyStudentConfig", "TopicsConfig", "TrackingConfig", "TrainConfig", "TrajectoriesConfig",
    "VerificationConfig", "config_or_defaults", "declared_keys", "deep_merge", "layered_config", "load_config",
    "read_layers", "validate_config",
]


class GymforgeConfig(Strict):
    base: str | list[str] | None = Field(
        None, exclude=True,
        description="Config files this one is layered over (paths relative to it), e.g. `base: ../config.yaml` to "
                    "inherit the quick start's settings; without it a file stands alone over these defaults. "
                    "Resolved when the file is read (gymforge.core.config.read_layers).")
    seed: int = Field(0, description="Run seed: every teacher request's seed derives from it and the item id; "
                      "training and RL use it unless they set their own.")
    results_dir: str = Field("results", description="Where every output goes (relative to the working directory).")
    cache_dir: str = Field(".cache/gymforge", description="LLM response cache and the offline dataset hub.")
    topics: TopicsConfig = TopicsConfig()
    llm: LLMConfig = LLMConfig()
    datasets: DatasetsConfig = DatasetsConfig()
    proposals: ProposalsConfig = ProposalsConfig()
    generation: GenerationConfig = GenerationConfig()
    sandbox: SandboxConfig = SandboxConfig()
    agent: AgentSettings = AgentSettings()
    verification: VerificationConfig = VerificationConfig()
    micro: MicroConfig = MicroConfig()
    decontamination: DecontaminationConfig = DecontaminationConfig()
    trajectories: TrajectoriesConfig = TrajectoriesConfig()
    filter: FilterConfig = FilterConfig()
    sft: SftConfig = SftConfig()
    train: TrainConfig = TrainConfig()
    evaluate: EvaluateConfig = EvaluateConfig()
    rl: RLConfig = RLConfig()
    post_training: PostTrainingConfig = PostTrainingConfig()
    tracking: TrackingConfig = TrackingConfig()

    @property
    def results(self) -> Path:
        return Path(self.results_dir)

    @property
    def cache(self) -> Path:
        return Path(self.cache_dir)

    def rerun_view(self) -> dict[str, Any]:
        """The settings that change what a job produces; budget, prices, concurrency and `topics.n` do not."""
        dump = self.model_dump(mode="json")
        teacher = dump["llm"]["teacher"]
        dump["teacher"] = {k: teacher[k] for k in ("provider", "model", "temperature", "max_tokens")}
        dump["teacher"].update(self.llm.teacher.request_identity())
        if self.llm.teacher.offline_endpoint != "chat":  # its reasoning tokens count within the reply's limit
            dump["teacher"]["offline_endpoint"] = self.llm.teacher.offline_endpoint
        dump["topics"].pop("n")
        dump.pop("tracking")  # where curves are also logged changes no output
        # Where fetched datasets are kept changes no output (and must not rerun proposals when set).
        dump["datasets"].pop("cache_dir")
        # How rollouts are scheduled never changes one: a shard's rollout indices are its rule's params.
        for key in ("per_task", "shard_size", "concurrency", "gpus", "mem_mb", "runtime_min", "threads"):
            dump["trajectories"].pop(key)
        # What a job asks of its scheduler never changes its output.
        for section in ("datasets", "generation", "verification", "micro", "sft"):
            for key in ("mem_mb", "runtime_min"):
                dump[section].pop(key)
        # The student's tokenizer counts SFT lengths; other training settings must not rerun the filter.
        dump["student"] = {"student": dump["train"]["student"]}
        # The student's context decides `sft.example_unit: auto` and what the SFT statistics count as trained.
        dump["sft"]["max_length"] = dump["train"]["max_length"]
        # Nor where the base is loaded from (train.prefetch: the same model, fetched ahead or by the job).
        for key in ("gpus", "mem_mb", "runtime_min", "threads", "base_mem_mb", "base_runtime_min", "logging_steps",
                    "prefetch", *TRAIN_SAVING):
            dump["train"].pop(key)
        # An evaluation job reruns for its own model and task only; which runs it holds are its rule's params.
        for key in ("tasks", "runs_per_task", "concurrency", "models", "mem_mb", "runtime_min", "threads"):
            dump["evaluate"].pop(key)
        dump["evaluate"]["serving"].pop("gpus")
        # How the update is spread over devices does not change what it computes (a run may resume on other GPUs).
        for key in ("gpus", "strategy", "gradient_checkpointing", "mem_mb", "runtime_min", "threads", "concurrency",
                    "keep_checkpoints"):
            dump["rl"].pop(key)
        return dump

    def digest(self, *sections: str, covered: tuple[str, ...] = ()) -> Digest:
        """Short content hash of some `rerun_view` sections: a rule's rerun trigger and provenance stamp.

        A section is a key of `rerun_view` or a dotted path into one (`verification.probes`). The digest is also
        what the rule's job may read (`Digest.reads`, gymforge.core.configview): the sections, plus `covered`,
        sections or dotted keys the job reads whose changes already reach it another way (another param of the
        rule, or its inputs: an upstream rule that declares them reruns, and so this one), so they are not hashed
        twice."""
        view = self.rerun_view()
        text = hashlib.sha256(json.dumps({s: _walk(view, s) for s in sections}, sort_keys=True).encode()).hexdigest()[:12]
        return Digest(text, reads=(*sections, *covered))


def _walk(view: dict[str, Any], section: str) -> Any:
    value: Any = view
    for part in section.split("."):
        value = value[part]
    return value


class Digest(str):
    """A rule's rerun trigger (`params: digest=CFG.digest(...)`): the hash text, which Snakemake records and
    compares like any string, carrying the config sections the rule declares (`reads`). The Snakefile hands each
    job its rule's list (rules/common.smk), and the job's config is a view that raises on anything else."""

    reads: tuple[str, ...]

    def __new__(cls, text: str, reads: tuple[str, ...] = ()) -> Digest:
        digest = super().__new__(cls, text)
        digest.reads = reads
        return digest

    def __reduce__(self) -> tuple[Any, ...]:
        return Digest, (str(self), self.reads)


# What a declared `rerun_view` section lets a job read, where that is not the config section of the same name.
SECTION_KEYS: dict[str, tuple[str, ...]] = {
    "teacher": ("llm.teacher",),
    "student": ("train.student",),
    "sft": ("sft", "train.max_length"),
}

# Settings every job may read without declaring them, because no rule's digest covers them (`rerun_view` leaves
# them out): where files go; the budget; how an endpoint is reached, retried and priced; the plan (how many
# items, which ones: a job's own items reach it as wildcards, inputs and params); resources and parallelism.
# None of them changes what a job computes from its inputs.
READABLE_EVERYWHERE: tuple[str, ...] = (
    "results_dir", "cache_dir", "llm.budget_usd",
    *(f"llm.teacher.{k}" for k in ("base_url", "api_key_env", "concurrency", "timeout_s", "connect_timeout_s",
                                   "max_retries", "price", "token_param")),
    "topics.n", "datasets.cache_dir",
    *(f"trajectories.{k}" for k in ("per_task", "shard_size", "concurrency", "gpus", "mem_mb", "runtime_min")),
    *(f"train.{k}" for k in ("gpus", "mem_mb", "runtime_min", "logging_steps", "prefetch", *TRAIN_SAVING)),
    *(f"evaluate.{k}" for k in ("tasks", "runs_per_task", "concurrency", "models", "mem_mb", "runtime_min")),
    "evaluate.serving.gpus", *(f"tracking.{k}" for k in ("backend", "project", "dir")),
    *(f"rl.{k}" for k in ("gpus", "strategy", "gradient_checkpointing", "mem_mb", "runtime_min", "threads",
                          "concurrency", "keep_checkpoints")),
)


def declared_keys(reads: tuple[str, ...] | list[str]) -> frozenset[str]:
    """The config keys (dotted paths) that a rule declaring `reads` may read, besides `READABLE_EVERYWHERE`."""
    return frozenset(key for section in reads for key in SECTION_KEYS.get(section, (section,)))


def _format_errors(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"]) or "<root>"
        reason = e["msg"]
        if e["type"] == "extra_forbidden":
            reason = "unknown key (check the spelling against config.yaml / schemas/config.schema.json)"
        got = e.get("input")
        suffix = f" (got {got!r})" if e["type"] != "extra_forbidden" and not isinstance(got, dict) else ""
        lines.append(f"  {path}: {reason}{suffix}")
    return "invalid gymforge config:\n" + "\n".join(lines)


def validate_config(raw: dict[str, Any]) -> GymforgeConfig:
    try:
        return GymforgeConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_format_errors(err)) from None


# The key by which a config file layers itself over others (`base: ../config.yaml`), resolved from the file's folder.
BASE_KEY = "base"


def read_layers(path: str | Path, _chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A config file's raw settings, deep-merged over those of the files its `base:` names (one path or a list,
    each relative to the file, each resolved the same way). Without `base:` a file stands on its own over the models'
    defaults. ConfigError names a missing, unreadable or circular file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
    if path.resolve() in _chain:
        raise ConfigError(f"{path}: its `base:` chain comes back to itself ({' -> '.join(map(str, _chain))})")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {str(err).splitlines()[0]}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a config file is a mapping of settings, not a {type(raw).__name__}")
    bases = raw.pop(BASE_KEY, None) or []
    layered: dict[str, Any] = {}
    for base in [bases] if isinstance(bases, str) else bases:
        layered = deep_merge(layered, read_layers(path.parent / base, (*_chain, path.resolve())))
    return deep_merge(layered, raw)


# What the `gymforge` commands and the Snakefile read without a config file: the quick start's config.yaml in the
# working directory.
DEFAULT_CONFIG_FILE = "config.yaml"


def layered_config(configfiles: Iterable[str | Path] = (), overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a run's settings are before validation, as `snakemake [--configfile A B] [--config k=v]` resolves them:
    the files in order, each with its `base:` chain, then the overrides; with no file, ./config.yaml when the
    working directory has one. A file given explicitly never inherits config.yaml unless its `base:` names it."""
    files = [Path(f) for f in configfiles]
    if not files and Path(DEFAULT_CONFIG_FILE).is_file():
        files = [Path(DEFAULT_CONFIG_FILE)]
    raw: dict[str, Any] = {}
    for f in files:
        raw = deep_merge(raw, read_layers(f))
    return deep_merge(raw, dict(overrides)) if overrides else raw


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> GymforgeConfig:
    """A config file (YAML or JSON, with its `base:` chain) validated over the models' defaults."""
    return validate_config(layered_config([path], overrides))


def config_or_defaults(path: str | Path | None) -> GymforgeConfig:
    """`--config PATH` of a command: that file; without one, ./config.yaml when the working directory has one (a
    checkout or a run directory), else the models' defaults, so the commands work from any directory."""
    if path is None:
        if not Path(DEFAULT_CONFIG_FILE).is_file():
            return GymforgeConfig()
        path = DEFAULT_CONFIG_FILE
    return load_config(path)


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out
