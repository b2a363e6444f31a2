"""SFT example units (`sft.example_unit`): one example per kept trajectory (`conversation`) or per teacher reply
(`request`: the exact request the loop sent plus that reply, only the reply trained), their resolution (`auto`),
their statistics and dataset card, `import-trajectories` with either unit, and what training trains on each."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_import_trajectories import mlgym_traj, write_run
from test_sft import lines, rollout, trajectory, write_shard

from gymforge.agent.sources import mlgym_messages, mlgym_reply_chats
from gymforge.agent.trajectory import reply_chats, requests_of, sft_messages
from gymforge.core.config import GymforgeConfig
from gymforge.core.prompts import render, templates_dir
from gymforge.core.records import Flag
from gymforge.stages.sft import build_sft, resolve_unit
from gymforge.stages.sft_export import dataset_card
from gymforge.student.tokenizer import build_tokenizer, count_chat_tokens, load_tokenizer
from gymforge.tools.import_trajectories import import_trajectories

TINY = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "head_dim": 16,
        "intermediate_size": 64}
ACTIONS = ["ls", "cat data/train.csv", "python train.py", "validate", "python train.py --epochs 3", "validate",
           "python train.py --lr 0.1", "submit"]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    return build_tokenizer("offline", tmp_path_factory.mktemp("tok") / "tokenizer", templates_dir(), [])


def cfg_for(root: Path, unit: str = "auto", max_length: int = 32768, **train: Any) -> GymforgeConfig:
    return GymforgeConfig.model_validate({
        "seed": 0, "results_dir": str(root), "sft": {"example_unit": unit},
        "train": {"max_length": max_length, "tiny": TINY, "batch_size": 2, "gradient_accumulation": 1, **train}})


def build(cfg: GymforgeConfig, shards: list[Path], tokenizer: Path) -> dict[str, Any]:
    sft = cfg.results / "sft"
    return build_sft(cfg, shards, tokenizer, jsonl_out=sft / "train.jsonl", dataset_out=sft / "dataset",
                     rollouts_out=sft / "rollouts.jsonl", stats_out=sft / "stats.json")


def long_trajectory(tag: str = "") -> Any:
    """Eight replies, observations of several lines: its conversation is several times one reply's length."""
    return trajectory(ACTIONS, tag=tag, observation="epoch 1 loss 0.52\nepoch 2 loss 0.41\nvalidation rmse 1.9")


# ---- what a request example is -----------------------------------------------------------------------------


def test_request_examples_are_the_requests_sent_plus_the_accepted_replies():
    traj = long_trajectory()
    # the third reply needed a format re-ask: its request is the re-ask, carrying the rejected reply
    traj.trajectory[2].format_errors = [{"response": "I will train now.", "error": "no command block"}]
    chats = reply_chats(traj)
    replies = [m["content"] for m in traj.history if m["role"] == "assistant"]
    assert [chat[-1] for chat in chats] == [{"role": "assistant", "content": r} for r in replies]
    sent = requests_of(traj)
    assert len(sent) == len(replies) + 1  # the rejected reply was asked for too, but is no example
    assert [chat[:-1] for chat in chats] == sent[:2] + sent[3:]
    rejected = chats[2][-3:-1]
    assert rejected == [{"role": "assistant", "content": "I will train now."},
                        {"role": "user", "content": render("agent_format_error", error="no command block").rstrip()}]
    # the history elides old observations per request, as the loop did: the last request is the conversation
    assert chats[-1] == sft_messages(traj)
    assert chats[1][3]["content"].startswith("epoch 1") and chats[-1][3]["content"] == "Old output omitted (4 lines)"


def test_mlgym_request_examples_are_what_mlgym_sent_at_each_real_reply():
    data = mlgym_traj([f"cmd{i}" for i in range(1, 9)], forced_exit="cost")
    chats = mlgym_reply_chats(data["history"])
    assert len(chats) == 8 and chats[-1] == mlgym_messages(data["history"])  # the forced exit is no reply
    assert [c[-1]["content"].rsplit("\n", 2)[-2] for c in chats] == [f"cmd{i}" for i in range(1, 9)]
    assert chats[3][3]["content"].startswith("out 1")  # 3 observations before reply 4: none elided yet
    assert chats[7][3]["content"] == "Old output omitted (3 lines)"


# ---- the unit, its statistics and the card -----------------------------------------------------------------


def test_auto_is_request_when_the_students_context_is_shorter_than_the_longest_kept_trajectory(
        tmp_path, tokenizer_dir):
    assert resolve_unit("auto", 100, 101) == "request" and resolve_unit("auto", 100, 100) == "conversation"
    assert resolve_unit("auto", 100, None) == "conversation"  # nothing kept
    assert resolve_unit("conversation", 10, 1000) == "conversation" and resolve_unit("request", 10**6, 5) == "request"
    short, long = trajectory(["ls", "submit"], tag="s"), long_trajectory("l")
    longest = count_chat_tokens(load_tokenizer(tokenizer_dir), sft_messages(long))
    # a flagged trajectory longer than the context is not kept: it does not make auto choose `request`
    flagged = long_trajectory("f" * 400)
    flagged.info.flags = [Flag(code="answers_path", detail="cat /answers/labels.csv")]
    shard = write_shard(tmp_path, "t0000", [rollout(short, 0), rollout(long, 1), rollout(flagged, 2)])
    for max_length, unit, rows in ((longest, "conversation", 2), (longest - 1, "request", 2 + len(ACTIONS))):
        stats = build(cfg_for(tmp_path / str(max_length), max_length=max_length), [shard], tokenizer_dir)
        assert stats["unit_choice"] == {"configured": "auto", "max_length": max_length, "longest_kept": longest,
                                        "rule": stats["unit_choice"]["rule"]}
        assert (stats["example_unit"], stats["examples"], stats["kept"]) == (unit, rows, 2)
        written = lines(tmp_path / str(max_length) / "sft" / "train.jsonl")
        assert len(written) == rows and {r["unit"] for r in written} == {unit}


def test_stats_and_card_count_examples_and_trained_tokens_per_unit(tmp_path, tokenizer_dir):
    import datasets

    trajs = [long_trajectory("a"), trajectory(["ls", "submit"], tag="b")]
    shard = write_shard(tmp_path, "t0000", [rollout(t, i) for i, t in enumerate(trajs)])
    tok = load_tokenizer(tokenizer_dir)
    max_length = count_chat_tokens(tok, sft_messages(trajs[0])) // 2
    both = {}
    for unit in ("conversation", "request"):
        stats = build(cfg_for(tmp_path / unit, unit, max_length), [shard], tokenizer_dir)
        both[unit] = stats
        assert stats["example_unit"] == unit and stats["unit_choice"]["configured"] == unit
        rows = lines(tmp_path / unit / "sft" / "train.jsonl")
        assert datasets.load_from_disk(str(tmp_path / unit / "sft" / "dataset")).to_list() == rows
        assert stats["examples"] == len(rows) == stats["units"][unit]["examples"]
        assert all(r["tokens"] == count_chat_tokens(tok, r["messages"]) for r in rows)
    # `request` counts both units (the conversation as when it is written); `conversation` only itself (the
    # requests cost O(turns^2) tokens to count)
    assert both["conversation"]["units"] == {"conversation": both["request"]["units"]["conversation"]}
    units = both["request"]["units"]
    replies = len(ACTIONS) + 2
    assert units["conversation"]["examples"] == 2 and units["request"]["examples"] == replies
    assert units["conversation"]["replies"] == units["request"]["replies"] == replies
    # cut at max_length keeping the start, the long conversation loses its later replies; no request loses one
    assert units["conversation"]["replies_trained"] < replies == units["request"]["replies_trained"]
    assert units["conversation"]["truncated"] == 1 and units["request"]["truncated"] >= 1
    assert units["conversation"]["trained_tokens"] < units["request"]["trained_tokens"]
    assert units["conversation"]["tokens"] == max_length + count_chat_tokens(tok, sft_messages(trajs[1]))
    rows = lines(tmp_path / "request" / "sft" / "train.jsonl")
    assert [(r["id"], r["reply"], r["turns"]) for r in rows[:2]] == [("t0000-r00000-q000", 0, 1),
                                                                    ("t0000-r00000-q001", 1, 2)]
    assert [r["messages"] for r in rows[: len(ACTIONS)]] == reply_chats(trajs[0])

    card = dataset_card(both["request"], {"t0000": None}, replies).content
    assert f"rows: {replies} examples, unit `request`" in card and "Train with the loss on the **last**" in card
    c, r = units["conversation"], units["request"]
    assert (f"| conversation | 2 | {c['tokens']} | {c['trained_tokens']} | {c['replies_trained']} of {replies} | 1 |"
            in card)
    assert (f"| request (this dataset) | {replies} | {r['tokens']} | {r['trained_tokens']} | {replies} of {replies} "
            f"| {r['truncated']} |" in card)
    old = {k: v for k, v in both["conversation"].items() if k not in ("example_unit", "units")}
    assert "unit `conversation`" in dataset_card(old, {}, 2).content  # stats from before example units


# ---- import-trajectories ----------------------------------------------------------------------------------


def test_import_trajectories_writes_either_unit(tmp_path, tokenizer_dir):
    runs = tmp_path / "runs"
    write_run(runs, 0, mlgym_traj(["ls", "python train.py", "validate", "submit"], tag="a"))
    write_run(runs, 1, mlgym_traj(["ls", "submit"], scores=[], tag="b"))  # never scored: no example in any unit
    write_run(runs, 2, mlgym_traj(["cat data.csv", "submit"], tag="c", forced_exit="cost"))
    cfg = cfg_for(tmp_path / "results")
    counts = {}
    for unit in ("conversation", "request"):
        stats = import_trajectories(cfg, [runs], tokenizer_dir, tmp_path / unit, unit=unit)
        rows = lines(tmp_path / unit / "train.jsonl")
        counts[unit] = len(rows)
        assert (stats["kept"], stats["discarded"], stats["example_unit"]) == (2, {"no_successful_submission": 1}, unit)
        assert {r["unit"] for r in rows} == {unit} and stats["examples"] == len(rows)
    assert counts == {"conversation": 2, "request": 6}
    rows = lines(tmp_path / "request" / "train.jsonl")
    data = json.loads(next(runs.glob("*run_0/taskA.traj")).read_text())
    assert [r["messages"] for r in rows[:4]] == mlgym_reply_chats(data["history"])
    assert rows[3]["messages"] == lines(tmp_path / "conversation" / "train.jsonl")[0]["messages"]
    assert json.loads(rows[0]["source"])["format"] == "mlgym" and rows[0]["id"].endswith("-q000")
    # the CLI's --unit overrides sft.example_unit
    config = Path(__file__).resolve().parents[2] / "config.yaml"
    proc = subprocess.run([sys.executable, "-m", "gymforge", "import-trajectories", "--config", str(config), str(runs),
                           "--out", str(tmp_path / "cli"), "--tokenizer", str(tokenizer_dir), "--unit", "request"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "kept 2 of 3 trajectories" in proc.stdout and "6 examples (unit request)" in proc.stdout


# ---- training: under `request` no kept reply is lost to the length cut ----------------------------------------


@pytest.fixture(scope="module")
def base_dir(tokenizer_dir, tmp_path_factory) -> Path:
    from gymforge.student.base import build_base

    return build_base(cfg_for(tmp_path_factory.mktemp("r")), tokenizer_dir, tmp_path_factory.mktemp("base") / "b")


def _trained(trainer: Any) -> list[tuple[int, str]]:
    """(tokens, labelled text) of each row the trainer trains on."""
    tok = trainer.processing_class
    out = []
    for item in trainer.train_dataset:
        ids, labels = item["input_ids"], item["labels"]
        assert all(lab in (-100, i) for i, lab in zip(ids, labels, strict=True))
        out.append((len(ids), tok.decode([i for i, lab in zip(ids, labels, strict=True) if lab != -100])))
    return out


@pytest.mark.parametrize("template", ["markers", "rendered"])
def test_no_kept_reply_is_lost_to_the_length_cut_under_request(template, tmp_path, tokenizer_dir, base_dir):
    """A trajectory whose conversation is twice `train.max_length`: as one conversation, training keeps its start
    and loses the later replies; as requests, every reply is trained, whole, once, and nothing else is."""
    from gymforge.stages import training

    tokenizer = tokenizer_dir
    if template == "rendered":  # a template without {% generation %} markers (SmolLM2's, Qwen3's): masks rendered
        from gymforge.student.masks import has_generation_markers

        tok = load_tokenizer(tokenizer_dir)
        tok.chat_template = tok.chat_template.replace("{% generation %}", "").replace("{% endgeneration %}", "")
        assert not has_generation_markers(tok.chat_template)
        tokenizer = tmp_path / "unmarked"
        tok.save_pretrained(str(tokenizer))
    traj = long_trajectory()
    replies = [m["content"] + "<|im_end|>" for m in traj.history if m["role"] == "assistant"]
    shard = write_shard(tmp_path, "t0000", [rollout(traj, 0)])
    max_length = count_chat_tokens(load_tokenizer(tokenizer), sft_messages(traj)) // 2
    trained: dict[str, list[tuple[int, str]]] = {}
    for unit in ("conversation", "request"):
        cfg = cfg_for(tmp_path / unit, unit if unit == "conversation" else "auto", max_length)
        stats = build(cfg, [shard], tokenizer)
        assert stats["example_unit"] == unit  # auto: the conversation is longer than the student's context
        dataset = training.load_sft_dataset(tmp_path / unit / "sft" / "dataset")
        trainer = training.build_trainer(cfg, dataset, str(base_dir), tokenizer, tmp_path / unit / "work")
        trained[unit] = _trained(trainer)
        # the statistics count exactly what training trains on
        tokens = [len(item["input_ids"]) for item in trainer.train_dataset]
        labelled = sum(lab != -100 for item in trainer.train_dataset for lab in item["labels"])
        assert (stats["units"][unit]["tokens"], stats["units"][unit]["trained_tokens"]) == (sum(tokens), labelled)

    [(length, text)] = trained["conversation"]
    assert length == max_length
    kept = [r for r in replies if r in text]
    assert replies[0] in text and replies[-1] not in text and len(kept) < len(replies) // 2 + 1
    assert len(trained["request"]) == len(replies)
    assert [text for _, text in trained["request"]] == replies  # each reply alone, whole, with its end of turn
    assert all(n <= max_length for n, _ in trained["request"])
    assert max(n for n, _ in trained["request"]) == max_length  # the later requests lost their start
