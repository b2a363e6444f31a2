"""One agent episode in its own sandbox workspace, runnable many at a time on one event loop.

The one place episodes and their sandboxes are made: verification (stage 3.4), teacher rollouts (3.5),
benchmark runs (3.8), RL rollouts and `gymforge run-task` all build an `EpisodeRunner` (`for_config`:
the configured backend with the job's GPUs, the sandbox limits, the dataset cache), take task
environments from it and run episodes through it: install a task, open a shell session, let the `Agent`
talk to a model until it submits, and clean up the workspace.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gymforge.agent.loop import Agent, AgentConfig, AgentTask
from gymforge.agent.trajectory import Trajectory
from gymforge.core.config import GymforgeConfig
from gymforge.tasks.environment import TaskEnvironment
from gymforge.sandbox import Limits, SandboxBackend, get_sandbox
from gymforge.tasks.datacache import cache_root


def sandbox_for(cfg: GymforgeConfig, gpus: int) -> SandboxBackend:
    """The configured backend; `gpus` is what the job declared (its episodes share those devices)."""
    if cfg.sandbox.backend == "docker":
        return get_sandbox("docker", image=cfg.sandbox.image, **({"gpus": gpus} if gpus else {}))
    return get_sandbox(cfg.sandbox.backend, allow_weak_confinement=cfg.sandbox.allow_weak_confinement,
                       **({"gpus": True} if gpus else {}))


class EpisodeRunner:
    """Runs episodes of tasks concurrently; installs are serialized because `datasets` (hidden columns) is
    not thread-safe (its tqdm thread_map lock races between threads)."""

    def __init__(self, sandbox: SandboxBackend, limits: Limits, dataset_cache: Path | None = None,
                 gpus: int | None = None) -> None:
        self.sandbox, self.limits, self.dataset_cache, self.gpus = sandbox, limits, dataset_cache, gpus
        self._install_lock = threading.Lock()

    @classmethod
    def for_config(cls, cfg: GymforgeConfig, gpus: int) -> EpisodeRunner:
        """The configured sandbox backend and limits; `gpus`: what the job declared (its episodes share them)."""
        return cls(sandbox_for(cfg, gpus), Limits.from_config(cfg.sandbox), cache_root(cfg))

    def environment(self, task_yaml: Path, *, root: Path, run_dir: Path,
                    hidden_columns: dict[str, list[str]] | None = None) -> TaskEnvironment:
        """A task environment in this runner's sandbox, with its limits and dataset cache."""
        return TaskEnvironment(task_yaml, root=root, sandbox=self.sandbox, run_dir=run_dir, limits=self.limits,
                               hidden_columns=hidden_columns, dataset_cache=self.dataset_cache,
                               **({"gpus": self.gpus} if self.gpus is not None else {}))

    def _install(self, env: TaskEnvironment) -> None:
        with self._install_lock:
            env.install()

    async def run(
        self, llm: Any, task_yaml: Path, *, root: Path, run_dir: Path, max_steps: int, seed: int,
        baseline: dict[str, float] | None, meta: dict[str, Any], hidden_columns: dict[str, list[str]] | None = None,
        out_dir: Path | None = None,
    ) -> Trajectory:
        """One episode; `out_dir` receives MLGym's `<task>.traj` and results.json; `run_dir` is removed after."""
        loop = asyncio.get_running_loop()
        env = self.environment(task_yaml, root=root, run_dir=run_dir, hidden_columns=hidden_columns)
        task = AgentTask(id=env.task.id, description=env.description, baseline=baseline, training_timeout=env.timeout)
        # The session is opened (and closed) in a thread that lives as long as the episode: a bwrap sandbox
        # dies with the thread that started it.
        opener = ThreadPoolExecutor(1, thread_name_prefix=f"episode-{task.id}-{seed}")
        try:
            await loop.run_in_executor(opener, self._install, env)
            session = await loop.run_in_executor(opener, env.open_session)
            try:
                agent = Agent(llm, session, env, task, AgentConfig(max_steps=max_steps), seed=seed, mounts=env.mounts,
                              out_dir=out_dir, meta={**meta, "sandbox": self.sandbox.name})
                traj = await agent.arun()
            finally:
                await loop.run_in_executor(opener, session.close)
            await loop.run_in_executor(opener, shutil.rmtree, run_dir, True)
        finally:
            opener.shutdown(wait=False)
        return traj
