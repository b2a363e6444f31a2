"""`gymforge export-tokens DIR`: the replies of served models as token-level RL data (issue #41).

A checkpoint gymforge serves (the RL policy, a student on the benchmark) answers with its token ids and log-probs, and
its trajectories keep them (`gymforge.core.tokens`). This export turns every such reply into one row:

- `prompt_ids`: the exact prompt the server saw (the request after the agent loop's elisions, chat template applied);
- `completion_ids`: the reply's ids as sampled (the end-of-turn token included when it ended on one);
- `logprobs`: each completion token's log-prob under the sampler (the behaviour policy), aligned with
  `completion_ids`;
- `env_mask`: 1 for every completion token (all of them are the policy's own; an episode's observations are in the
  next row's prompt, never in a completion);

the keys TRL's `GRPOTrainer(rollout_func=...)` returns per sample (`prompt_ids`, `completion_ids`, `logprobs`, and
`env_mask` for the tokens the loss covers). verl's names for the same arrays are `prompts`, `responses`,
`rollout_log_probs` and `response_mask` (its `input_ids` is `prompt_ids + completion_ids`). Beside them: `source`
(`rl` or `benchmark`), `model`, `task`, `episode`, `reply` (its index in the episode, in the order the requests were
sent), `rejected` (a malformed reply the loop asked again for), and for RL episodes `iteration`, `reward` and
`advantage` (the group-relative one of the update; null when its group was dropped or for benchmark runs).

Replies recorded without ids (the teacher, an external API, trajectories from before #41) are not exported: their text
is not the model's tokens, which is also why the SFT export stays text (TRL's conversational format).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from gymforge.agent.trajectory import is_model_turn, read_trajectory
from gymforge.core import atomic
from gymforge.core.config import config_or_defaults
from gymforge.rl.grpo import action_samples

COLUMNS = ("source", "model", "task", "episode", "reply", "rejected", "iteration", "reward", "advantage",
           "prompt_ids", "completion_ids", "logprobs", "env_mask")


def _rl_scores(work: Path) -> dict[str, dict[str, Any]]:
    """episode id -> its iteration, reward and advantage (the rows `train_rl` keeps per iteration)."""
    scores: dict[str, dict[str, Any]] = {}
    for path in sorted((work / "episodes").glob("iteration_*.json")):
        iteration = int(path.stem.split("_")[1])
        for e in json.loads(path.read_text()):
            scores[e["episode_id"]] = {"iteration": iteration, "reward": e.get("reward"),
                                       "advantage": e.get("advantage")}
    return scores


def _rows(traj_file: Path, base: dict[str, Any]) -> Iterator[dict[str, Any]]:
    traj = read_trajectory(traj_file)
    samples = action_samples(traj, 0)
    # a reply is rejected when the step lists it among its format errors; each step's accepted reply comes last
    accepted: set[int] = set()
    index = 0
    for step in traj.trajectory:
        model_turn = is_model_turn(step)
        index += len(step.format_errors)
        if model_turn:
            accepted.add(index)
            index += 1
    for k, s in enumerate(samples):
        if s.sampled is None:
            continue
        yield {**base, "model": base.get("model") or traj.meta.get("model"),
               "task": base.get("task") or traj.meta.get("task_id"), "reply": k, "rejected": k not in accepted,
               "prompt_ids": s.sampled.prompt_ids, "completion_ids": s.sampled.ids, "logprobs": s.sampled.logprobs,
               "env_mask": [1] * len(s.sampled.ids)}


def token_rows(results: Path) -> Iterator[dict[str, Any]]:
    """Every reply with sampled tokens under `results`: RL episodes (`rl/<student>/.work/trajectories/`), then the
    benchmark runs of served models (`scores/runs/`)."""
    for work in sorted(Path(results).glob("rl/*/.work")):
        scores = _rl_scores(work)
        for traj_file in sorted(work.glob("trajectories/*/*.traj")):
            episode = traj_file.parent.name
            score = scores.get(episode, {})
            yield from _rows(traj_file, {"source": "rl", "model": f"{work.parent.name}-rl", "task": None,
                                         "episode": episode, "iteration": score.get("iteration"),
                                         "reward": score.get("reward"), "advantage": score.get("advantage")})
    for traj_file in sorted(Path(results).glob("scores/runs/**/*.traj")):
        yield from _rows(traj_file, {"source": "benchmark", "model": None, "task": None,
                                     "episode": traj_file.parent.name, "iteration": None, "reward": None,
                                     "advantage": None})


CARD = """---
tags: [gymforge, reinforcement-learning, agents, token-level]
---

# gymforge token-level rollouts

{rows} replies of served models ({sources}), each with the exact token ids the model saw and produced and the
sampler's log-prob of each produced token, so that an RL update trains on what the policy generated (no
re-tokenization of text). Models: {models}.

| column | meaning | TRL (`rollout_func` output) | verl (`DataProto` key) |
|---|---|---|---|
| `prompt_ids` | the prompt as the server tokenized it (chat template applied) | `prompt_ids` | `prompts` |
| `completion_ids` | the reply's sampled ids | `completion_ids` | `responses` |
| `logprobs` | the sampler's log-prob of each reply token | `logprobs` | `rollout_log_probs` |
| `env_mask` | 1 on every reply token (the policy's own) | `env_mask` | `response_mask` |

`reward` and `advantage` are the RL update's (group-relative advantage; null for benchmark runs and dropped
groups); `rejected` marks a malformed reply the agent loop asked again for. Written by `gymforge export-tokens`
(module `gymforge.tools.export_tokens`).
"""


def export_tokens(results: Path, out: Path) -> dict[str, Any]:
    """Write `out/data/train-00000-of-00001.parquet`, `out/stats.json` and `out/README.md`; returns the stats."""
    import datasets

    rows = list(token_rows(results))
    columns = {c: [r.get(c) for r in rows] for c in COLUMNS}
    features = datasets.Features({
        "source": datasets.Value("string"), "model": datasets.Value("string"), "task": datasets.Value("string"),
        "episode": datasets.Value("string"), "reply": datasets.Value("int32"), "rejected": datasets.Value("bool"),
        "iteration": datasets.Value("int32"), "reward": datasets.Value("float64"),
        "advantage": datasets.Value("float64"), "prompt_ids": datasets.Sequence(datasets.Value("int32")),
        "completion_ids": datasets.Sequence(datasets.Value("int32")),
        "logprobs": datasets.Sequence(datasets.Value("float32")), "env_mask": datasets.Sequence(datasets.Value("int8")),
    })
    ds = datasets.Dataset.from_dict(columns, features=features)
    stats = {"rows": len(rows), "by_source": {s: sum(1 for r in rows if r["source"] == s) for s in ("rl", "benchmark")},
             "models": sorted({r["model"] for r in rows if r["model"]}),
             "completion_tokens": sum(len(r["completion_ids"]) for r in rows)}
    with atomic.directory(Path(out)) as tmp:
        (tmp / "data").mkdir()
        ds.to_parquet(str(tmp / "data" / "train-00000-of-00001.parquet"))
        atomic.write_json(tmp / "stats.json", stats)
        sources = ", ".join(f"{n} from {s}" for s, n in stats["by_source"].items() if n) or "none"
        (tmp / "README.md").write_text(CARD.format(rows=len(rows), sources=sources,
                                                   models=", ".join(stats["models"]) or "none"))
    return stats


def main(args: Any) -> None:
    """`gymforge export-tokens DIR [--results R]`."""
    results = Path(args.results) if args.results else config_or_defaults(args.config).results
    stats = export_tokens(results, Path(args.dir))
    print(f"{args.dir}: {stats['rows']} replies with their token ids and log-probs ({stats['by_source']}); "
          f"datasets.load_dataset({str(args.dir)!r})")
