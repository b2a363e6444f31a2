"""How often the offline teacher's first config drafts state a metric they do not score, and its repairs.

    python bench/metric_drift.py [--results results] [--seeds 30]

For every proposal a run kept (`results/proposals/t*.json`), the offline config writer answers `write_configs`
for `--seeds` request seeds, as a first draft (attempt 0) and as a repair (attempt 1). Each draft's description is
read by the coherence check's metric rules (`gymforge.tasks.coherence.check_metric`), against the metric its own
facts list declares, which the offline code writer makes the evaluation print. The figure in docs/integrity.md
comes from here.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import yaml

from gymforge.offline import families
from gymforge.offline.families.common import parse_facts
from gymforge.tasks.coherence import check_metric


def description(reply: str) -> str:
    block = re.search(r"```yaml\n# configs/tasks/\S+\n(.*?)```", reply, re.S)
    assert block is not None, "the reply holds no task config"
    return yaml.safe_load(block.group(1))["description"]


def slipped(text: str) -> bool:
    printed = parse_facts(text)["metric"].split(" ")[0]
    return bool(check_metric(text, {printed: 1.0}, [], None, None, "task", "evaluation"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default="results", type=Path)
    parser.add_argument("--seeds", type=int, default=30)
    args = parser.parse_args()
    proposals = []
    for path in sorted(args.results.glob("proposals/t*.json")):
        record = json.loads(path.read_text())
        if record["status"] == "ok":
            proposals.append({**record["proposal"], "dataset": record["dataset"]})
    first = repaired = drifted = 0
    for proposal in proposals:
        for seed in range(args.seeds):
            first += slipped(description(families.write_configs(proposal, seed=seed, attempt=0)))
            repaired += slipped(description(families.write_configs(proposal, seed=seed, attempt=1)))
            drifted += families.metric_drift(proposal, seed=seed, attempt=0)
    drafts = len(proposals) * args.seeds
    print(f"{len(proposals)} proposals x {args.seeds} seeds = {drafts} drafts: {drifted} drifting first drafts, "
          f"{first} first drafts state a metric they do not score ({first / max(drafts, 1):.0%}), "
          f"{repaired} repairs do")


if __name__ == "__main__":
    main()
