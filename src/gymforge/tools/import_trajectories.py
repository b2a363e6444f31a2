"""`gymforge import-trajectories`: SFT examples from trajectories gymforge did not roll out itself.

MLGym run folders (`<task>.traj` + `results.json`), gymforge run-task folders and rollout shards, read by
`gymforge.agent.sources` (which describes the formats and how each becomes an example), then filtered by the
SFT stage's filters (`gymforge.stages.sft.filter_examples`) with the student's tokenizer, and written as examples of
the example unit (`--unit`, else `sft.example_unit`: one per kept trajectory, or one per teacher reply).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from gymforge.agent.sources import Candidate, import_candidates
from gymforge.core.config import ConfigError, GymforgeConfig, config_or_defaults
from gymforge.stages.sft import filter_examples
from gymforge.stages.sft_export import export_sft


def import_trajectories(cfg: GymforgeConfig, sources: list[Path], tokenizer_dir: Path, out: Path,
                        unit: str | None = None) -> dict[str, Any]:
    """`gymforge import-trajectories`: `out/dataset` (Hugging Face, on disk), `out/train.jsonl`,
    `out/rollouts.jsonl` (one line per trajectory, kept or not, and why) and `out/stats.json`; `unit` overrides
    `sft.example_unit`."""
    out = Path(out)

    def candidates() -> Iterator[Candidate]:
        for source in sources:
            yield from import_candidates(Path(source))

    return filter_examples(cfg, candidates(), tokenizer_dir, jsonl_out=out / "train.jsonl",
                           dataset_out=out / "dataset", rollouts_out=out / "rollouts.jsonl",
                           stats_out=out / "stats.json", unit=unit)


def main(args: Any) -> None:
    """`gymforge import-trajectories DIR... --out OUT [--tokenizer DIR]`."""
    cfg = config_or_defaults(args.config)
    tokenizer = Path(args.tokenizer) if args.tokenizer else cfg.results / "student" / "tokenizer"
    if not tokenizer.is_dir():
        raise ConfigError(f"{tokenizer}: no student tokenizer; build it (snakemake --cores 1 {tokenizer}, or "
                          f"gymforge student-tokenizer --out DIR) or pass --tokenizer DIR")
    stats = import_trajectories(cfg, [Path(d) for d in args.dirs], tokenizer, Path(args.out),
                                unit=getattr(args, "unit", None))
    print(f"kept {stats['kept']} of {stats['rollouts']} trajectories from {stats['tasks']} tasks; "
          f"discarded {stats['discarded']}; {stats['examples']} examples (unit {stats['example_unit']}); "
          f"{Path(args.out) / 'dataset'} (datasets.load_from_disk), "
          f"{Path(args.out) / 'stats.json'}")


def export_main(args: Any) -> None:
    """`gymforge export-sft DIR [--results R]`: the SFT dataset as a folder for load_dataset / push_to_hub."""
    results = Path(args.results) if args.results else config_or_defaults(args.config).results
    out = export_sft(results, Path(args.dir))
    print(f"{out}: ready for datasets.load_dataset({str(out)!r}) and push_to_hub (see {out / 'README.md'})")
