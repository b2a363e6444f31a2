"""The sections that score models (`evaluate`): the benchmark, the models to score and how checkpoints are served."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from gymforge.core.ids import check_task_id
from gymforge.core.sections.base import Strict
from gymforge.core.sections.llm import Price, RequestOptions


class ModelSpec(RequestOptions):
    """One model to score. Every model is reached through an OpenAI-compatible endpoint; the request options
    (`token_param`, `omit_params`, `reasoning_effort`, `extra_body`) apply to an `endpoint` model (a `teacher` model
    uses llm.teacher's)."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9.-]*$", description="Run folders are <name>__<task>__run<k>; "
                      "`baseline` is reserved for the baseline pseudo-model.")
    source: Literal["teacher", "student-base", "student-sft", "student-rl", "endpoint", "checkpoint"] = Field(
        description="`teacher`: llm.teacher (with `model` as its model name when set); `student-base`/`student-sft`: "
        "the student before/after SFT, served by evaluate.serving; `student-rl`: the RL checkpoint (rule train_rl); `endpoint`: an external OpenAI-compatible endpoint "
        "(`base_url`, `model`); `checkpoint`: a local model folder or hub id in `model`, served by evaluate.serving.")
    model: str | None = Field(None, description="The model name (`teacher`: instead of llm.teacher.model; "
                              "`endpoint`: required) or, for `checkpoint`, a local folder or hub id.")
    base_url: str | None = Field(None, description="The endpoint URL ending in /v1 (`endpoint` models).")
    api_key_env: str = Field("OPENAI_API_KEY", description="Name of the environment variable holding the "
                             "endpoint's API key (`endpoint` models).")
    price: Price = Price()

    def identity_json(self) -> str:
        """The spec as its runs' rerun trigger and resume fingerprint record it: the request options only where they
        are set (`request_identity`), so the runs of a spec that sets none keep the identity they had before."""
        text = self.model_dump_json(exclude=set(RequestOptions.model_fields))
        return text + (json.dumps(extra, sort_keys=True) if (extra := self.request_identity()) else "")

    @model_validator(mode="after")
    def _complete(self) -> "ModelSpec":
        if self.name == "baseline":
            raise ValueError("`baseline` is the baseline pseudo-model's name; choose another")
        if self.source == "endpoint" and not (self.base_url and self.model):
            raise ValueError("an `endpoint` model needs base_url and model")
        if self.source == "checkpoint" and not self.model:
            raise ValueError("a `checkpoint` model needs model (a folder or a hub id)")
        return self


class ServingConfig(Strict):
    backend: Literal["auto", "transformers", "vllm"] = Field(
        "auto", description="How local checkpoints are served: `transformers` (loopback server, CPU or GPU), `vllm` "
        "(launched per job, GPU), `auto`: vllm when gpus > 0 and vllm is installed, else transformers.")
    gpus: int = Field(0, ge=0, description="GPUs each evaluation job of a served model declares.")
    max_new_tokens: int = Field(1024, ge=1, description="Tokens per reply of a served model.")
    temperature: float = Field(0.7, ge=0, le=2, description="Sampling temperature of a served model.")
    max_batch: int = Field(32, ge=1, description="The transformers server's batch: concurrent requests decoded "
                           "together at most (requests join a running batch between tokens); 1 answers one at a time. "
                           "vLLM schedules its own.")
    startup_timeout_s: float = Field(900.0, gt=0, description="Longest wait for a served model's server to "
                                     "come up and list the model (loading the weights included).")
    vllm_args: list[str] = Field([], description="Extra arguments for `vllm serve` (e.g. --max-model-len 32768).")


class EvaluateConfig(Strict):
    benchmark: Literal["builtin", "posttraining", "mlgym"] = Field(
        "builtin", description="`builtin`: gymforge's offline suite; `posttraining`: its post-training suite "
        "(post-train SmolLM2-135M-Instruct on CPU, or post_training.base_model; docs/post-training.md); `mlgym`: the "
        "tasks of the checkout at mlgym_root.")
    mlgym_root: str | None = Field(None, description="An MLGym checkout (its configs/tasks/*.yaml and data/).")
    tasks: list[str] | None = Field(None, description="Task ids to run; null: every task of the benchmark.")
    harbor: list[str] = Field([], description="Harbor task folders (task.toml, instruction.md, environment/, "
                              "tests/test.sh) scored beside the benchmark's tasks (docs/interop.md): a folder's name "
                              "is its task id, its verifier scores the runs, its task.toml's gpus are its jobs'. "
                              "evaluate.tasks may name them too (only Harbor tasks: list only their ids).")
    runs_per_task: int = Field(4, ge=1, description="Runs per model and task (MLGym: 4, paper: 64).")
    task_gpus: int = Field(0, ge=0, description="GPUs each run of a built-in suite's task gets (its eval_runs and "
                           "check_benchmark_task jobs declare them): the post-training suite with a GPU base "
                           "(post_training.base_model, e.g. Qwen/Qwen3-4B-Base) needs 1. MLGym's tasks declare their own.")
    exclude_gameable: bool = Field(False, description="Leave benchmark tasks whose evaluator a probe games "
                                   "(`gymforge check-task`) out of AUP, with a message; otherwise they are scored "
                                   "and marked gameable in scores.json and the report.")
    max_steps: int = Field(50, ge=1, description="Agent step limit per run (MLGym: 50).")
    concurrency: int = Field(2, ge=1, description="Runs in flight at once inside one job.")
    models: list[ModelSpec] = Field(
        [ModelSpec(name="teacher", source="teacher"), ModelSpec(name="student-base", source="student-base"),
         ModelSpec(name="student-sft", source="student-sft")],
        description="Models to score; the baseline pseudo-model is always added.")
    serving: ServingConfig = ServingConfig()
    mem_mb: int = Field(4096, ge=256, description="Memory an eval_runs / check_benchmark_task job declares at least; raised to concurrency x sandbox.memory_mb + 1 GiB (one sandbox for check_benchmark_task) when that is more.")
    runtime_min: int = Field(240, ge=1, description="Wall-clock minutes each eval_runs / check_benchmark_task job "
                             "declares.")
    threads: int = Field(1, ge=1, description="CPU cores each eval_runs / check_benchmark_task job declares.")

    @model_validator(mode="after")
    def _consistent(self) -> "EvaluateConfig":
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"evaluate.models: duplicate names in {names}")
        if self.benchmark == "mlgym" and not self.mlgym_root:
            raise ValueError("evaluate.mlgym_root is required when benchmark is 'mlgym'")
        for task_id in self.tasks or []:  # ids name result files: never let an odd one reach them
            check_task_id(task_id, "evaluate.tasks: task id")
        for folder in self.harbor:
            check_task_id(Path(folder).expanduser().resolve().name, f"evaluate.harbor: {folder}'s name, its task id,")
        return self
