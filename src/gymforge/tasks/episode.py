"""One agent episode in its own sandbox workspace, runnable many at a time on one event loop.

The one place episodes and their sandboxes are made: verification, teacher rollouts,
benchmark runs, RL rollouts and `gymforge run-task` all build an `EpisodeRunner` (`for_config`:
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
from typing import Any, Callable

from gymforge.agent.loop import Agent, AgentConfig, AgentTask
from gymforge.agent.trajectory import Trajectory
from gymforge.core.config import GymforgeConfig
from gymforge.tasks.environment import TaskEnvironment
from gymforge.tasks.harbor import HarborEnvironment, is_harbor_folder
from gymforge.sandbox import Limits, SandboxBackend, get_sandbox
from gymforge.tasks.datacache import cache_root
from gymforge.tasks.posttraining import post_training_settings
from gymforge.tasks.workflow import SkillsEnvironment, skills_for


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
                 gpus: int | None = None, interface: str | Callable[[], str] = "cli", *,
                 post_training: Callable[[], tuple[str | None, Path]] | None = None) -> None:
        self.sandbox, self.limits, self.dataset_cache, self.gpus = sandbox, limits, dataset_cache, gpus
        # Post-training tasks' base model and where it is built: (post_training.base_model, model cache), read only
        # when a post-training task is installed, so jobs that never run one need not declare `post_training`.
        self._post_training = post_training
        self._interface = interface
        self._install_lock = threading.Lock()

    @classmethod
    def for_config(cls, cfg: GymforgeConfig, gpus: int) -> EpisodeRunner:
        """The configured sandbox backend and limits; `gpus`: what the job declared (its episodes share them).
        `agent.interface` is read when the first episode runs, so jobs that only install tasks need not declare
        `agent`."""
        return cls(sandbox_for(cfg, gpus), Limits.from_config(cfg.sandbox), cache_root(cfg),
                   interface=lambda: cfg.agent.interface, post_training=post_training_settings(cfg))

    @property
    def interface(self) -> str:
        """`agent.interface`: `cli`, or `workflow` (the skills, on post-training tasks: gymforge.tasks.workflow)."""
        if callable(self._interface):
            self._interface = self._interface()
        return self._interface

    def environment(self, task_yaml: Path, *, root: Path, run_dir: Path,
                    hidden_columns: dict[str, list[str]] | None = None, skills: bool = False) -> TaskEnvironment | HarborEnvironment:
        """A task environment in this runner's sandbox, with its limits and dataset cache; `skills`: its sessions
        get the workflow skills (post-training tasks). A Harbor task folder in place of `task_yaml` gives a
        `HarborEnvironment` (its verifier scores it; no hidden columns, no skills)."""
        if is_harbor_folder(task_yaml):
            return HarborEnvironment(task_yaml, run_dir, sandbox=self.sandbox, limits=self.limits)
        kind = SkillsEnvironment if skills else TaskEnvironment
        env = kind(task_yaml, root=root, sandbox=self.sandbox, run_dir=run_dir, limits=self.limits,
                    hidden_columns=hidden_columns, dataset_cache=self.dataset_cache,
                    **({"gpus": self.gpus} if self.gpus is not None else {}))
        if env.post_training is not None and self._post_training is not None:
            env.post_training.configure(*self._post_training())
        return env

    def _install(self, env: TaskEnvironment) -> None:
        with self._install_lock:
            env.install()

    async def run(
        self, llm: Any, task_yaml: Path, *, root: Path, run_dir: Path, max_steps: int, seed: int,
        baseline: dict[str, float] | None, meta: dict[str, Any], hidden_columns: dict[str, list[str]] | None = None,
        out_dir: Path | None = None, interface: str | None = None,
    ) -> Trajectory:
        """One episode; `out_dir` receives MLGym's `<task>.traj` and results.json; `run_dir` is removed after.
        `interface` overrides the runner's (`agent.interface`) for this episode."""
        loop = asyncio.get_running_loop()
        workflow = (interface or self.interface) == "workflow" and not is_harbor_folder(task_yaml)
        env = self.environment(task_yaml, root=root, run_dir=run_dir, hidden_columns=hidden_columns, skills=workflow)
        task_id = env.id if isinstance(env, HarborEnvironment) else env.task.id
        task = AgentTask(id=task_id, description=env.description, baseline=baseline, training_timeout=env.timeout)
        # The session is opened (and closed) in a thread that lives as long as the episode: a bwrap sandbox
        # dies with the thread that started it.
        opener = ThreadPoolExecutor(1, thread_name_prefix=f"episode-{task.id}-{seed}")
        try:
            await loop.run_in_executor(opener, self._install, env)
            session = await loop.run_in_executor(opener, env.open_session)
            try:
                skills = await loop.run_in_executor(opener, skills_for, env, baseline) if workflow else None
                # The interface the episode had (a task of another kind gets `cli`), always when one was asked for.
                extra = {"interface": "workflow"} if skills is not None else {"interface": "cli"} if interface else {}
                agent = Agent(llm, session, env, task, AgentConfig(max_steps=max_steps), seed=seed, mounts=env.mounts,
                              out_dir=out_dir, meta={**meta, "sandbox": self.sandbox.name, **extra}, commands=skills)
                traj = await agent.arun()
            finally:
                await loop.run_in_executor(opener, session.close)
            await loop.run_in_executor(opener, shutil.rmtree, run_dir, True)
        finally:
            opener.shutdown(wait=False)
        return traj
