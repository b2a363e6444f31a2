"""The sharded RL update (issue #24): two CPU processes on gloo give the single-process update's parameters; the
launch command per strategy; the update's memory figures and the refusal of plans that cannot fit."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gymforge.core.config import GymforgeConfig
from gymforge.core.tokens import Sampled
from gymforge.rl import grpo, sharded
from gymforge.rl.memory import QWEN3, fitting_plan, shape_of, update_memory

TINY = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16,
        "intermediate_size": 128}
UPDATE = {"epochs": 2, "minibatches": 3, "clip_eps": 0.2, "kl_coef": 0.1, "max_grad_norm": 5.0, "temperature": 0.7}
LR = 1e-3


def make_cfg(**rl: Any) -> GymforgeConfig:
    return GymforgeConfig.model_validate({"seed": 0, "train": {"tiny": TINY}, "rl": {
        "learning_rate": LR, "threads": 1, "max_length": 256, **rl}})


# ---- the launch command -----------------------------------------------------------------------------


def test_launch_command_per_strategy(tmp_path: Path) -> None:
    job = tmp_path / "job.json"
    one = sharded.launch_command(make_cfg(gpus=1), job)
    assert one == [sys.executable, "-m", "gymforge.rl.sharded", str(job)]
    assert sharded.launch_command(make_cfg(gpus=0), job) == one  # CPU: one plain process

    fsdp = sharded.launch_command(make_cfg(gpus=8, strategy="fsdp"), job, port=29555)
    assert Path(fsdp[0]).name == "accelerate" and fsdp[1] == "launch"
    assert Path(fsdp[fsdp.index("--config_file") + 1]).name == "fsdp.yaml"
    assert Path(fsdp[fsdp.index("--config_file") + 1]).is_file()
    assert fsdp[fsdp.index("--num_processes") + 1] == "8" and fsdp[fsdp.index("--main_process_port") + 1] == "29555"
    assert "--gradient_clipping" not in fsdp
    assert fsdp[-3:] == ["-m", "gymforge.rl.sharded", str(job)]

    ds = sharded.launch_command(make_cfg(gpus=4, strategy="deepspeed", max_grad_norm=0.5), job)
    assert Path(ds[ds.index("--config_file") + 1]).name == "deepspeed.yaml"
    assert ds[ds.index("--num_processes") + 1] == "4" and "--main_process_port" not in ds
    assert ds[ds.index("--gradient_clipping") + 1] == "0.5"  # DeepSpeed clips inside its step
    assert ds[ds.index("--gradient_accumulation_steps") + 1] == "1"
    assert ds[-3:] == ["-m", "gymforge.rl.sharded", str(job)]

    ddp = sharded.launch_command(make_cfg(gpus=2, strategy="ddp"), job)
    assert Path(ddp[ddp.index("--config_file") + 1]).name == "ddp.yaml"


def test_config_strategy_defaults_and_resume_view() -> None:
    cfg = GymforgeConfig()
    assert cfg.rl.strategy == "fsdp" and cfg.rl.gradient_checkpointing is False
    other = make_cfg(gpus=8, strategy="deepspeed", gradient_checkpointing=True)
    # how the update is spread over devices changes nothing it computes: a run resumes on other GPUs
    assert make_cfg().rerun_view()["rl"] == other.rerun_view()["rl"]


# ---- the plan ---------------------------------------------------------------------------------------


def test_minibatch_plan_is_grpo_updates_order() -> None:
    """grpo.update shuffles once per epoch and cuts ceil(n / minibatches) samples per step; so does the plan."""
    import torch

    class Probe(torch.nn.Module):  # a policy that records which sample each forward pass saw
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.device = torch.device("cpu")
            self.seen: list[int] = []

        def forward(self, input_ids: Any, **kwargs: Any) -> Any:  # logits_to_keep: every position (start 0)
            self.seen.append(int(input_ids[0, 0]))
            return type("Out", (), {"logits": self.w.expand(1, input_ids.shape[1], 8)})()

    probe = Probe()
    samples = [grpo.ActionSample(request=[], response="", duration_s=0, episode=0, input_ids=[i, 0, 1],
                                 mask=[0, 1, 1], ref_logprobs=torch.zeros(2)) for i in range(7)]
    grpo.update(probe, torch.optim.SGD(probe.parameters(), lr=0.0), samples, epochs=2, minibatches=3, clip_eps=0.2,
                kl_coef=0.0, max_grad_norm=1.0, rng=random.Random(5))
    plan = sharded.minibatch_plan(7, epochs=2, minibatches=3, rng=random.Random(5))
    assert [len(b) for b in plan] == [3, 3, 1, 3, 3, 1]
    assert [i for batch in plan for i in batch] == probe.seen


def test_deal_balances_tokens_and_covers_every_sample() -> None:
    lengths = [100, 10, 60, 50, 5, 40]
    shares = sharded.deal(range(6), lengths, 2)
    assert sorted(i for share in shares for i in share) == list(range(6))
    loads = [sum(lengths[i] for i in share) for share in shares]
    assert loads == [140, 125]  # longest first to the lighter rank: 100+40 vs 60+50+10+5
    assert sharded.deal([3], lengths, 2) == [[3], []]  # a rank may get nothing: it runs padding passes
    assert sharded.deal(range(6), lengths, 2) == shares  # deterministic: every rank computes the same split


# ---- sharded == single process ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def student(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen3 (tied embeddings) with the offline tokenizer, as in test_rl."""
    from gymforge.student import base as student_base
    from gymforge.student.tokenizer import train_offline_tokenizer

    root = tmp_path_factory.mktemp("rl-sharded-student")
    texts = ["You are an agent.", "Task: predict prices.", "DISCUSSION\nlook\n```\nls\n```", "validate", "submit",
             "python baseline.py", "the quick brown fox jumps over the lazy dog"]
    train_offline_tokenizer(texts, vocab_size=400).save_pretrained(str(root / "tokenizer"))
    student_base.build_base(make_cfg(), root / "tokenizer", root / "sft")
    return root / "sft"


REPLIES = ["DISCUSSION\nlook\n```\nls\n```", "DISCUSSION\nrun it\n```\npython baseline.py\n```", "no command here",
           "DISCUSSION\nthe quick brown fox\n```\nvalidate\n```", "DISCUSSION\ndone\n```\nsubmit\n```"]


def make_samples(tokenizer: Any) -> list[grpo.ActionSample]:
    """Six samples of uneven lengths, advantages of both signs and duration weights, in five chains (`grpo.chains`):
    the second is the first episode's next reply, its sampled ids after the first sample's (the last minibatch of
    the plan holds one chain: one rank gets nothing to do but padding passes)."""
    template = grpo.training_template(tokenizer, "offline")
    durations = [0.0, 16.0, 0.1, 3.0, 7.5]
    advantages = [1.2, -0.7, 0.4, -1.5, 0.9]
    weights = grpo.duration_weights(durations, enabled=True, floor_s=1.0, max_weight=5.0)
    samples = []
    for k, reply in enumerate(REPLIES):
        request = [{"role": "system", "content": "You are an agent."},
                   {"role": "user", "content": "Task: predict prices. " + "data " * (5 * k)}]
        s = grpo.ActionSample(request=request, response=reply, duration_s=durations[k], episode=k,
                              advantage=advantages[k], weight=weights[k])
        samples.append(s)
    samples = sharded.tokenize_samples(samples, tokenizer, max_length=256, template=template)
    first = samples[0]
    observation = tokenizer("look: data.csv", add_special_tokens=False)["input_ids"]
    reply = tokenizer("DISCUSSION\nrun it\n```\npython baseline.py\n```", add_special_tokens=False)["input_ids"]
    nxt = grpo.ActionSample(request=[], response="", duration_s=16.0, episode=first.episode, advantage=-0.3,
                            weight=2.0, sampled=Sampled(prompt_ids=[*first.input_ids, *observation], ids=reply,
                                                        logprobs=[-1.0] * len(reply)))
    return [first, *sharded.tokenize_samples([nxt], tokenizer, max_length=256, template=template), *samples[1:]]


def single_process_update(policy_dir: Path, reference_dir: Path, tokenizer: Any, samples: list[grpo.ActionSample],
                          settings: dict[str, Any], seed: int = 11) -> tuple[Any, Any, dict]:
    """Today's one-device update (stages/rl.py's calls of grpo.prepare and grpo.update), in this process."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1)
    reference = AutoModelForCausalLM.from_pretrained(str(reference_dir), dtype=torch.float32).eval()
    reference.requires_grad_(False)
    policy = AutoModelForCausalLM.from_pretrained(str(policy_dir), dtype=torch.float32).eval()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=LR, weight_decay=0.0)
    if (policy_dir / sharded.OPTIMIZER).exists():
        optimizer.load_state_dict(torch.load(policy_dir / sharded.OPTIMIZER, weights_only=True))
    single_step = settings["epochs"] == 1 and settings["minibatches"] == 1
    prepared = grpo.prepare(samples, tokenizer, policy, reference, max_length=256,
                            template=grpo.training_template(tokenizer, "offline"), temperature=settings["temperature"],
                            single_step=single_step)
    assert len(prepared) == len(samples)
    stats = grpo.update(policy, optimizer, prepared, rng=random.Random(seed), **settings)
    return policy, optimizer, stats


def sharded_update(tmp: Path, samples: list[Any], *, policy_dir: Path, reference_dir: Path, strategy: str,
                   settings: dict[str, Any], seed: int = 11, accelerate: bool = False,
                   gradient_checkpointing: bool = False) -> tuple[Path, dict[str, Any], float]:
    """The workers' update on two CPU processes (gloo): started by torchrun (the environment accelerate launch gives
    its processes; quicker) or, with `accelerate`, by the stage's own command (`sharded.launch_command`)."""
    dest = tmp / "iter_next"
    job = sharded.write_job(tmp / "update", samples, policy=policy_dir, reference=reference_dir, dest=dest,
                            tokenizer_files=reference_dir, strategy=strategy, learning_rate=LR,
                            single_step=settings["epochs"] == 1 and settings["minibatches"] == 1, update_seed=seed,
                            torch_seed=1, threads=1, gradient_checkpointing=gradient_checkpointing, **settings)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    port = sharded._free_port()
    t0 = time.monotonic()
    if accelerate:
        scratch = tmp / "tmpdir"  # the launch's temporary directory: left empty (no torchelastic_* log folders)
        scratch.mkdir()
        proc = subprocess.run(sharded.launch_command(make_cfg(gpus=2, strategy=strategy), job, port=port),
                              env={**env, "TMPDIR": str(scratch)}, capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
        assert list(scratch.iterdir()) == [], "the launch left files in the temporary directory"
    else:  # the two ranks with the variables torchrun sets (no launcher process: quicker)
        group = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs = [subprocess.Popen([sys.executable, "-m", "gymforge.rl.sharded", str(job)],
                                  env={**env, **group, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for r in range(2)]
        outs = [p.communicate(timeout=240)[0] for p in procs]
        assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-4000:] for o in outs)
    elapsed = time.monotonic() - t0
    return dest, sharded.json.loads((tmp / "update" / "stats.json").read_text()), elapsed


def compare(dest: Path, policy: Any, start_dir: Path) -> tuple[float, float]:
    """(max |sharded - single|, max |single - start|) over the parameters."""
    import torch
    from transformers import AutoModelForCausalLM

    updated = AutoModelForCausalLM.from_pretrained(str(dest), dtype=torch.float32)
    start = AutoModelForCausalLM.from_pretrained(str(start_dir), dtype=torch.float32)
    want, before = dict(policy.named_parameters()), dict(start.named_parameters())
    diff = moved = 0.0
    with torch.no_grad():
        for name, p in updated.named_parameters():
            diff = max(diff, float((p - want[name]).abs().max()))
            moved = max(moved, float((want[name] - before[name]).abs().max()))
    return diff, moved


@pytest.mark.slow  # 15-27 s on the shared 2-core machine (two processes importing torch and transformers)
def test_two_gloo_processes_match_the_single_process_update(student: Path, tmp_path: Path) -> None:
    """FSDP2 over 2 processes, 2 epochs x 3 minibatches (6 AdamW steps; minibatches of 2 and 1 samples: uneven
    shards and a rank with padding passes only), sampling log-probs taken separately, clipping on some steps."""
    import torch
    from transformers import AutoTokenizer

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(str(student))
    samples = make_samples(tokenizer)
    assert [len(c) for c in grpo.chains(samples)] == [2, 1, 1, 1, 1]
    policy, optimizer, want = single_process_update(student, student, tokenizer, samples, UPDATE)
    dest, got, elapsed = sharded_update(tmp_path, samples, policy_dir=student, reference_dir=student,
                                        strategy="fsdp", settings=UPDATE)
    assert got["world_size"] == 2 and got["samples"] == 6 and got["optimizer_steps"] == want["optimizer_steps"] == 6
    # one pass per chain on both sides: the first sample is read within the second's pass
    assert got["update_tokens"] == want["update_tokens"] == 2 * sum(len(s.input_ids) for s in samples[1:])
    for key in ("loss", "kl", "clipped", "mismatch_abs_logprob"):
        assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), key
    diff, moved = compare(dest, policy, student)
    assert diff < 1e-5, diff
    assert moved > 1e-3  # the update did move the weights (6 AdamW steps at lr 1e-3)
    assert (dest / "tokenizer_config.json").exists()  # a servable checkpoint, as the one-device update writes
    # the optimizer state in the single-process format: a run may resume with another number of GPUs
    saved = torch.load(dest / sharded.OPTIMIZER, weights_only=True)
    single = optimizer.state_dict()
    assert saved["state"].keys() == single["state"].keys()
    assert [g["params"] for g in saved["param_groups"]] == [g["params"] for g in single["param_groups"]]
    for i, st in single["state"].items():  # unclipped steps: a gradient off by a constant factor shows here
        assert torch.allclose(saved["state"][i]["exp_avg"], st["exp_avg"], atol=1e-6)
        assert torch.allclose(saved["state"][i]["exp_avg_sq"], st["exp_avg_sq"], atol=1e-8)
    print(f"fsdp update on 2 gloo processes: {elapsed:.1f}s, max parameter difference {diff:.2e} "
          f"(max change {moved:.2e})")


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
def test_sharded_update_resumes_a_single_process_checkpoint(student: Path, tmp_path: Path, strategy: str) -> None:
    """The second iteration, launched by the stage's command (`accelerate launch` with the strategy's config, here
    on 2 CPU processes): the workers load the one-device update's checkpoint and optimizer.pt, and take one step
    (one epoch, one minibatch: the sampling log-probs are the update's own forward), with gradient checkpointing,
    as one device would without it."""
    import torch
    from transformers import AutoTokenizer

    from gymforge.stages.rl import _save_checkpoint

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(str(student))
    first, optimizer, _ = single_process_update(student, student, tokenizer, make_samples(tokenizer), UPDATE)
    iter1 = tmp_path / "iter_0001"
    _save_checkpoint(first, optimizer, student, iter1)
    one_step = {**UPDATE, "epochs": 1, "minibatches": 1}
    samples = make_samples(tokenizer)
    for s, a in zip(samples, [-0.3, 0.6, 1.1, 0.8, -1.2, 0.5], strict=True):
        s.advantage = a
    policy, _, want = single_process_update(iter1, student, tokenizer, samples, one_step, seed=12)
    dest, got, elapsed = sharded_update(tmp_path, samples, policy_dir=iter1, reference_dir=student,
                                        strategy=strategy, settings=one_step, seed=12, accelerate=True,
                                        gradient_checkpointing=True)
    assert got["optimizer_resumed"] and got["optimizer_steps"] == 1
    assert got["kl"] == pytest.approx(want["kl"], rel=1e-4, abs=1e-7) and want["kl"] > 0
    diff, moved = compare(dest, policy, iter1)
    assert diff < 1e-5 and moved > 1e-4, (diff, moved)
    print(f"{strategy} resumed update on 2 gloo processes: {elapsed:.1f}s, max parameter difference {diff:.2e} "
          f"(max change {moved:.2e})")


@pytest.mark.slow
def test_train_rl_with_gpus_hands_the_update_to_the_workers(student: Path, tmp_path: Path, monkeypatch) -> None:
    """`rl.gpus > 1`: run_rl tokenizes, writes the job, runs the workers' command and serves what they wrote; the curve
    and the final weights are those of the one-device run (the workers here: one process, `launch_command`
    replaced, since this machine has no GPUs; the sharding itself is tested above)."""
    import torch
    from transformers import AutoModelForCausalLM

    from gymforge.stages.rl import run_rl
    from test_rl import fake_episode, fake_tasks

    launched: list[list[str]] = []

    def one_process(cfg: Any, job: Path, *, port: int | None = None) -> list[str]:
        launched.append([str(cfg.rl.gpus), cfg.rl.strategy])
        return [sys.executable, "-m", "gymforge.rl.sharded", str(job)]

    def collect(policy_dir: Path, iteration: int, plans: list[Any]) -> list[Any]:
        return [(p, fake_episode(p.seed, k % 2 == 0), 1.0) for k, p in enumerate(plans)]

    curves = {}
    for gpus in (0, 2):
        monkeypatch.setattr(sharded, "launch_command", one_process)
        cfg = make_cfg(gpus=gpus, iterations=2, group_size=4, tasks_per_iteration=1, minibatches=2)
        out = tmp_path / f"gpus{gpus}"
        curves[gpus] = run_rl(cfg, student, fake_tasks(tmp_path / "task"), out / "checkpoint", out / "curve.json",
                              collect=collect)
    assert launched == [["2", "fsdp"], ["2", "fsdp"]]  # one worker launch per iteration, only with gpus > 1
    assert (tmp_path / "gpus2" / ".work" / "update" / "job.json").exists()
    for a, b in zip(curves[0]["iterations"], curves[2]["iterations"], strict=True):
        assert (a["mean_reward"], a["samples"], a["optimizer_steps"]) == (b["mean_reward"], b["samples"],
                                                                          b["optimizer_steps"])
        assert b["kl"] == pytest.approx(a["kl"], rel=1e-3, abs=1e-7)
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-3, abs=1e-6)
    assert curves[2]["iterations"][1]["kl"] > 0
    one = AutoModelForCausalLM.from_pretrained(str(tmp_path / "gpus0" / "checkpoint"), dtype=torch.float32)
    two = AutoModelForCausalLM.from_pretrained(str(tmp_path / "gpus2" / "checkpoint"), dtype=torch.float32)
    with torch.no_grad():
        for (name, p), q in zip(one.named_parameters(), two.parameters(), strict=True):
            assert torch.allclose(p, q, atol=1e-5, rtol=0), name
    assert not (tmp_path / "gpus2" / "checkpoint" / sharded.OPTIMIZER).exists()


# ---- memory -----------------------------------------------------------------------------------------


def gib(student: str, **kw: Any) -> Any:
    settings = {"gpus": 8, "strategy": "fsdp", "gradient_checkpointing": True, "max_length": 32768,
                "max_new_tokens": 4096, **kw}
    return update_memory(shape_of(student, None), **settings)


def test_update_memory_of_qwen3_4b_and_8b() -> None:
    """docs/rl.md's table: 16 bytes per parameter sharded over the GPUs; the reference freed before the update."""
    m8 = gib("Qwen/Qwen3-8B")
    assert m8.states == pytest.approx(16 * 8.19e9 / 8 / 2**30) and m8.reference == 0
    assert m8.fits and 45 < m8.total < 55
    assert gib("Qwen/Qwen3-4B").fits and gib("Qwen/Qwen3-4B").total < m8.total
    one = gib("Qwen/Qwen3-8B", gpus=1)
    assert not one.fits and one.states == pytest.approx(16 * 8.19e9 / 2**30)
    assert one.reference == pytest.approx(2 * 8.19e9 / 2**30)  # one device keeps the reference beside the policy
    assert one.logits == m8.logits  # the reply's positions only, on every path
    assert not gib("Qwen/Qwen3-8B", gradient_checkpointing=False).fits  # 36 layers of 32k-token activations
    assert not gib("Qwen/Qwen3-8B", strategy="ddp").fits  # a whole copy per GPU
    assert not gib("Qwen/Qwen3-8B", gpus=2).fits and gib("Qwen/Qwen3-8B", gpus=4).fits
    assert fitting_plan(QWEN3["8b"], max_length=32768, max_new_tokens=4096).gpus == 3  # ~75 GiB
    assert fitting_plan(QWEN3["4b"], max_length=32768, max_new_tokens=4096).gpus == 2
    assert shape_of("offline", None) is None and not shape_of("some/Model-7B", 7e9).known


# Peak GPU memory allocated by one-sample updates of Qwen3-0.6B on one H200, Adam moments allocated (bench/gpu_check.py,
# 2026-11-27, docs/training.md): tokens -> GiB
MEASURED_0_6B = {2048: 13.93, 4096: 18.33, 8192: 27.13, 16384: 44.76}


def test_the_one_device_estimate_covers_the_measured_update_and_no_more_than_needed() -> None:
    for tokens, measured in MEASURED_0_6B.items():
        m = update_memory(QWEN3["0.6b"], gpus=1, strategy="ddp", gradient_checkpointing=False, max_length=tokens,
                          max_new_tokens=256)
        allocated = m.total - m.overhead  # the overhead is the CUDA context and slack, outside what torch allocates
        assert measured <= allocated <= measured + 1.5, tokens


def test_one_device_gradient_checkpointing_keeps_one_hidden_state_per_layer() -> None:
    """rl.gradient_checkpointing on one device (`update_models`): fp32 hidden states per layer plus one layer's
    autocast activations; 4B at 8,192 tokens fits an 80 GB GPU only so."""
    def one(checkpointing: bool) -> Any:
        return update_memory(QWEN3["4b"], gpus=1, strategy="ddp", gradient_checkpointing=checkpointing,
                             max_length=8192, max_new_tokens=1024)

    on, off = one(True), one(False)
    assert on.gradient_checkpointing and not off.gradient_checkpointing and "gradient checkpointing" in on.note
    assert on.activations == pytest.approx((8192 * 2560 * 4 * 36 + 80 * 8192 * 2560) / 2**30)
    assert on.fits and not off.fits and on.states == off.states and on.reference == off.reference


def test_update_models_checkpoints_the_policy_only(student: Path) -> None:
    from gymforge.stages.rl import update_models

    base = student
    reference, policy, _ = update_models(base, base, 1e-6, gradient_checkpointing=True)
    assert policy.is_gradient_checkpointing and not reference.is_gradient_checkpointing
    assert not update_models(base, base, 1e-6)[1].is_gradient_checkpointing


def test_estimate_checks_the_rl_update_memory() -> None:
    from gymforge.core.config import load_config
    from gymforge.tools.estimate import estimate, render

    paper = load_config(Path(__file__).resolve().parents[2] / "configs" / "paper-scale.yaml")
    assert (paper.rl.gpus, paper.rl.strategy, paper.rl.gradient_checkpointing) == (8, "fsdp", True)
    report = estimate(paper)
    assert report["rl_memory"]["fits"] and report["warnings"] == []
    assert "rl update memory per GPU (fsdp over 8 GPUs, gradient checkpointing)" in render(report)
    one = paper.model_copy(update={"rl": paper.rl.model_copy(update={"gpus": 1})})
    report = estimate(one)
    assert not report["rl_memory"]["fits"]
    text = render(report)
    assert "WARNING: rl: the update of Qwen/Qwen3-4B needs" in text and "rl.gpus: 2 (or more)" in text
    assert estimate(make_cfg())["rl_memory"] is None  # the offline student on CPU: nothing to check


def test_train_rl_refuses_a_plan_that_cannot_fit(monkeypatch) -> None:
    import torch

    from gymforge.stages.rl import check_update_memory

    cfg = GymforgeConfig.model_validate({"train": {"student": "Qwen/Qwen3-8B"},
                                         "rl": {"gpus": 1, "max_length": 32768, "max_new_tokens": 4096}})
    check_update_memory(cfg)  # no GPU here: nothing to check
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: type("P", (), {"total_memory": 80 * 2**30}))
    with pytest.raises(RuntimeError, match=r"needs ~\d+ GiB per GPU with one device.*rl.gpus: 3 \(or more\)"):
        check_update_memory(cfg)
    fits = cfg.model_copy(update={"rl": cfg.rl.model_copy(update={"gpus": 8, "gradient_checkpointing": True})})
    check_update_memory(fits)
