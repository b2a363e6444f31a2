"""Training stage: supervised fine-tuning of the student on the SFT dataset with TRL.

`train_student(cfg, dataset, base, tokenizer, out)` (the step of rule `train_student`, `gymforge train-student`) runs
`trl.SFTTrainer` on the chat-format dataset (`results/sft/dataset`, its `messages` column) and writes one checkpoint
folder (`results/checkpoints/<train.name>/`):

    config.json, model.safetensors, generation_config.json   the trained (LoRA: merged) model, no peft needed
    tokenizer files + chat_template.jinja                     the student's tokenizer and inference template
    metrics.jsonl                                             one line per logged optimizer step
    loss.png                                                  the loss curve
    train_report.json                                         a `TrainReport`

Contracts:

- Loss on assistant tokens only. A template with `{% generation %}` markers (the offline tokenizer's) gives
  the mask itself (TRL's `assistant_only_loss=True`). Templates without them (SmolLM2's, Qwen3's, most others) are
  not swapped for a training variant: the dataset is tokenized here with masks computed from the conversation as
  the template itself renders it (`gymforge.student.masks`: each assistant turn from where the generation
  prompt ends to its content's end plus the end-of-turn token), so training sees exactly the text serving renders.
  `check_chat_template` probes the template before any model is loaded, so one that cannot be masked fails at once
  with the student named. The checkpoint keeps the tokenizer's template.
- Example units (`unit` column, `gymforge.stages.sft`): a `conversation` row trains every assistant turn; a
  `request` row (a request and the reply it got) trains only its last assistant turn, the reply. A dataset with
  request rows is tokenized here (`tokenize_turns(last_only=True)`: the mask from the template's markers, else
  from its rendering), whatever the template.
- Truncation: every tokenized conversation is cut to `train.max_length` tokens keeping its start (TRL's
  `keep_start`: the system prompt and the task stay; the tail of an over-long trajectory is lost). A request
  row keeps its end instead (cut here, before TRL: the reply stays, the start of the request goes, as an RL
  sample's). An example whose assistant tokens all fall beyond the cut has no loss and is dropped by TRL;
  `TrainReport.examples_trained` counts what remained, `truncated` how many were cut (from the dataset's
  `tokens` column).
- Packing (`train.packing`): TRL's best-fit-decreasing packing, padding-free: the examples (cut to
  `train.max_length`, keeping their start) are packed into rows of up to `train.max_length` tokens and a batch is
  one row of them all, their positions restarting at each example, so attention stays within an example (flash
  attention's variable-length kernel, or SDPA with the block-diagonal mask transformers builds from the positions)
  and no step pays for padding. TRL builds the labels from the assistant masks before packing, so the masks survive;
  an example whose assistant tokens all fall beyond the cut is packed, with no loss, instead of dropped.
  `TrainReport.examples_trained` counts the examples in the packed rows.
- Kernels (`train.liger`): Liger's Triton kernels for RMSNorm, RoPE and SwiGLU (TRL's `use_liger_kernel`; its
  fused LM head stays TRL's). Needs liger-kernel and a CUDA GPU, else training fails at once.
- Precision: `auto` is bf16 on a CUDA GPU that supports it, else fp32. bf16 computes under bf16 autocast over
  float32 master weights and AdamW state (`train.master_weights: fp32`, the default; `bf16` loads the weights in
  bfloat16, where an update smaller than half a bf16 spacing is rounded away: most at lr 1e-5); fp16 keeps fp32
  weights and uses fp16 autocast with loss scaling (fp16 weights cannot be unscaled); fp32 is plain float32. fp16
  needs a GPU. A model trained in bf16 is saved in bfloat16 either way (one rounding at the end, as released Qwen3
  weights are; vLLM's `dtype: auto` would serve a float32 folder in float16); its resumable checkpoints keep float32.
- CPU (`gymforge.student.cpu_training`): TRL's fused LM head projects only the trained positions (off CUDA it
  projects all of them), OpenMP threads sleep at barriers instead of spinning (`OMP_WAIT_POLICY=PASSIVE`, set before
  torch loads, unless set), and torch's threads are the job's cores (`OMP_NUM_THREADS`, else the CPU affinity and
  quota). The same loss and weights up to rounding at 1.46x the tokens/s for the offline student on 2 idle cores,
  more on loaded ones (`bench/student_throughput.py`).
- Seed: `train.seed`, else the run seed (model init of LoRA adapters, data order, dropout).
- Atomic output: training writes into the hidden sibling `.<name>.tmp` and renames it to `out` only after
  everything is written. A killed or failed job leaves at most that hidden folder, which the next run removes, and
  its resumable checkpoints.
- Resume (`gymforge.student.resume`): transformers' checkpoints (weights, optimizer, scheduler, RNG states) go to
  the hidden sibling `.<name>.resume/` every `train.save_steps` steps and every `train.save_minutes` minutes, the
  newest `train.save_total_limit` kept, none at the last step. A rerun resumes from the newest complete checkpoint of
  the same run (same settings, seed, base, tokenizer and data) with `resume_from_checkpoint`, skipping the batches
  already trained, so the weights end as an uninterrupted run's; `metrics.jsonl` keeps the rows logged before the
  checkpoint. After success the folder is removed: the final model supersedes it.
- Multi-GPU (`train.gpus > 1`): `launch_command` wraps the same CLI in `accelerate launch` with
  `gymforge/runtime/accelerate/<strategy>.yaml` (ddp, fsdp: FSDP2 full shard wrapping `Qwen3DecoderLayer`,
  deepspeed: ZeRO-3). Every rank runs `train_student`; only the main process writes files. LoRA adapters are
  gathered, then merged into the base by the main process in a clean subprocess (no distributed state).
"""
# long file: 90 lines of it are the docstring's training contract; the rest: settings, callbacks, trainer, launch

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import resource
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from pydantic import BaseModel, Field

from gymforge.core import atomic
from gymforge.runtime import tracking
from gymforge.core.config import GymforgeConfig
from gymforge.runtime.launch import accelerate_launch
from gymforge.hub.data import quiet_datasets
from gymforge.student import flops, resume
from gymforge.student.base import build_base, train_seed
from gymforge.runtime.cpus import cpu_threads
from gymforge.student.cpu_training import compact_lm_head, prepare_cpu_process, set_cpu_threads
from gymforge.student.masks import TrainingError, check_chat_template, tokenize_turns
from gymforge.student.tokenizer import load_tokenizer

log = logging.getLogger("gymforge.stages.training")

REPORT = "train_report.json"
METRICS = "metrics.jsonl"
LOSS_PLOT = "loss.png"
ADAPTER_DIR = "_adapter"  # inside the temp folder; removed before the rename
_NEVER = 2**31 - 1  # save_steps when only timed saves are asked for


class TrainReport(BaseModel):
    """`train_report.json`: what was trained, how long it took and what it cost."""

    student: str = Field(description="train.student")
    base: str = Field(description="The model training started from (folder or hub id).")
    examples: int = Field(description="Rows of the SFT dataset.")
    examples_trained: int = Field(description="Rows left after tokenization (rows with no assistant token in "
                                  "max_length are dropped).")
    truncated: int | None = Field(description="Rows longer than max_length (cut to it); null when the dataset "
                                  "has no `tokens` column.")
    max_length: int
    steps: int = Field(description="Optimizer steps.")
    epochs: float
    first_loss: float | None
    final_loss: float | None
    mean_loss: float | None = Field(description="Trainer's average training loss over the whole run (a resumed "
                                    "run: over the steps after its checkpoint).")
    wall_s: float = Field(description="Seconds of the training loop (model loading and saving excluded; a resumed "
                          "run: its own loop).")
    total_s: float = Field(description="Seconds from start to the finished checkpoint (a resumed run: its own).")
    train_tokens: int = Field(description="Tokens (prompt and completion, padding excluded) fed to the model, "
                              "all processes together; a resumed run counts those before its checkpoint as logged "
                              "at or before it.")
    tokens_per_s: float = Field(description="Tokens this run fed over wall_s.")
    resumed_from_step: int | None = Field(None, description="The step of the checkpoint this run resumed from "
                                          "(`gymforge.student.resume`); null: it started from the base.")
    peak_memory_mb: float
    peak_memory_kind: str = Field(description="`cuda_max_allocated` (main process's GPU) or `max_rss` (process).")
    device: str
    world_size: int
    precision: str = Field(description="Resolved precision: bf16, fp16 or fp32.")
    master_weights: str = Field("float32", description="The dtype the weights and AdamW's state were trained in "
                                "(bf16 computes under autocast over float32 ones unless train.master_weights is bf16; "
                                "the saved model is bfloat16 then).")
    lora: bool
    seed: int
    chat_template: str = Field(description="Where the assistant mask came from: `tokenizer` (its template's generation "
                               "markers) or `rendered` (computed from the rendered conversation).")
    config: dict[str, Any] = Field(description="The `train` section used.")
    versions: dict[str, str]


# ---- settings ---------------------------------------------------------------------------------------


def resolve_precision(precision: str) -> str:
    import torch

    cuda = torch.cuda.is_available()
    if precision == "auto":
        return "bf16" if cuda and torch.cuda.is_bf16_supported() else "fp32"
    if precision == "fp16" and not cuda:
        raise TrainingError("train.precision is 'fp16' but no CUDA GPU is available; use 'auto', 'fp32' or 'bf16'")
    return precision


def rendered_dataset(dataset: Any, tokenizer: Any, student: str, max_length: int | None = None) -> Any:
    """The `messages` column tokenized with assistant masks (`input_ids`, `assistant_masks`; from the rendering, or
    the template's markers when it has them): TRL builds the labels from the masks, truncates and drops fully
    masked rows itself. A `request` row (`unit` column) masks its last assistant turn only and is cut to its last
    `max_length` tokens here."""
    def tokenize(row: dict[str, Any]) -> dict[str, list[int]]:
        request = row.get("unit") == "request"
        out = tokenize_turns(tokenizer, row["messages"], repr(student), last_only=request)
        if request and max_length is not None and len(out["input_ids"]) > max_length:
            out = {k: v[-max_length:] for k, v in out.items()}
        return out

    columns = ["messages", "unit"] if "unit" in dataset.column_names else ["messages"]
    return dataset.select_columns(columns).map(tokenize, remove_columns=columns)


def examples_trained(train_dataset: Any) -> int:
    """Examples in TRL's prepared dataset: its rows, or with packing the examples packed into them."""
    if "seq_lengths" in train_dataset.column_names:
        return sum(len(lengths) for lengths in train_dataset["seq_lengths"])
    return len(train_dataset)


def has_request_rows(dataset: Any) -> bool:
    """Some row is a `request` example (only its last assistant turn is trained)."""
    return "unit" in dataset.column_names and "request" in set(dataset["unit"])


def lora_config(cfg: GymforgeConfig) -> Any:
    from peft import LoraConfig

    lora = cfg.train.lora
    return LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                      target_modules=lora.target_modules, task_type="CAUSAL_LM", bias="none")


def weights_dtype(cfg: GymforgeConfig, precision: str) -> str:
    """The dtype the weights (and AdamW's state) are kept in: bfloat16 only for bf16 with `master_weights: bf16`."""
    return "bfloat16" if precision == "bf16" and cfg.train.master_weights == "bf16" else "float32"


def sft_config(cfg: GymforgeConfig, output_dir: Path, precision: str) -> Any:
    """TRL's settings; `output_dir` is where resumable checkpoints go (`gymforge.student.resume`)."""
    from trl import SFTConfig

    t = cfg.train
    seed = train_seed(cfg)
    dtype = weights_dtype(cfg, precision)
    if t.liger:
        check_liger()
    with warnings.catch_warnings():
        # transformers 5.2x renames gradient_checkpointing (activation_checkpointing); TRL still sets the old name
        warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*deprecated", category=FutureWarning)
        return _sft_config(SFTConfig, t, output_dir, precision, dtype, seed)


def liger_available() -> bool:
    """Liger's kernels can run here: the package is installed and there is a CUDA GPU (they are Triton kernels)."""
    import importlib.util

    return importlib.util.find_spec("liger_kernel") is not None and _cuda()


def check_liger() -> None:
    if not liger_available():
        raise TrainingError("train.liger needs the liger-kernel package and a CUDA GPU (its kernels are Triton's); "
                            "install it (`pip install liger-kernel`) or set train.liger: false")


def _sft_config(SFTConfig: Any, t: Any, output_dir: Path, precision: str, dtype: str, seed: int) -> Any:
    return SFTConfig(
        output_dir=str(output_dir),
        # data
        assistant_only_loss=True,
        max_length=t.max_length,
        truncation_mode="keep_start",
        # train.packing: best-fit-decreasing packing, padding-free (position_ids restart per example; TRL builds the
        # labels from the masks before packing, so the masks survive it)
        packing=t.packing,
        packing_strategy="bfd",
        padding_free=t.packing,
        dataset_num_proc=None,
        # optimisation
        learning_rate=t.learning_rate,
        num_train_epochs=t.epochs,
        per_device_train_batch_size=t.batch_size,
        gradient_accumulation_steps=t.gradient_accumulation,
        warmup_steps=t.warmup_ratio,  # a float in [0, 1) is a ratio of the total steps (transformers 5)
        lr_scheduler_type=t.scheduler,
        weight_decay=t.weight_decay,
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        gradient_checkpointing=t.gradient_checkpointing,
        use_liger_kernel=t.liger,  # the layers' kernels only: TRL keeps its fused LM head
        seed=seed,
        data_seed=seed,
        model_init_kwargs={"dtype": dtype, "device_map": None},
        # logging and saving: our callbacks write metrics.jsonl and the progress lines
        logging_strategy="steps",
        logging_steps=t.logging_steps,
        logging_first_step=True,
        report_to="none",
        disable_tqdm=True,
        # resumable checkpoints: transformers saves every save_steps; gymforge.student.resume's callback adds the
        # timed saves, marks complete checkpoints and removes old ones (so transformers' own rotation is off)
        save_strategy="steps" if t.save_steps or t.save_minutes else "no",
        save_steps=t.save_steps or _NEVER,
        save_total_limit=None,
        eval_strategy="no",
        dataloader_num_workers=0,
        dataloader_pin_memory=_cuda(),
        use_cpu=not _cuda(),  # also makes several CPU processes (torchrun, tests) one gloo process group
    )


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


# ---- callbacks --------------------------------------------------------------------------------------


def _fmt_s(seconds: float) -> str:
    seconds = int(max(0, seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def _callbacks() -> tuple[type, type]:
    from transformers import TrainerCallback

    class MetricsCallback(TrainerCallback):
        """Appends every logged step to `metrics.jsonl` (main process) and keeps the rows."""

        def __init__(self, path: Path | None) -> None:
            self.path = path
            self.rows: list[dict[str, Any]] = []
            self.start = time.monotonic()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "loss" not in logs:
                return
            row = {
                "step": state.global_step,
                "epoch": round(float(logs.get("epoch", state.epoch or 0.0)), 4),
                "loss": float(logs["loss"]),
                "learning_rate": float(logs["learning_rate"]) if "learning_rate" in logs else None,
                "grad_norm": float(logs["grad_norm"]) if logs.get("grad_norm") is not None else None,
                "tokens": int(logs["num_tokens"]) if "num_tokens" in logs else None,
                "mean_token_accuracy": logs.get("mean_token_accuracy"),
                "elapsed_s": round(time.monotonic() - self.start, 3),
            }
            self.rows.append(row)
            if self.path is not None and state.is_world_process_zero:
                with self.path.open("a") as fh:
                    fh.write(json.dumps(row) + "\n")

        def resume(self, rows: list[dict[str, Any]]) -> None:
            """Start from the rows a checkpoint kept; elapsed time goes on from its last row."""
            self.rows = list(rows)
            if rows:
                self.start = time.monotonic() - float(rows[-1].get("elapsed_s") or 0.0)
            if self.path is not None:
                self.path.write_text("".join(json.dumps(r) + "\n" for r in rows))

    class ProgressCallback(TrainerCallback):
        """`step k/N (p%) loss .. lr .. | elapsed, ETA` lines: at most every 5% or 30 s, plus first and last."""

        def __init__(self) -> None:
            self.start = time.monotonic()
            self.first_step = 0
            self.last_print = 0.0
            self.last_pct = -100.0
            self.loss: float | None = None

        def on_train_begin(self, args, state, control, **kwargs):
            self.start = time.monotonic()
            self.first_step = state.global_step  # a resumed run starts at its checkpoint's step
            if state.is_world_process_zero:
                log.info("training: %d optimizer steps, %.2f epochs%s", state.max_steps, args.num_train_epochs,
                         f", from step {state.global_step}" if state.global_step else "")

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                self.loss = float(logs["loss"])
                self._maybe_print(state)

        def on_step_end(self, args, state, control, **kwargs):
            if not control.should_log:  # a logged step is printed by on_log, with its loss
                self._maybe_print(state)

        def _maybe_print(self, state) -> None:
            if not state.is_world_process_zero:
                return
            step, total = state.global_step, max(1, state.max_steps)
            now = time.monotonic()
            pct = 100.0 * step / total
            if not (step in (1, total) or pct - self.last_pct >= 5 or now - self.last_print >= 30):
                return
            self.last_print, self.last_pct = now, pct
            elapsed = now - self.start
            done = step - self.first_step
            eta = elapsed / done * (total - step) if done > 0 else float("nan")
            loss = f"{self.loss:.4f}" if self.loss is not None else "-"
            log.info("train step %d/%d (%.0f%%) loss %s | %s elapsed, ETA %s", step, total, pct, loss,
                     _fmt_s(elapsed), _fmt_s(eta))

    return MetricsCallback, ProgressCallback


# ---- the trainer ------------------------------------------------------------------------------------


@contextlib.contextmanager
def quiet_progress() -> Iterator[None]:
    """No `datasets` or transformers (weight loading/saving) progress bars inside the block."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with quiet_datasets():
            yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def load_sft_dataset(dataset_dir: str | Path) -> Any:
    import datasets

    empty = TrainingError(f"{dataset_dir}: the SFT dataset is empty: no trajectory was kept, nothing to train on "
                          "(see results/sft/stats.json)")
    state = Path(dataset_dir) / "state.json"
    if state.is_file() and not json.loads(state.read_text()).get("_data_files", True):
        raise empty  # `datasets` saves an empty dataset without data files and cannot load it back
    with quiet_datasets():
        ds = datasets.load_from_disk(str(dataset_dir))
    if "messages" not in ds.column_names:
        raise TrainingError(f"{dataset_dir}: the SFT dataset has no `messages` column (columns: {ds.column_names})")
    if len(ds) == 0:
        raise empty
    return ds


def build_trainer(cfg: GymforgeConfig, dataset: Any, base: str, tokenizer_dir: str | Path, work_dir: str | Path,
                  *, callbacks: Iterable[Any] = (), args: Any = None) -> Any:
    """An `SFTTrainer` ready to train (dataset tokenized, masked and truncated: `trainer.train_dataset`)."""
    from transformers import PrinterCallback
    from trl import SFTTrainer

    tokenizer = load_tokenizer(Path(tokenizer_dir))
    mask_source = check_chat_template(tokenizer, cfg.train.student)
    if args is None:
        args = sft_config(cfg, Path(work_dir), resolve_precision(cfg.train.precision))
    peft = lora_config(cfg) if cfg.train.lora.enabled else None
    with quiet_progress():  # tokenizing/masking/truncating bars would bury the log
        train_dataset = dataset.select_columns(["messages"])
        if mask_source == "rendered" or has_request_rows(dataset):
            train_dataset = rendered_dataset(dataset, tokenizer, cfg.train.student, cfg.train.max_length)
            # The masks are in the data: TRL must neither look for markers nor swap in a template of its own.
            args.assistant_only_loss = False
        trainer = SFTTrainer(model=str(base), args=args, train_dataset=train_dataset,
                             processing_class=tokenizer, peft_config=peft, callbacks=list(callbacks))
    trainer.remove_callback(PrinterCallback)  # a raw dict per step; metrics.jsonl and our progress lines replace it
    if trainer.args.device.type == "cpu":  # TRL's fused LM head projects every position there; the trained ones do
        model = trainer.model
        compact_lm_head(model.get_base_model() if hasattr(model, "get_base_model") else model)
    if len(trainer.train_dataset) == 0:
        raise TrainingError(f"none of the {len(dataset)} examples has an assistant token within train.max_length="
                            f"{cfg.train.max_length}: the prompts alone are longer; raise train.max_length")
    return trainer


def merge_lora(base: str, adapter_dir: str | Path, out: str | Path, dtype: str = "float32") -> Path:
    """Merge the LoRA adapter of `adapter_dir` into `base` and save a plain transformers model to `out`."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=getattr(torch, dtype), device_map=None)
    merged = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    merged.save_pretrained(str(out))
    return Path(out)


def save_in_dtype(folder: str | Path, dtype: str) -> None:
    """Rewrite the saved model of `folder` with its floating-point tensors in `dtype` (file by file, each written to a
    temporary name and renamed), and record the dtype in config.json."""
    import torch
    from safetensors.torch import load_file, save_file

    folder, target = Path(folder), getattr(torch, dtype)
    total = 0
    for path in sorted(folder.glob("*.safetensors")):
        tensors = {k: v.to(target) if v.is_floating_point() else v for k, v in load_file(str(path)).items()}
        total += sum(v.numel() * v.element_size() for v in tensors.values())
        tmp = path.with_name(f".{path.name}.tmp")
        save_file(tensors, str(tmp), metadata={"format": "pt"})
        os.replace(tmp, path)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        data = json.loads(index.read_text())
        data.setdefault("metadata", {})["total_size"] = total
        atomic.write_json(index, data)
    config = json.loads((folder / "config.json").read_text())
    config["dtype"] = dtype
    atomic.write_json(folder / "config.json", config)


def _clean_env() -> dict[str, str]:
    """The environment without the launcher's distributed variables (for the merge subprocess)."""
    drop = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK",
            "ROLE_RANK", "ROLE_WORLD_SIZE", "TORCHELASTIC_RUN_ID")
    return {k: v for k, v in os.environ.items()
            if k not in drop and not k.startswith(("ACCELERATE_", "FSDP_", "TORCHELASTIC_"))}


def _peak_memory() -> tuple[float, str]:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.max_memory_allocated() / 2**20, "cuda_max_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "max_rss"


def plot_loss(rows: Sequence[dict[str, Any]], out: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    steps = [r["step"] for r in rows]
    losses = [r["loss"] for r in rows]
    ax.plot(steps, losses, color="#1f77b4", linewidth=1.2, marker="." if len(rows) < 60 else None, label="loss")
    if len(rows) >= 10:  # a moving average makes a noisy curve readable
        k = max(2, len(rows) // 20)
        smooth = [sum(losses[max(0, i - k + 1): i + 1]) / len(losses[max(0, i - k + 1): i + 1])
                  for i in range(len(losses))]
        ax.plot(steps, smooth, color="#d62728", linewidth=2, label=f"mean of last {k} logs")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss (assistant tokens)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    try:
        fig.savefig(out, dpi=120)  # inside the checkpoint's temp folder: atomic with it
    finally:
        plt.close(fig)
    return out


def _versions() -> dict[str, str]:
    import accelerate
    import peft
    import torch
    import transformers
    import trl

    return {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__,
            "peft": peft.__version__, "accelerate": accelerate.__version__}


def train_student(cfg: GymforgeConfig, dataset: str | Path, base: str | Path, tokenizer: str | Path,
          out: str | Path, *, callbacks: Iterable[Any] = ()) -> TrainReport:
    """Fine-tune `base` on the SFT dataset and write the complete checkpoint folder `out` (atomically).

    `callbacks` are extra `transformers.TrainerCallback`s (tests use one to fail mid-training).
    """
    t0 = time.monotonic()
    prepare_cpu_process()  # before torch is imported
    out = Path(out)
    base = str(base)
    tmp = out.parent / f".{out.name}.tmp"
    run_dir = resume.resume_dir(out)
    args = sft_config(cfg, run_dir, resolve_precision(cfg.train.precision))
    state = args.distributed_state  # under `accelerate launch` / torchrun this has joined the process group
    key = resume.run_key(cfg, dataset, base, tokenizer, state.num_processes)
    if state.is_main_process:
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # a killed run's leftovers
        tmp.mkdir()
        resume.discard_unusable(run_dir, key)
    state.wait_for_everyone()
    checkpoint = resume.newest_complete(run_dir, key)
    try:
        with quiet_progress():
            report = _train_into(cfg, dataset, base, tokenizer, tmp, args, t0, callbacks, key, checkpoint)
        state.wait_for_everyone()
        if state.is_main_process:
            if out.exists():
                shutil.rmtree(out)
            os.replace(tmp, out)
            shutil.rmtree(run_dir, ignore_errors=True)  # the finished model supersedes its checkpoints
            log.info("%s: %d steps, loss %s -> %s, %.0f tokens/s, %s", out, report.steps, report.first_loss,
                     report.final_loss, report.tokens_per_s, _fmt_s(report.total_s))
        state.wait_for_everyone()
        return report
    except BaseException:
        if state.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
            newest = resume.newest_complete(run_dir, key)
            if newest is not None:
                log.warning("kept %s: a rerun resumes from it", newest)
            elif run_dir.is_dir():
                shutil.rmtree(run_dir, ignore_errors=True)
        raise


def _save_weights(cfg: GymforgeConfig, trainer: Any, state: Any, base: str, tmp: Path, precision: str) -> None:
    """The trained weights into `tmp`: a LoRA adapter merged into the base (in a fresh process when several ran the
    training), else the model as trained; bf16 training over fp32 masters saves bfloat16."""
    if cfg.train.lora.enabled:
        adapter = tmp / ADAPTER_DIR
        trainer.save_model(str(adapter))  # gathers the adapter weights on every strategy
        state.wait_for_everyone()
        if state.is_main_process:
            dtype = weights_dtype(cfg, precision)
            if state.num_processes > 1:
                code = "import sys; from gymforge.stages.training import merge_lora; merge_lora(*sys.argv[1:])"
                subprocess.run([sys.executable, "-c", code, base, str(adapter), str(tmp), dtype], check=True,
                               env=_clean_env())
            else:
                merge_lora(base, adapter, tmp, dtype)
            shutil.rmtree(adapter)
    else:
        trainer.save_model(str(tmp))
    state.wait_for_everyone()
    if state.is_main_process and precision == "bf16" and weights_dtype(cfg, precision) != "bfloat16":
        save_in_dtype(tmp, "bfloat16")  # trained over fp32 masters, saved as computed (what vLLM's `auto` serves)


def _mfu_terms(trainer: Any, world_size: int) -> tuple[float | None, float | None]:
    """What the tracker's `mfu` needs (`gymforge.student.flops`): the model FLOPs per trained token, attention at the
    token-weighted mean length of the examples as tokenized (packed: of the examples in each row), and the peak FLOP/s
    of the devices training (one device's by its name x `world_size`); None for what is not known (a CPU, an
    unlisted GPU, a model config without a decoder's shape)."""
    import pyarrow.compute as pc

    peak = flops.device_peak_flops(trainer.args.device)
    ds = trainer.train_dataset.with_format("arrow")
    if "seq_lengths" in ds.column_names:
        lengths = pc.list_flatten(ds["seq_lengths"]).to_pylist()
    else:
        lengths = pc.list_value_length(ds["input_ids"]).to_pylist()
    model = trainer.model
    config = model.get_base_model().config if hasattr(model, "get_base_model") else model.config
    try:
        fpt = flops.flops_per_token(config, flops.attention_length(lengths))
    except (AttributeError, TypeError, ZeroDivisionError):
        fpt = None
    return fpt, peak * world_size if peak else None


def _train_into(cfg: GymforgeConfig, dataset_dir: str | Path, base: str, tokenizer_dir: str | Path, tmp: Path,
                args: Any, t0: float, extra_callbacks: Iterable[Any], key: str,
                checkpoint: Path | None) -> TrainReport:
    import torch

    state = args.distributed_state
    if not torch.cuda.is_available():
        set_cpu_threads(cpu_threads(state.num_processes))  # the job's cores, not the machine's
    MetricsCallback, ProgressCallback = _callbacks()
    dataset = load_sft_dataset(dataset_dir)
    metrics = MetricsCallback(tmp / METRICS if state.is_main_process else None)
    callbacks = [metrics, ProgressCallback(), *extra_callbacks]
    tracker = tracking.open_tracker(cfg, name=f"sft-{cfg.train.name}-seed{train_seed(cfg)}", kind="sft",
                                    config=cfg.train.model_dump(mode="json")) if state.is_main_process \
        else tracking.Tracker()
    t = cfg.train
    if t.save_steps or t.save_minutes:
        callbacks.append(resume.checkpoint_callback(Path(args.output_dir), key, t.save_total_limit, t.save_minutes,
                                                    lambda: metrics.rows))
    trainer = build_trainer(cfg, dataset, base, tokenizer_dir, tmp, callbacks=callbacks, args=args)
    fpt, peak = _mfu_terms(trainer, state.num_processes) if state.is_main_process else (None, None)
    trainer.add_callback(tracking.trainer_callback(tracker, flops_per_token=fpt, peak_flops=peak))
    tokenizer = trainer.processing_class
    precision = resolve_precision(cfg.train.precision)
    resumed_tokens = 0
    if checkpoint is not None:
        metrics.resume(resume.resumed_rows(checkpoint))
        resumed_tokens = next((r["tokens"] for r in reversed(metrics.rows) if r["tokens"] is not None), 0)
        trainer._total_train_tokens = resumed_tokens  # TRL's running count, which the log rows carry
        if state.is_main_process:
            log.info("resuming from %s", checkpoint)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    start = time.monotonic()
    try:
        result = trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint is not None else None)
    finally:
        tracker.finish()
    wall = time.monotonic() - start
    peak, peak_kind = _peak_memory()

    lora = cfg.train.lora.enabled
    _save_weights(cfg, trainer, state, base, tmp, precision)

    rows = metrics.rows
    tokens = int(getattr(trainer, "_total_train_tokens", 0) or (rows[-1]["tokens"] if rows else 0) or 0)
    new_tokens = tokens - resumed_tokens
    lengths = dataset["tokens"] if "tokens" in dataset.column_names else None
    mean_loss = result.training_loss
    report = TrainReport(
        student=cfg.train.student, base=base, examples=len(dataset), examples_trained=examples_trained(trainer.train_dataset),
        truncated=sum(n > cfg.train.max_length for n in lengths) if lengths is not None else None,
        max_length=cfg.train.max_length, steps=trainer.state.global_step,
        epochs=round(float(trainer.state.epoch or 0), 4),
        first_loss=rows[0]["loss"] if rows else None, final_loss=rows[-1]["loss"] if rows else None,
        mean_loss=float(mean_loss) if mean_loss is not None and math.isfinite(mean_loss) else None,
        wall_s=round(wall, 3), total_s=0.0, train_tokens=tokens,
        tokens_per_s=round(new_tokens / wall, 1) if wall else 0.0,
        resumed_from_step=int(checkpoint.name.rsplit("-", 1)[1]) if checkpoint is not None else None,
        peak_memory_mb=round(peak, 1), peak_memory_kind=peak_kind, device=str(trainer.args.device),
        world_size=state.num_processes, precision=precision, master_weights=weights_dtype(cfg, precision),
        lora=lora, seed=train_seed(cfg),
        chat_template=check_chat_template(tokenizer, cfg.train.student), config=cfg.train.model_dump(mode="json"),
        versions=_versions(),
    )
    if state.is_main_process:
        tokenizer.save_pretrained(str(tmp))
        (tmp / "training_args.bin").unlink(missing_ok=True)  # pickled args: not needed to load or serve
        if rows:
            plot_loss(rows, tmp / LOSS_PLOT, f"SFT of {cfg.train.name}: loss {rows[0]['loss']:.3f} -> "
                      f"{rows[-1]['loss']:.3f} in {report.steps} steps")
        else:
            (tmp / METRICS).touch()
        report.total_s = round(time.monotonic() - t0, 3)
        atomic.write_json(tmp / REPORT, report.model_dump(mode="json"))
    return report


# ---- launching --------------------------------------------------------------------------------------


def launch_command(cfg: GymforgeConfig, argv: Sequence[str]) -> list[str]:
    """The command that runs `gymforge train-student <argv>`: plain Python for 0-1 GPU, `accelerate launch` beyond.

    argv: the arguments after `train-student`, e.g. `["--config", C, "--dataset", D, "--base", B, "--tokenizer", T,
    "--out", O]`.
    """
    gpus = cfg.train.gpus
    if gpus <= 1:
        return [sys.executable, "-m", "gymforge", "train-student", *argv]
    return [*accelerate_launch(cfg.train.strategy, gpus), "-m", "gymforge", "train-student", *argv]


def student_base(cfg: GymforgeConfig, tokenizer: Path, out: Path) -> Path:
    """The offline student's base model (a tiny random-init Qwen3 with the student's tokenizer)."""
    return build_base(cfg, Path(tokenizer), Path(out))
