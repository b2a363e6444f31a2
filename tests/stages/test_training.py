"""The student base (tiny Qwen3), SFT with TRL (assistant-only loss, truncation, LoRA, atomic output) and the
multi-GPU launch command. Every fixture is built here, in tmp folders: a tokenizer trained on a few strings,
a dozen chat examples with one fixed reply format."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gymforge.student import base as student
from gymforge.stages import training
from gymforge.core.config import GymforgeConfig, ModelSpec
from gymforge.student.tokenizer import train_offline_tokenizer
from workflow_copy import copy_workflow

SYSTEM = "You are a research agent. Answer with a DISCUSSION and one command."
TASKS = ["predict house prices", "classify iris flowers", "cluster wine samples", "detect spam emails",
         "forecast monthly sales", "segment customers", "rank search results", "tag parts of speech",
         "recognise digits", "denoise images", "score essays", "recommend movies"]
REPLY = "DISCUSSION\nFirst I look at the files.\n```\nls -la data/\n```"
TINY = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16,
        "intermediate_size": 128}


def make_cfg(serving: dict[str, Any] | None = None, **train: Any) -> GymforgeConfig:
    base = {"tiny": TINY, "learning_rate": 5e-3, "epochs": 1.0, "batch_size": 4, "gradient_accumulation": 1,
            "warmup_ratio": 0.05, "max_length": 256, "logging_steps": 1}
    return GymforgeConfig.model_validate({"seed": 0, "train": base | train,
                                          "evaluate": {"serving": serving or {}}})


def user(task: str) -> str:
    return f"Task: {task}. Solve it."


def example(task: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user(task)},
            {"role": "assistant", "content": REPLY}]


def save_dataset(rows: list[list[dict[str, str]]], path: Path, tokens: list[int] | None = None) -> Path:
    import datasets

    data = {"messages": rows, "id": [f"ex{i}" for i in range(len(rows))]}
    if tokens is not None:
        data["tokens"] = tokens
    datasets.Dataset.from_dict(data).save_to_disk(str(path))
    return path


@pytest.fixture(scope="module")
def fixture_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tokenizer/, base/ (tiny random Qwen3) and dataset/ (12 examples), shared by the module."""
    root = tmp_path_factory.mktemp("student")
    texts = [SYSTEM, REPLY, REPLY, *(user(t) for t in TASKS), "the quick brown fox jumps over the lazy dog"]
    train_offline_tokenizer(texts, vocab_size=400).save_pretrained(str(root / "tokenizer"))
    student.build_base(make_cfg(), root / "tokenizer", root / "base")
    save_dataset([example(t) for t in TASKS], root / "dataset")
    return root


def _state(path: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


# ---- the base student ---------------------------------------------------------------------------------


def test_base_is_a_seeded_tiny_qwen3(fixture_dir: Path, tmp_path: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    base = fixture_dir / "base"
    tok = AutoTokenizer.from_pretrained(str(base))
    config = AutoConfig.from_pretrained(str(base))
    assert config.model_type == "qwen3" and config.architectures == ["Qwen3ForCausalLM"]
    assert config.vocab_size == len(tok) and config.tie_word_embeddings
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads,
            config.head_dim, config.intermediate_size) == (64, 2, 4, 2, 16, 128)
    assert config.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>") == tok.eos_token_id
    assert config.pad_token_id == tok.convert_tokens_to_ids("<|endoftext|>")
    assert "{% generation %}" in tok.chat_template  # saved with the training-ready template
    model = AutoModelForCausalLM.from_pretrained(str(base))
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    marker = json.loads((base / student.MARKER).read_text())
    assert marker["seed"] == 0 and marker["parameters"] == sum(p.numel() for p in model.parameters())

    again = student.build_base(make_cfg(), fixture_dir / "tokenizer", tmp_path / "again")
    other = student.build_base(make_cfg(seed=1), fixture_dir / "tokenizer", tmp_path / "other")
    first, second, third = _state(base), _state(again), _state(other)
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    assert not torch.equal(first["model.embed_tokens.weight"], third["model.embed_tokens.weight"])


def test_base_of_offline_and_production(tmp_path: Path) -> None:
    assert student.base_of(make_cfg(), tmp_path) == str(tmp_path / "student" / "base")
    prod = make_cfg(student="Qwen/Qwen3-4B")
    # a hub id is loaded from the folder rule prefetch_model fetched it to, unless train.prefetch is off
    assert student.base_of(prod, tmp_path) == str(prod.cache / "models" / "Qwen--Qwen3-4B")
    assert student.base_of(prod.model_copy(update={"train": prod.train.model_copy(update={"prefetch": False})}),
                           tmp_path) == "Qwen/Qwen3-4B"
    with pytest.raises(ValueError, match="needs no base build"):
        student.build_base(prod, tmp_path / "tok", tmp_path / "base")
    assert not (tmp_path / "base").exists()


# ---- what the trainer trains on ---------------------------------------------------------------------


def _labelled_text(trainer: Any, row: int) -> tuple[list[int], list[int], str]:
    item = trainer.train_dataset[row]
    ids, labels = item["input_ids"], item["labels"]
    tok = trainer.processing_class
    kept = [i for i, lab in zip(ids, labels, strict=True) if lab != -100]
    # labels are the ids or masked, never shifted
    assert all(lab in (-100, i) for i, lab in zip(ids, labels, strict=True))
    return ids, labels, tok.decode(kept, skip_special_tokens=False)


def test_loss_mask_covers_exactly_the_assistant_turns(fixture_dir: Path, tmp_path: Path) -> None:
    turns = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user("score essays")},
             {"role": "assistant", "content": "DISCUSSION\nLook first.\n```\nls\n```"},
             {"role": "user", "content": "Observation: data/ train.csv"},
             {"role": "assistant", "content": REPLY}]
    ds = training.load_sft_dataset(save_dataset([turns], tmp_path / "ds"))
    trainer = training.build_trainer(make_cfg(), ds, str(fixture_dir / "base"), fixture_dir / "tokenizer",
                                     tmp_path / "work")
    ids, labels, text = _labelled_text(trainer, 0)
    assert text == "DISCUSSION\nLook first.\n```\nls\n```<|im_end|>" + REPLY + "<|im_end|>"
    tok = trainer.processing_class
    assert ids == tok.apply_chat_template(turns, tokenize=True, return_dict=False)
    # two contiguous labelled spans, one per assistant turn, each ending with the end-of-turn token
    starts = [i for i in range(len(labels)) if labels[i] != -100 and (i == 0 or labels[i - 1] == -100)]
    assert len(starts) == 2
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert sum(lab == im_end for lab in labels) == 2


def test_qwen3_template_without_markers_is_masked_from_its_rendering(fixture_dir: Path, tmp_path: Path) -> None:
    """A production Qwen3 tokenizer has no generation markers: the mask comes from its own rendering."""
    from trl.chat_template_utils import qwen3_chat_template

    from gymforge.student.tokenizer import load_tokenizer

    tok = load_tokenizer(fixture_dir / "tokenizer")
    tok.chat_template = qwen3_chat_template  # byte-identical to Qwen/Qwen3-*'s
    tok.save_pretrained(str(tmp_path / "qwen3tok"))
    assert training.check_chat_template(tok, "Qwen/Qwen3-4B") == "rendered"
    ds = training.load_sft_dataset(save_dataset([example("score essays")], tmp_path / "ds"))
    trainer = training.build_trainer(make_cfg(student="Qwen/Qwen3-4B"), ds, str(fixture_dir / "base"),
                                     tmp_path / "qwen3tok", tmp_path / "work")
    _, _, text = _labelled_text(trainer, 0)
    # the empty think block Qwen3 renders for the last turn is the model's to write; the newline after the
    # end-of-turn token is not
    assert text == "<think>\n\n</think>\n\n" + REPLY + "<|im_end|>"
    assert not trainer.args.assistant_only_loss  # TRL swaps in no template of its own: the masks are in the data

    tok.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    with pytest.raises(training.TrainingError, match="no generation prompt"):
        training.check_chat_template(tok, "some/model")


def test_truncation_at_max_length(fixture_dir: Path, tmp_path: Path) -> None:
    long_reply = [{"role": "user", "content": "go"}, {"role": "assistant", "content": REPLY * 8}]
    long_prompt = [{"role": "user", "content": "the quick brown fox " * 40}, {"role": "assistant", "content": REPLY}]
    short = [{"role": "user", "content": "go"}, {"role": "assistant", "content": "ls -la"}]
    ds = training.load_sft_dataset(save_dataset([long_reply, long_prompt, short], tmp_path / "ds"))
    trainer = training.build_trainer(make_cfg(max_length=48), ds, str(fixture_dir / "base"),
                                     fixture_dir / "tokenizer", tmp_path / "work")
    tok = trainer.processing_class
    full = len(tok.apply_chat_template(long_reply, tokenize=True, return_dict=False))
    assert full > 48
    lengths = [len(r["input_ids"]) for r in trainer.train_dataset]
    # the long reply is cut to its first 48 tokens; the long prompt leaves no assistant token and is dropped
    assert len(trainer.train_dataset) == 2 and max(lengths) == 48
    first = trainer.train_dataset[0]
    assert first["input_ids"] == tok.apply_chat_template(long_reply, tokenize=True, return_dict=False)[:48]
    assert len(tok.apply_chat_template(short, tokenize=True, return_dict=False)) in lengths
    # only prompts longer than max_length: nothing left to learn from, said plainly
    only_long = training.load_sft_dataset(save_dataset([long_prompt], tmp_path / "long"))
    with pytest.raises(training.TrainingError, match="raise train.max_length"):
        training.build_trainer(make_cfg(max_length=48), only_long, str(fixture_dir / "base"),
                               fixture_dir / "tokenizer", tmp_path / "work2")


def _token_loss(model: Any, batch: dict[str, Any]) -> Any:
    """Mean next-token cross-entropy over the labelled tokens of a collated batch (the model's own forward)."""
    import torch

    inputs = {k: v for k, v in batch.items() if k != "labels"}
    logits = model(**inputs, use_cache=False).logits[:, :-1].float()  # as TRL calls it: a cache hides the packing
    labels = batch["labels"][:, 1:]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1),
                                             ignore_index=-100)


@pytest.mark.parametrize("student", ["offline", "Qwen/Qwen3-4B"])
def test_packing_keeps_the_masks_and_the_loss(fixture_dir: Path, tmp_path: Path, student: str) -> None:
    """train.packing: examples packed padding-free keep their labels (the template's markers, or the masks computed
    from Qwen3's rendering) and give the padded batch's loss: attention stays within each example."""
    import torch
    from transformers import AutoModelForCausalLM
    from trl.chat_template_utils import qwen3_chat_template

    from gymforge.student.tokenizer import load_tokenizer

    tokenizer = fixture_dir / "tokenizer"
    if student != "offline":
        tok = load_tokenizer(tokenizer)
        tok.chat_template = qwen3_chat_template  # no generation markers: masks from the rendering
        tok.save_pretrained(str(tmp_path / "qwen3tok"))
        tokenizer = tmp_path / "qwen3tok"
    two_turns = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user("score essays")},
                 {"role": "assistant", "content": "DISCUSSION\nLook first.\n```\nls\n```"},
                 {"role": "user", "content": "Observation: data/ train.csv"}, {"role": "assistant", "content": REPLY}]
    rows = [example(t) for t in TASKS[:5]] + [two_turns, [{"role": "user", "content": "go"},
                                                          {"role": "assistant", "content": "ls -la"}]]
    ds = training.load_sft_dataset(save_dataset(rows, tmp_path / "ds"))
    padded = training.build_trainer(make_cfg(student=student, max_length=512), ds, str(fixture_dir / "base"),
                                    tokenizer, tmp_path / "padded")
    packed = training.build_trainer(make_cfg(student=student, max_length=512, packing=True), ds,
                                    str(fixture_dir / "base"), tokenizer, tmp_path / "packed")
    assert packed.args.padding_free and packed.args.packing and not padded.args.packing
    assert training.examples_trained(packed.train_dataset) == len(padded.train_dataset) == len(rows)
    assert len(packed.train_dataset) < len(rows)  # several examples to a row

    def examples(trainer: Any) -> list[tuple[list[int], list[int]]]:
        out = []
        for item in trainer.train_dataset:
            ids, labels, start = item["input_ids"], item["labels"], 0
            for n in item.get("seq_lengths", [len(ids)]):
                out.append((ids[start:start + n], labels[start:start + n]))
                start += n
        return sorted(out)

    assert examples(packed) == examples(padded)  # the same tokens, the same labels: the masks survive packing

    model = AutoModelForCausalLM.from_pretrained(str(fixture_dir / "base"), dtype=torch.float32).eval()
    padded_batch = padded.data_collator([padded.train_dataset[i] for i in range(len(rows))])
    packed_batch = packed.data_collator([packed.train_dataset[i] for i in range(len(packed.train_dataset))])
    assert "attention_mask" in padded_batch and (padded_batch["attention_mask"] == 0).any()  # padding paid for
    assert "attention_mask" not in packed_batch and packed_batch["input_ids"].shape[0] == 1  # one padding-free row
    with torch.no_grad():
        assert _token_loss(model, packed_batch).item() == pytest.approx(_token_loss(model, padded_batch).item(),
                                                                         rel=1e-5)


def test_liger_needs_its_package_and_a_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(training, "liger_available", lambda: False)
    with pytest.raises(training.TrainingError, match="liger-kernel"):
        training.sft_config(make_cfg(liger=True), tmp_path, "fp32")
    monkeypatch.setattr(training, "liger_available", lambda: True)
    assert training.sft_config(make_cfg(liger=True), tmp_path, "fp32").use_liger_kernel


def test_bad_inputs_fail_clearly(fixture_dir: Path, tmp_path: Path) -> None:
    import datasets

    from gymforge.stages.sft import _features

    features = _features()  # what the SFT stage writes when no trajectory was kept
    datasets.Dataset.from_dict({k: [] for k in features}, features=features).save_to_disk(str(tmp_path / "empty"))
    with pytest.raises(training.TrainingError, match="empty"):
        training.train_student(make_cfg(), tmp_path / "empty", fixture_dir / "base", fixture_dir / "tokenizer",
                       tmp_path / "out")
    assert not (tmp_path / "out").exists() and not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())
    assert training.resolve_precision("auto") in ("fp32", "bf16")
    import torch

    if not torch.cuda.is_available():
        assert training.resolve_precision("auto") == "fp32"
        with pytest.raises(training.TrainingError, match="fp16"):
            training.resolve_precision("fp16")


# ---- training on CPU: the LM head on the trained tokens only, the job's threads ----------------------------


def _head_run(model: Any, batch: dict[str, Any]) -> tuple[Any, dict[str, Any], int]:
    """The fused forward and backward of TRL's trainer (`fused_lm_head=True`): its output, the gradients, and the
    FLOPs of the matmuls that ran."""
    from torch.utils.flop_counter import FlopCounterMode

    model.zero_grad(set_to_none=True)
    with FlopCounterMode(display=False) as flops:
        out = model(**batch, fused_lm_head=True)
        out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters()}, flops.get_total_flops()


def test_cpu_lm_head_projects_only_the_trained_positions(fixture_dir: Path, tmp_path: Path) -> None:
    """On CPU, TRL's fused LM head projects every position (on CUDA only the labelled ones); the trainer's projects
    only the labelled ones, with the same loss, per-token outputs and gradients as TRL's own head."""
    import torch
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    from gymforge.student.cpu_training import compact_lm_head

    turns = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user("score essays") * 6},
             {"role": "assistant", "content": "DISCUSSION\nLook first.\n```\nls\n```"},
             {"role": "user", "content": "Observation: data/ train.csv " * 8}, {"role": "assistant", "content": REPLY}]
    ds = training.load_sft_dataset(save_dataset([turns], tmp_path / "ds"))
    trainer = training.build_trainer(make_cfg(), ds, str(fixture_dir / "base"), fixture_dir / "tokenizer",
                                     tmp_path / "work")
    assert trainer.args.device.type == "cpu" and trainer.model.forward._gymforge_compact
    assert not compact_lm_head(trainer.model)  # installed once
    batch = trainer.data_collator([trainer.train_dataset[0]])
    labels = batch["labels"][:, 1:]
    trained, positions = int((labels != -100).sum()), labels.numel()
    assert 0 < trained < positions // 3

    reference = AutoModelForCausalLM.from_pretrained(str(fixture_dir / "base"), dtype=torch.float32)
    add_fused_lm_head(reference, outputs=("log_probs", "entropy", "is_top1"))  # what SFTTrainer installs
    trainer.model.load_state_dict(reference.state_dict())
    ours, our_grads, our_flops = _head_run(trainer.model, batch)
    theirs, their_grads, their_flops = _head_run(reference, batch)
    torch.testing.assert_close(ours.loss, theirs.loss)
    assert torch.equal(ours.label_mask, theirs.label_mask)
    torch.testing.assert_close(ours.log_probs, theirs.log_probs)
    torch.testing.assert_close(ours.entropy, theirs.entropy, rtol=1e-4, atol=1e-5)
    assert torch.equal(ours.is_top1, theirs.is_top1)
    assert our_grads.keys() == their_grads.keys()
    for name, grad in our_grads.items():
        torch.testing.assert_close(grad, their_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    # the untrained positions are not projected (hidden x vocabulary); the counter sees at least TRL's forward
    # projection of them (it misses TRL's in-place gradient matmuls)
    config = reference.config
    projection = 2 * config.hidden_size * config.vocab_size
    assert their_flops - our_flops >= projection * (positions - trained), (their_flops, our_flops)

    # a batch without any trained token still gives a finite zero loss connected to the model
    batch["labels"][:] = -100
    empty, _, _ = _head_run(trainer.model, batch)
    assert empty.loss.item() == 0.0 and not empty.label_mask.any()


def test_cpu_lm_head_in_chunks_matches_one_pass(fixture_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A vocabulary too large for one pass is projected in token chunks recomputed in the backward: same result."""
    import torch

    from gymforge.student import cpu_training

    torch.manual_seed(0)
    hidden = torch.randn(37, 16, requires_grad=True)
    weight = torch.randn(50, 16, requires_grad=True)
    target = torch.randint(0, 50, (37,))
    results = []
    for elements in (1 << 25, 50 * 8):  # one pass; chunks of 8 tokens
        monkeypatch.setattr(cpu_training, "LOGITS_ELEMENTS", elements)
        hidden.grad = weight.grad = None
        picked, entropy, top1 = cpu_training.labelled_log_probs(hidden, weight, None, target)
        (-picked.sum()).backward()
        results.append((picked.detach(), entropy, top1, hidden.grad.clone(), weight.grad.clone()))
    for one, chunked in zip(*results, strict=True):
        torch.testing.assert_close(one, chunked)


def test_cpu_threads_are_the_jobs_cores(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import torch

    from gymforge.runtime import cpus as cpu_training
    from gymforge.runtime.cpus import cpu_threads
    from gymforge.student.cpu_training import set_cpu_threads

    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # what Snakemake exports for a job of 3 threads
    assert cpu_threads() == 3 and cpu_threads(processes=2) == 3
    monkeypatch.delenv("OMP_NUM_THREADS")
    cpus = len(os.sched_getaffinity(0))  # not os.cpu_count(): taskset, SLURM and containers restrict it
    quota = cpu_training.cpu_quota()
    assert cpu_threads() == min(cpus, quota or cpus) and cpu_threads(processes=cpus + 1) == 1
    # a container's CPU quota (cgroup v2 cpu.max), rounded up
    for text, cpus_allowed in (("150000 100000\n", 2), ("max 100000\n", None), ("garbage", None)):
        (tmp_path / "cpu.max").write_text(text)
        assert cpu_training.cpu_quota(tmp_path / "cpu.max") == cpus_allowed
    (tmp_path / "cpu.max").write_text("100000 100000")  # one CPU's worth
    monkeypatch.setattr(cpu_training, "CPU_MAX", tmp_path / "cpu.max")
    assert cpu_threads() == 1
    before = torch.get_num_threads()
    try:
        assert set_cpu_threads(1) == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_training_process_sets_passive_openmp_before_torch_loads() -> None:
    """`train_student` asks for OpenMP threads that sleep at barriers (on a shared 2-core machine spinning ones made
    training 2-4x slower than 1 thread); GNU OpenMP reads the policy once, when torch loads it, so nothing on the way
    from the CLI to `train_student` may import torch, and an explicit policy is kept."""
    import subprocess

    from gymforge.student.cpu_training import prepare_cpu_process

    code = ("import os, sys; import gymforge.cli; from gymforge.stages import training; "
            "assert 'torch' not in sys.modules, 'torch imported before train_student starts'; "
            "applied = training.prepare_cpu_process(); import torch; print(applied, os.environ['OMP_WAIT_POLICY'])")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    for preset, expected in ((None, "True PASSIVE"), ("ACTIVE", "True ACTIVE")):
        run_env = env if preset is None else {**env, "OMP_WAIT_POLICY": preset}
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=run_env, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.split() == expected.split()
    import torch  # noqa: F401  (loaded: from now on the policy is fixed, so nothing changes)

    assert prepare_cpu_process() is False


# ---- training -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(fixture_dir: Path) -> tuple[Path, training.TrainReport]:
    out = fixture_dir / "checkpoints" / "tiny-qwen3"
    report = training.train_student(make_cfg(epochs=30.0), fixture_dir / "dataset", fixture_dir / "base",
                            fixture_dir / "tokenizer", out)
    return out, report


@pytest.mark.slow
def test_sft_lowers_the_loss_and_writes_a_complete_checkpoint(trained: tuple[Path, training.TrainReport]) -> None:
    out, report = trained
    assert report.steps == 90 and report.examples == report.examples_trained == 12  # 30 epochs x 3 batches
    assert report.first_loss and report.final_loss and report.final_loss < 0.25 * report.first_loss
    assert report.train_tokens > 0 and report.tokens_per_s > 0 and report.peak_memory_mb > 0
    assert report.precision == "fp32" and report.device == "cpu" and not report.lora
    assert report.chat_template == "tokenizer" and report.config["epochs"] == 30.0
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "chat_template.jinja",
            "metrics.jsonl", "loss.png", "train_report.json"} <= names
    assert not any(n.endswith((".bin", ".pt")) or n.startswith(("checkpoint-", "_")) for n in names)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 91))
    assert {"step", "epoch", "loss", "learning_rate", "grad_norm", "tokens"} <= rows[0].keys()
    assert rows[-1]["tokens"] == report.train_tokens and rows[0]["loss"] == report.first_loss
    assert (out / "loss.png").read_bytes()[:4] == b"\x89PNG"
    saved = training.TrainReport.model_validate_json((out / "train_report.json").read_text())
    assert saved.steps == report.steps and saved.total_s >= saved.wall_s
    assert not any(p.name.endswith(".tmp") for p in out.parent.iterdir())


@pytest.mark.slow
def test_the_fine_tuned_model_answers_in_the_trained_format(fixture_dir: Path,
                                                            trained: tuple[Path, training.TrainReport]) -> None:
    """SFT demonstrably changes the model: served, it answers an unseen task like the training replies."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gymforge.llm.serving import open_endpoint

    out, _ = trained
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user("predict ozone levels")}]
    cfg = make_cfg(serving={"backend": "transformers", "max_new_tokens": 48, "startup_timeout_s": 180})
    with open_endpoint(cfg, ModelSpec(name="student-sft", source="student-sft"), checkpoint=str(out),
                       served_name="student-sft-test") as endpoint:
        client = endpoint.openai_client(max_retries=0, timeout=120)
        reply = client.chat.completions.create(model=endpoint.model, messages=messages, temperature=0, max_tokens=40)
        pid = endpoint.pid
    assert reply.choices[0].message.content.startswith("DISCUSSION\nFirst I look at the files.")
    assert reply.choices[0].finish_reason == "stop"  # it learnt to end its turn
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)

    # the untrained base, asked the same, does not
    tok = AutoTokenizer.from_pretrained(str(fixture_dir / "base"))
    base = AutoModelForCausalLM.from_pretrained(str(fixture_dir / "base"))
    ids = torch.tensor([tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)])
    gen = base.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False)
    assert not tok.decode(gen[0, ids.shape[1]:], skip_special_tokens=True).startswith("DISCUSSION")


@pytest.mark.slow
def test_lora_trains_and_saves_a_merged_model(fixture_dir: Path, tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    cfg = make_cfg(epochs=2.0, learning_rate=1e-2, lora={"enabled": True, "r": 4, "alpha": 8, "dropout": 0.0})
    report = training.train_student(cfg, fixture_dir / "dataset", fixture_dir / "base", fixture_dir / "tokenizer",
                            tmp_path / "lora")
    assert report.lora and report.steps == 6
    names = {p.name for p in (tmp_path / "lora").iterdir()}
    assert "model.safetensors" in names and not any("adapter" in n for n in names)
    state = _state(tmp_path / "lora")
    assert not any("lora" in k for k in state)
    base = _state(fixture_dir / "base")
    assert state.keys() == base.keys()
    changed = [k for k in state if "q_proj" in k and not torch.equal(state[k], base[k])]
    assert changed  # the adapters were merged into the weights
    assert torch.equal(state["model.embed_tokens.weight"], base["model.embed_tokens.weight"])  # not a target
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "lora"))
    assert type(model).__name__ == "Qwen3ForCausalLM"


@pytest.mark.slow
def test_a_failed_run_leaves_no_checkpoint(fixture_dir: Path, tmp_path: Path) -> None:
    from transformers import TrainerCallback

    class Boom(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                raise RuntimeError("killed mid-training")

    out = tmp_path / "checkpoints" / "tiny-qwen3"
    stale = out.parent / f".{out.name}.tmp"
    stale.mkdir(parents=True)
    (stale / "config.json").write_text("{}")  # a previous killed run's leftovers
    with pytest.raises(RuntimeError, match="killed mid-training"):
        training.train_student(make_cfg(epochs=2.0), fixture_dir / "dataset", fixture_dir / "base",
                       fixture_dir / "tokenizer", out, callbacks=[Boom()])
    assert list(out.parent.iterdir()) == []  # neither the checkpoint nor a temp folder


# ---- launching ------------------------------------------------------------------------------------------


ARGV = ["--config", "c.yaml", "--dataset", "results/sft/dataset", "--base", "results/student/base",
        "--tokenizer", "results/student/tokenizer", "--out", "results/checkpoints/tiny-qwen3"]


@pytest.mark.parametrize("gpus", [0, 1])
def test_launch_command_single_process(gpus: int) -> None:
    assert training.launch_command(make_cfg(gpus=gpus), ARGV) == [sys.executable, "-m", "gymforge", "train-student", *ARGV]


@pytest.mark.parametrize("strategy, distributed", [("ddp", "MULTI_GPU"), ("fsdp", "FSDP"),
                                                   ("deepspeed", "DEEPSPEED")])
def test_launch_command_multi_gpu(strategy: str, distributed: str) -> None:
    from accelerate.commands.config.config_args import load_config_from_file

    cmd = training.launch_command(make_cfg(gpus=4, strategy=strategy), ARGV)
    assert Path(cmd[0]).name == "accelerate" and cmd[1] == "launch"
    config_file = Path(cmd[cmd.index("--config_file") + 1])
    assert config_file.name == f"{strategy}.yaml" and config_file.parent.parts[-2:] == ("runtime", "accelerate")
    assert cmd[cmd.index("--num_processes") + 1] == "4"
    assert cmd[cmd.index("-m") + 1:] == ["gymforge", "train-student", *ARGV]
    raw = yaml.safe_load(config_file.read_text())
    assert raw["distributed_type"] == distributed and raw["mixed_precision"] == "no"
    if strategy == "fsdp":
        fsdp = raw["fsdp_config"]
        assert fsdp["fsdp_transformer_layer_cls_to_wrap"] == "Qwen3DecoderLayer"
        assert fsdp["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP" and fsdp["fsdp_reshard_after_forward"]
        assert fsdp["fsdp_state_dict_type"] == "FULL_STATE_DICT"
    if strategy == "deepspeed":
        assert raw["deepspeed_config"]["zero_stage"] == 3 and raw["deepspeed_config"]["zero3_save_16bit_model"]
    parsed = load_config_from_file(str(config_file))  # accelerate's own loader accepts it
    assert str(parsed.distributed_type).endswith(distributed)


def test_default_profile_gives_training_every_core(tmp_path: Path) -> None:
    # Snakemake exports OMP_NUM_THREADS = the job's threads (1 unless declared): torch would train on one core.
    import subprocess

    copy_workflow(tmp_path, "rules", "report", "profiles")
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--profile", "profiles/default", "--cores", "2",
                           "checkpoints"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    job = proc.stdout.split("rule train_student:", 1)[1].split("\n\n", 1)[0]
    assert "threads: 2" in job, job
