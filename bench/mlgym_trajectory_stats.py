"""The agent-loop constants of `gymforge estimate`, drawn from MLGym's released frontier-model runs.

    MLGYM_ROOT=<checkout> .venv/bin/python bench/mlgym_trajectory_stats.py [--root DIR] [--json]

Reads every `<task>.traj` under `$MLGYM_ROOT/trajectories/mlgym_bench_v0/` (13 models x 13 tasks x 4 runs in the
release; files that are missing or not JSON are counted and skipped) and prints, per model and pooled, what one
run of the agent loop costs: steps, API calls, prompt and completion tokens per call, execution seconds per
step, the length of the conversation, and the hidden reasoning tokens of the models whose counts include them.
The last block is the `mlgym` entries of `src/gymforge/tools/estimate_constants.yaml` (`--json`: only that
block, as JSON; tests/tools/test_estimate.py compares it with the stored table when MLGYM_ROOT is set).

How each constant is drawn (pooled sums over the runs that made at least one API call, so a mean is a mean per
call or per step, not a mean of per-run ratios):

- steps per run: `len(trajectory)`; calls per step: `model_stats.api_calls` / steps; prompt tokens per call:
  `model_stats.tokens_sent` / calls.
- visible completion tokens per call: `tokens_received` / calls, over the models whose `tokens_received` counts only
  the text they wrote. MLGym's counts come from the serving gateway: for some models they include hidden
  reasoning. A model counts as "visible only" when its replies hold at least `VISIBLE_MIN_CHARS` characters per
  received token (plain BPE text runs 3 to 4.5; the o-series models run about 0.2 and Gemini 2.5 Pro and
  Claude 3.7 Sonnet, thinking, about 1.6-1.9).
- reasoning tokens per visible completion token: over OpenAI's o-series runs (o1, o3-mini), billed the same way
  as a GPT-5-class teacher: visible tokens = reply characters / the characters per token of GPT-4o's replies
  (the same tokenizer family), hidden = `tokens_received` - visible. The estimate multiplies visible completion
  tokens by this ratio, so it is taken per visible token of an agent-loop call of the pooled length above: a
  call then carries the o-series' measured hidden tokens per call (their own replies are shorter, so the ratio on
  them alone is larger; the script prints both).
- execution seconds per step: mean `execution_time` of the steps (MLGym's runs had a GPU per task).
- conversation tokens of a kept run (the SFT example): the characters of `history` / the pooled characters per
  token of the visible-only models' replies, over the runs that ended with a scored submission and are no
  longer than `KEPT_MAX_TOKENS` (configs/paper-scale.yaml's `filter.max_tokens`); request tokens of a kept run:
  its `tokens_sent` plus visible completion tokens (each request example holds what that call sent, then the
  reply); replies per kept run: its API calls.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

VISIBLE_MIN_CHARS = 2.5  # characters of reply per received token below which the count includes hidden tokens
OPENAI_REASONING = ("gpt-o1", "gpt-o3-mini")  # the o-series models of the release
OPENAI_TOKENIZER_TWIN = "gpt4o2"  # GPT-4o: the same tokenizer family as the o-series
KEPT_MAX_TOKENS = 48000  # configs/paper-scale.yaml filter.max_tokens


@dataclass
class Run:
    model: str
    steps: int
    calls: int
    sent: int
    received: int
    reply_chars: int
    history_chars: int
    exec_s: float
    scored: bool


@dataclass
class Model:
    runs: list[Run] = field(default_factory=list)

    def total(self, attr: str) -> float:
        return sum(getattr(r, attr) for r in self.runs)

    @property
    def chars_per_token(self) -> float:
        received = self.total("received")
        return self.total("reply_chars") / received if received else float("nan")


def model_of(folder: str) -> str:
    """`metagen-gpt-o1__rlMetaMazeMisc__default__...` -> `gpt-o1`."""
    name = folder.split("__", 1)[0]
    return name.removeprefix("metagen-")


def read_runs(root: Path) -> tuple[list[Run], int, int]:
    """(runs with at least one API call, runs without one, unreadable files)."""
    runs, idle, unreadable = [], 0, 0
    for path in sorted(root.rglob("*.traj")):
        try:
            data = json.loads(path.read_text())
            stats = data["info"]["model_stats"]
            steps = [s for s in data.get("trajectory") or [] if isinstance(s, dict)]
        except (OSError, ValueError, KeyError, TypeError):
            unreadable += 1
            continue
        if not stats.get("api_calls"):
            idle += 1
            continue
        runs.append(Run(
            model=model_of(path.parent.name), steps=len(steps), calls=int(stats["api_calls"]),
            sent=int(stats["tokens_sent"]), received=int(stats["tokens_received"]),
            reply_chars=sum(len(s.get("response") or "") for s in steps),
            history_chars=sum(len(h.get("content") or "") for h in data.get("history") or [] if isinstance(h, dict)),
            exec_s=sum(float(s.get("execution_time") or 0.0) for s in steps),
            scored=bool(data["info"].get("score"))))
    return runs, idle, unreadable


def constants(runs: list[Run]) -> tuple[dict[str, dict[str, object]], dict[str, Model]]:
    models: dict[str, Model] = {}
    for r in runs:
        models.setdefault(r.model, Model()).runs.append(r)
    pooled = Model(runs)
    visible = Model([r for m in models.values() if m.chars_per_token >= VISIBLE_MIN_CHARS for r in m.runs])
    visible_names = sorted(k for k, m in models.items() if m.chars_per_token >= VISIBLE_MIN_CHARS)
    steps, calls = pooled.total("steps"), pooled.total("calls")
    cpt = visible.chars_per_token  # characters per token of written text, pooled

    reasoning = Model([r for k in OPENAI_REASONING for r in models.get(k, Model()).runs])
    twin_cpt = models[OPENAI_TOKENIZER_TWIN].chars_per_token if OPENAI_TOKENIZER_TWIN in models else cpt
    shown = reasoning.total("reply_chars") / twin_cpt
    hidden = reasoning.total("received") - shown

    def conversation_tokens(r: Run) -> float:
        return r.history_chars / cpt

    kept = [r for r in runs if r.scored and conversation_tokens(r) <= KEPT_MAX_TOKENS]
    visible_per_call = visible.total("received") / visible.total("calls")
    hidden_per_call = hidden / reasoning.total("calls")
    kept_tokens = [conversation_tokens(r) for r in kept]
    request_tokens = sum(r.sent + r.calls * visible_per_call for r in kept)
    n, nm = len(runs), len(models)
    where = f"MLGym's released runs ({n} runs of {nm} models with an API call)"
    out = {
        "rollout_steps": (steps / n, f"{steps:,} steps / {n} runs; {where}; MLGym's max_steps 50, median "
                          f"{statistics.median(r.steps for r in runs):g}"),
        "rollout_calls_per_step": (calls / steps, f"{calls:,} API calls / {steps:,} steps"),
        "rollout_prompt_per_call": (pooled.total("sent") / calls, f"{pooled.total('sent'):,} tokens sent / "
                                    f"{calls:,} calls"),
        "rollout_completion_per_call": (visible_per_call, f"{visible.total('received'):,} / "
                                        f"{visible.total('calls'):,} calls of the {len(visible_names)} models whose "
                                        f"counts hold only visible text ({', '.join(visible_names)})"),
        "reasoning_per_completion": (hidden_per_call / visible_per_call,
                                     f"OpenAI's o-series ({', '.join(OPENAI_REASONING)}) wrote {hidden_per_call:,.0f} "
                                     f"hidden tokens per agent-loop call ({reasoning.total('calls'):,} calls, "
                                     f"{reasoning.total('received'):,} tokens received, {shown:,.0f} of them visible at "
                                     f"GPT-4o's {twin_cpt:.2f} chars/token), per visible token of a call of "
                                     f"rollout_completion_per_call ({visible_per_call:.1f}); on their own short replies "
                                     f"{hidden / shown:.1f}"),
        "rollout_exec_s_per_step": (pooled.total("exec_s") / steps, f"{pooled.total('exec_s'):,.0f} s execution / "
                                    f"{steps:,} steps (MLGym tasks, one GPU each)"),
        "kept_tokens_mean": (statistics.fmean(kept_tokens), f"mean conversation tokens of the {len(kept)} runs with a "
                             f"scored submission and <= {KEPT_MAX_TOKENS:,} tokens (median "
                             f"{statistics.median(kept_tokens):,.0f}; history characters / {cpt:.2f} chars per token "
                             f"of the visible-only replies; the student's tokenizer differs)"),
        "kept_tokens_max": (max(kept_tokens), f"the longest of those {len(kept)} runs"),
        "request_tokens_per_kept": (request_tokens / len(kept), f"tokens sent plus visible replies of the {len(kept)} "
                                    f"kept runs, per run: each request example holds what its call sent"),
        "replies_per_kept": (sum(r.calls for r in kept) / len(kept), f"API calls of the {len(kept)} kept runs, "
                             "per run"),
    }
    return {k: {"value": round(v, 4), "source": "mlgym", "note": note} for k, (v, note) in out.items()}, models


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", help="the trajectories folder (default $MLGYM_ROOT/trajectories/mlgym_bench_v0)")
    parser.add_argument("--json", action="store_true", help="print only the constants, as JSON")
    args = parser.parse_args(argv)
    if args.root:
        root = Path(args.root)
    elif os.environ.get("MLGYM_ROOT"):
        root = Path(os.environ["MLGYM_ROOT"]) / "trajectories" / "mlgym_bench_v0"
    else:
        parser.error("set MLGYM_ROOT to an MLGym checkout or pass --root")
    if not root.is_dir():
        parser.error(f"{root}: no such directory")
    runs, idle, unreadable = read_runs(root)
    if not runs:
        print(f"{root}: no readable trajectory with an API call", file=sys.stderr)
        return 1
    table, models = constants(runs)
    if args.json:
        print(json.dumps(table, indent=2))
        return 0
    print(f"{root}: {len(runs)} runs with an API call, {idle} without one, {unreadable} unreadable files skipped\n")
    head = (f"{'model':<26} {'runs':>4} {'steps':>6} {'calls/step':>10} {'prompt/call':>11} {'recv/call':>9} "
            f"{'chars/tok':>9} {'exec s/step':>11} {'median conv chars':>17}")
    print(head)
    print("-" * len(head))
    for name, m in sorted(models.items()):
        steps, calls = m.total("steps"), m.total("calls")
        print(f"{name:<26} {len(m.runs):>4} {steps / len(m.runs):>6.1f} {calls / steps:>10.3f} "
              f"{m.total('sent') / calls:>11,.0f} {m.total('received') / calls:>9,.0f} {m.chars_per_token:>9.2f} "
              f"{m.total('exec_s') / steps:>11.1f} {statistics.median(r.history_chars for r in m.runs):>17,.0f}")
    print("\nconstants (the `mlgym` entries of src/gymforge/tools/estimate_constants.yaml):")
    for key, c in table.items():
        print(f"  {key:<28} {c['value']:>12,.4g}  {c['note']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
