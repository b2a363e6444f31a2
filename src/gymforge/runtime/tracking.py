"""Experiment tracking: SFT and RL log their curves per step to a tracker (`tracking` in the config).

`open_tracker(cfg, name=..., kind=..., config=...)` returns a `Tracker` with `log(metrics, step)` and `finish()`:

- `trackio` (default): local-first, offline. Runs go to a SQLite store under `tracking.dir` (default
  `<results>/trackio`), project `tracking.project`; `trackio show --project gymforge` (with `TRACKIO_DIR` set to that
  folder) opens the dashboard, and `read_steps` reads a run's logged steps back.
- `wandb`: Weights & Biases (`pip install wandb`; its own login and `WANDB_MODE`), same names and metrics.
- `none`: nothing is logged (the curves stay in `results/` as always: metrics.jsonl, curve.json).

The environment variable `GYMFORGE_TRACKING` (`trackio`, `wandb`, `none`) overrides `tracking.backend` for one
command (the test suite sets `none`, so that tests running SFT or RL do not write into a checkout's results/).

A tracker that cannot start (the package missing, a store that cannot be written) is logged as a warning and replaced
by `none`: tracking never fails a training run.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Any

log = logging.getLogger("gymforge.tracking")


class Tracker:
    """Logs nothing (`tracking.backend: none`); the base of the real ones."""

    backend = "none"
    where: str | None = None

    def log(self, metrics: dict[str, Any], step: int) -> None:
        pass

    def finish(self) -> None:
        pass


def _scalars(metrics: dict[str, Any]) -> dict[str, float]:
    out = {}
    for k, v in metrics.items():
        if isinstance(v, bool):
            v = float(v)
        if isinstance(v, (int, float)) and math.isfinite(float(v)):
            out[k] = float(v)
    return out


class _Trackio(Tracker):
    backend = "trackio"

    def __init__(self, store: Path, project: str, name: str, config: dict[str, Any]) -> None:
        store.mkdir(parents=True, exist_ok=True)
        trackio = _trackio_at(store)
        self.run = trackio.init(project=project, name=name, config=config, resume="allow", auto_log_cpu=False,
                                auto_log_gpu=False)
        self.where = f"{store} (project {project}, run {name}; `TRACKIO_DIR={store} trackio show --project {project}`)"

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self.run.log(_scalars(metrics), step=step)

    def finish(self) -> None:
        self.run.finish()


class _Wandb(Tracker):
    backend = "wandb"

    def __init__(self, store: Path, project: str, name: str, config: dict[str, Any]) -> None:
        import wandb

        store.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=project, name=name, config=config, dir=str(store), resume="allow", id=name)
        self.where = str(getattr(self.run, "url", None) or store)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self.run.log(_scalars(metrics), step=step)

    def finish(self) -> None:
        self.run.finish()


def store_dir(cfg: Any, backend: str | None = None) -> Path:
    t = cfg.tracking
    return Path(t.dir) if t.dir else cfg.results / (backend or t.backend)


def open_tracker(cfg: Any, *, name: str, kind: str, config: dict[str, Any] | None = None) -> Tracker:
    """The run `name` of this job (`kind`: sft or rl) in the configured tracker, or a no-op one."""
    t = cfg.tracking
    backend = os.environ.get("GYMFORGE_TRACKING") or t.backend
    kinds = {"trackio": _Trackio, "wandb": _Wandb}
    if backend not in kinds:
        return Tracker()
    try:
        tracker = kinds[backend](store_dir(cfg, backend), t.project, name, {"kind": kind, **(config or {})})
    except Exception as err:  # noqa: BLE001 - tracking is a view of the run, never a reason for it to fail
        log.warning("tracking.backend %s could not start (%s: %s); not tracking this run", backend,
                    type(err).__name__, err)
        return Tracker()
    log.info("tracking %s run %s in %s", kind, name, tracker.where)
    return tracker


def _trackio_at(store: Path) -> Any:
    """trackio, storing under `store`. It reads `TRACKIO_DIR` once, at import, into several of its modules: a process
    that imported it before (a test, a second job in one process) gets those names pointed at `store` too."""
    import sys

    os.environ["TRACKIO_DIR"] = str(store)
    import trackio

    for module in ("trackio", "trackio.utils", "trackio.sqlite_storage", "trackio.fragments"):
        if hasattr(sys.modules.get(module), "TRACKIO_DIR"):
            sys.modules[module].TRACKIO_DIR = Path(store)
    return trackio


def read_steps(store: Path, project: str, name: str) -> list[dict[str, Any]]:
    """The steps a trackio run logged (each a dict of its metrics, `step` and `timestamp`)."""
    return _trackio_at(Path(store)).SQLiteStorage.get_logs(project, name)


def trainer_callback(tracker: Tracker, *, flops_per_token: float | None = None,
                     peak_flops: float | None = None) -> Any:
    """A `transformers.TrainerCallback` that logs each logged training step to `tracker`: the loss, learning rate,
    gradient norm, token accuracy, tokens so far and tokens/s since the previous logged step. Given the model FLOPs
    per trained token and the total peak FLOP/s of the devices training (`gymforge.student.flops`), a step with
    tokens/s also logs `mfu`, flops_per_token x tokens_per_s / peak_flops; without either (a CPU, an unlisted GPU),
    no `mfu`."""
    import time

    from transformers import TrainerCallback

    class TrackingCallback(TrainerCallback):
        def __init__(self) -> None:
            self.last: tuple[float, float] | None = None

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
            if not logs or "loss" not in logs or not state.is_world_process_zero:
                return
            now, tokens = time.monotonic(), logs.get("num_tokens")
            row = {k: logs[k] for k in ("loss", "learning_rate", "grad_norm", "mean_token_accuracy", "epoch")
                   if logs.get(k) is not None}
            if tokens is not None:
                row["tokens"] = tokens
                if self.last is not None and now > self.last[0]:
                    row["tokens_per_s"] = (float(tokens) - self.last[1]) / (now - self.last[0])
                    if flops_per_token and peak_flops:
                        row["mfu"] = flops_per_token * row["tokens_per_s"] / peak_flops
                self.last = (now, float(tokens))
            tracker.log(row, step=int(state.global_step))

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.last = None

    return TrackingCallback()
