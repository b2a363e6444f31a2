"""The train skill's sandbox side: `train.py CONFIG [--data-sha256 HEX]`, one tracked TRL run from a YAML config.

Each run gets the next free `runs/<k>/` under the workspace: `config.yaml` (a copy of CONFIG), `train.log` (the
trainer's figures, one JSON object a logging step), `checkpoint/` (the model: safetensors weights, with the config
and tokenizer files of the model it started from, so it stays a descendant of the base) and `result.json`. With
`export: true` (the default) the checkpoint is also copied to `final_model/`, which is what the evaluation scores.
Every run, failed ones too, appends its entry to `experiment_log.md`. The last line printed is
`TRAIN_RESULT {json}`.

CONFIG (YAML mapping; unknown keys are refused):
  data: the training file (required; rowformat.py says which rows), relative to the current directory
  method: sft (default) | dpo (rows with prompt, chosen, rejected)
  model: base_model/ (default) | runs/<k>/checkpoint (a previous run) | final_model/
  epochs: 1, max_steps: -1 (>0 overrides epochs), learning_rate: 1e-4, batch_size: 8,
  gradient_accumulation_steps: 1, max_length: 256, lr_scheduler: constant | linear | cosine, warmup_steps: 0,
  seed: 0, beta: 0.1 (dpo), logging_steps: 5, export: true, threads: the sandbox's CPUs (GYMFORGE_TORCH_THREADS
  when set)

Runs with the installed transformers, TRL and PyYAML; imports nothing of gymforge.
"""

import hashlib
import json
import os
import re
import shutil
import sys
import time
import traceback

import log as experiment_log
import rowformat

HERE = os.path.dirname(os.path.abspath(__file__))
WORKSPACE = os.path.dirname(HERE)  # the skills are mounted at <workspace>/skills
RUNS = os.path.join(WORKSPACE, "runs")
FINAL = os.path.join(WORKSPACE, "final_model")
EXPORTED = os.path.join(RUNS, "final_model.txt")  # which run final_model/ came from
DEFAULTS = {"data": None, "method": "sft", "model": "base_model", "epochs": 1.0, "max_steps": -1,
            "learning_rate": 1e-4, "batch_size": 8, "gradient_accumulation_steps": 1, "max_length": 256,
            "lr_scheduler": "constant", "warmup_steps": 0, "seed": 0, "beta": 0.1, "logging_steps": 5,
            "export": True, "threads": None}
MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "chat_template.jinja", "vocab.json", "merges.txt", "tokenizer.model",
               "added_tokens.json")


class ConfigError(ValueError):
    pass


def load_config(path):
    import yaml

    with open(path, encoding="utf-8") as f:
        raw = yaml.safe_load(f)
    if not isinstance(raw, dict):
        raise ConfigError("the config must be a YAML mapping of settings")
    unknown = sorted(set(raw) - set(DEFAULTS))
    if unknown:
        raise ConfigError(f"unknown settings {unknown}; known: {sorted(DEFAULTS)}")
    cfg = {**DEFAULTS, **raw}
    if not isinstance(cfg["data"], str):
        raise ConfigError("`data` (the training file) is required")
    if cfg["method"] not in ("sft", "dpo"):
        raise ConfigError("`method` is sft or dpo")
    if cfg["lr_scheduler"] not in ("constant", "linear", "cosine"):
        raise ConfigError("`lr_scheduler` is constant, linear or cosine")
    for key, kind in (("epochs", float), ("learning_rate", float), ("beta", float),
                      ("max_steps", int), ("warmup_steps", int), ("batch_size", int), ("gradient_accumulation_steps", int),
                      ("max_length", int), ("seed", int), ("logging_steps", int)):
        if isinstance(cfg[key], bool) or not isinstance(cfg[key], (int, float)):
            raise ConfigError(f"`{key}` must be a number")
        cfg[key] = kind(cfg[key])
    if cfg["learning_rate"] <= 0 or cfg["batch_size"] < 1 or cfg["max_length"] < 8 or cfg["epochs"] <= 0:
        raise ConfigError("learning_rate and epochs must be > 0, batch_size >= 1, max_length >= 8")
    cfg["model"] = model_dir(str(cfg["model"]))
    return cfg


def model_dir(name):
    """base_model/, final_model/ or runs/<k>/checkpoint, as an absolute path; anything else is refused."""
    rel = os.path.normpath(name)
    if rel not in ("base_model", "final_model") and not re.fullmatch(r"runs/\d+/checkpoint", rel):
        raise ConfigError(f"`model` must be base_model, final_model or runs/<k>/checkpoint (got {name!r})")
    path = os.path.join(WORKSPACE, rel)
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ConfigError(f"{rel}/ holds no model (no config.json)")
    return path


def new_run():
    os.makedirs(RUNS, exist_ok=True)
    while True:
        taken = [int(n) for n in os.listdir(RUNS) if n.isdigit()]
        k = max(taken, default=0) + 1
        try:
            os.mkdir(os.path.join(RUNS, str(k)))
            return k
        except FileExistsError:
            continue


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def threads(cfg):
    if cfg["threads"] is not None:
        return max(1, int(cfg["threads"]))
    env = os.environ.get("GYMFORGE_TORCH_THREADS")
    return max(1, int(env)) if env and env.isdigit() else max(1, len(os.sched_getaffinity(0)))


def rel(path):
    return os.path.relpath(path, WORKSPACE)


def train(cfg, run_dir, rows, log_file):
    n_threads = threads(cfg)
    os.environ["OMP_NUM_THREADS"] = str(n_threads)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback

    torch.set_num_threads(n_threads)
    options = {"trust_remote_code": False, "local_files_only": True}
    tokenizer = AutoTokenizer.from_pretrained(cfg["model"], **options)
    model = AutoModelForCausalLM.from_pretrained(cfg["model"], use_safetensors=True, dtype=torch.float32, **options)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    class Log(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            line = json.dumps({"step": state.global_step, **{k: round(v, 6) if isinstance(v, float) else v
                                                                for k, v in (logs or {}).items()}})
            log_file.write(line + "\n")
            log_file.flush()
            print(line, flush=True)  # instead of the trainer's own printer (removed below)

    common = dict(
        output_dir=os.path.join(run_dir, ".trainer"), num_train_epochs=cfg["epochs"], max_steps=cfg["max_steps"],
        learning_rate=cfg["learning_rate"], per_device_train_batch_size=cfg["batch_size"],
        gradient_accumulation_steps=cfg["gradient_accumulation_steps"], lr_scheduler_type=cfg["lr_scheduler"],
        warmup_steps=cfg["warmup_steps"], logging_steps=max(1, cfg["logging_steps"]), save_strategy="no",
        report_to=[], seed=cfg["seed"], use_cpu=not torch.cuda.is_available(), dataloader_num_workers=0,
        max_length=cfg["max_length"], disable_tqdm=True,
        # TRL's configs default to bf16 autocast and gradient checkpointing: on a CPU that is emulated and ~20x
        # slower (a 10-step SmolLM2 SFT: 34 s without, 484 s with); bf16 only where the GPU has it.
        bf16=torch.cuda.is_available() and torch.cuda.is_bf16_supported(), fp16=False, gradient_checkpointing=False)
    data = Dataset.from_list([row for _, _, row in rows])
    if cfg["method"] == "dpo":
        from trl import DPOConfig, DPOTrainer

        trainer = DPOTrainer(model=model, args=DPOConfig(beta=cfg["beta"], **common), train_dataset=data,
                             processing_class=tokenizer, callbacks=[Log()])
    else:
        from trl import SFTConfig, SFTTrainer

        trainer = SFTTrainer(model=model, args=SFTConfig(completion_only_loss=True, **common), train_dataset=data,
                             processing_class=tokenizer, callbacks=[Log()])
    trainer.remove_callback(PrinterCallback)
    result = trainer.train()
    shutil.rmtree(os.path.join(run_dir, ".trainer"), ignore_errors=True)
    checkpoint = os.path.join(run_dir, "checkpoint")
    trainer.model.save_pretrained(checkpoint, safe_serialization=True)
    for name in MODEL_FILES:  # the starting model's own files: the checkpoint must stay a descendant of the base
        if os.path.isfile(os.path.join(cfg["model"], name)):
            shutil.copyfile(os.path.join(cfg["model"], name), os.path.join(checkpoint, name))
    return {"steps": int(result.global_step), "train_loss": round(float(result.training_loss), 6),
            "threads": n_threads}


def main(argv):
    if len(argv) not in (1, 3) or (len(argv) == 3 and argv[1] != "--data-sha256"):
        print("usage: train.py CONFIG [--data-sha256 HEX]", file=sys.stderr)
        return 2
    config_path = argv[0]
    with open(config_path, "rb") as f:
        config_bytes = f.read()
    k = new_run()
    run_dir = os.path.join(RUNS, str(k))
    with open(os.path.join(run_dir, "config.yaml"), "wb") as f:
        f.write(config_bytes)
    started = time.monotonic()
    summary = {"run": k, "status": "failed", "config": rel(os.path.join(run_dir, "config.yaml"))}
    settings = None
    with open(os.path.join(run_dir, "train.log"), "w", encoding="utf-8") as log_file:
        try:
            settings = load_config(config_path)
            summary.update(method=settings["method"], model=rel(settings["model"]), data=settings["data"])
            if len(argv) == 3 and sha256(settings["data"]) != argv[2]:
                raise ConfigError(f"{settings['data']} changed after it was validated; validate it again")
            rows, problems, duplicates, _ = rowformat.read(settings["data"])
            kinds = {kind for _, kind, _ in rows}
            if problems or duplicates or kinds != {settings["method"]}:
                raise ConfigError(f"{settings['data']} is not clean {settings['method']} data "
                                  f"({len(problems)} format errors, {len(duplicates)} duplicates, rows: "
                                  f"{sorted(kinds) or 'none'}); run data_validate on it")
            summary["rows"] = len(rows)
            summary.update(train(settings, run_dir, rows, log_file))
            summary["status"] = "ok"
            summary["checkpoint"] = rel(os.path.join(run_dir, "checkpoint"))
            if settings["export"]:
                tmp = FINAL + ".tmp"
                shutil.rmtree(tmp, ignore_errors=True)
                shutil.copytree(os.path.join(run_dir, "checkpoint"), tmp)
                shutil.rmtree(FINAL, ignore_errors=True)
                os.replace(tmp, FINAL)
                with open(EXPORTED, "w") as f:
                    f.write(f"{k}\n")
                summary["exported"] = "final_model"
        except ConfigError as err:
            summary["error"] = str(err)
        except Exception as err:  # noqa: BLE001 - the run's record says why; the agent sees the trace
            traceback.print_exc(file=log_file)
            traceback.print_exc()
            summary["error"] = f"{type(err).__name__}: {err}"
    summary["seconds"] = round(time.monotonic() - started, 1)
    with open(os.path.join(run_dir, "result.json"), "w") as f:
        json.dump(summary, f, indent=1)
    shown = {key: value for key, value in (settings or {}).items() if key != "model"}
    lines = [f"## Iteration {k}: train run {k} ({summary.get('method', '?')})",
             f"- config: {summary['config']}" + (f" {json.dumps(shown, sort_keys=True)}" if shown else ""),
             f"- from: {summary.get('model', '?')}; data: {summary.get('data', '?')} ({summary.get('rows', '?')} rows)"]
    if summary["status"] == "ok":
        lines.append(f"- result: {summary['steps']} steps, train_loss {summary['train_loss']}, "
                     f"{summary['seconds']} s; checkpoint {summary['checkpoint']}"
                     + (", exported to final_model/" if summary.get("exported") else ""))
    else:
        lines.append(f"- FAILED: {summary['error']}")
    experiment_log.append("\n".join(lines))
    print(f"run {k}: {summary['status']}" + (f" ({summary['error']})" if "error" in summary else "")
          + f"; log runs/{k}/train.log, experiment_log.md updated")
    print("TRAIN_RESULT " + json.dumps(summary))
    return 0 if summary["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
