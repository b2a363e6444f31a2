"""The evaluation of an installed task's artefact under gymforge's evaluation contract (docs/integrity.md): a
host-made snapshot of the artefact beside the task's pristine files, the scorer's sandbox, the submission's sandbox
on a server thread, the metrics read from a directory only the scorer writes, and what the agent may be told when it
fails. `TaskEnvironment.evaluate` (tasks/environment.py) calls `Scoring.evaluate`.

Host-side code never follows a path the agent controls: every read and copy of the workspace goes through
`gymforge.sandbox.beneath` (no symlink followed, size-capped).
"""

from __future__ import annotations

import builtins
import hashlib
import json
import os
import re
import shutil
import stat
import threading
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from gymforge.agent.errors import EvaluationFormatError, SubmissionNotFound
from gymforge.core.metrics import valid_metric
from gymforge.runtime.codecheck import imports_gymforge_eval
from gymforge.sandbox import ExecResult, Mount, Session, beneath, make_readable
from gymforge.sandbox.base import WORKDIR
from gymforge.tasks import posttraining
from gymforge.tasks.files import AGENT_CODE_ENTRYPOINTS
from gymforge.tasks.workspace import TaskWorkspace, copy_files, remove_path

EVALKIT = Path(__file__).resolve().parents[1] / "evalkit"  # gymforge/evalkit: copied into every evaluation
"""Files that run inside an evaluation's sandboxes (`gymforge/evalkit/README.md`)."""
_EXCERPT_CHARS = 2000
_ERROR_NAMES = {n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)}
_ERROR_NAMES.add("SubmissionError")


class EvaluationFailed(EvaluationFormatError):
    """The evaluation did not produce metrics. The message is what the agent may see; `detail` is the
    scorer's whole output, for the task's author (verification) only."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


def excerpt(text: str) -> str:
    """The tail of a process's output that a message quotes."""
    text = text.strip()
    return text if len(text) <= _EXCERPT_CHARS else "[...]\n" + text[-_EXCERPT_CHARS:]


def _tree_digest(folder: Path) -> str:
    """sha256 over the relative paths, sizes and bytes of the regular files under a host-made folder."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()):
        digest.update(f"{path.relative_to(folder).as_posix()}\0{path.stat().st_size}\0".encode())
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def _json_objects(text: str) -> list[dict[str, Any]]:
    """JSON objects that start a line and end one (they may span lines), outermost only."""
    decoder = json.JSONDecoder()
    found: list[dict[str, Any]] = []
    pos = covered = 0
    for line in text.splitlines(keepends=True):
        start, pos = pos, pos + len(line)
        i = start + len(line) - len(line.lstrip())
        if start < covered or not text.startswith("{", i):
            continue
        try:
            obj, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and not re.match(r"[^\r\n]*", text[end:])[0].strip():
            found.append(obj)
            covered = end
    return found


def parse_metrics(output: str) -> dict[str, float]:
    """Metrics from an evaluation's output: the whole output as one JSON object, else the one distinct
    JSON object of numbers among its lines (stray prints around it are fine)."""
    try:
        whole = json.loads(output)
    except json.JSONDecodeError:
        candidates = _json_objects(output)
    else:
        if not isinstance(whole, dict):
            raise EvaluationFormatError(
                f"the evaluation printed {type(whole).__name__} JSON, not an object of metrics: {excerpt(output)}"
            )
        candidates = [whole]
    if not candidates:
        raise EvaluationFormatError(
            "the evaluation printed no JSON object of metrics (expected a line like {\"accuracy\": 0.9}); "
            f"its output:\n{excerpt(output)}"
        )
    metrics = [c for c in candidates if c and all(valid_metric(v) is not None for v in c.values())]
    if not metrics:
        bad = {k: v for c in candidates for k, v in c.items() if valid_metric(v) is None}
        what = f"non-numeric values {json.dumps(bad, default=str)[:500]}" if bad else "no metrics ({})"
        raise EvaluationFormatError(f"the evaluation's JSON has {what}; every metric must be a finite number")
    distinct = {json.dumps(m, sort_keys=True) for m in metrics}
    if len(distinct) > 1:
        raise EvaluationFormatError(
            f"the evaluation printed {len(distinct)} different JSON objects of metrics, so which one counts is "
            f"ambiguous: {'; '.join(sorted(distinct))[:1000]}"
        )
    return {k: float(v) for k, v in metrics[0].items()}


def _exists(root: Path, rel: str) -> bool:
    """Whether `rel` is there beneath `root`, never through a link."""
    try:
        beneath.lstat(root, rel)
    except OSError:
        return False
    return True


def _regular(root: Path, rel: str) -> bool:
    try:
        return stat.S_ISREG(beneath.lstat(root, rel).st_mode)
    except OSError:
        return False


def _read_out(out: Path) -> tuple[str, dict[str, Any] | None]:
    """The scorer's captured stdout (ranks in order) and how it ended, from its private directory."""
    texts, status = [], None
    for name in sorted(os.listdir(out), key=lambda n: (len(n), n)):
        if name.startswith("stdout"):
            texts.append(beneath.read_bytes(out, name, 16 << 20).decode(errors="replace"))
        elif name in ("status.json", "status.0.json"):
            try:
                status = json.loads(beneath.read_bytes(out, name, 1 << 16))
            except (OSError, ValueError):
                status = None
    return "".join(texts), status if isinstance(status, dict) else None


class Scoring:
    """The evaluations of one installed task (`installed`); the last one's sandbox runs are kept for the caller."""

    def __init__(self, installed: TaskWorkspace) -> None:
        self.installed = installed
        self.last_evaluation: ExecResult | None = None
        self.last_submission_run: ExecResult | None = None  # the submission's own sandbox in the last evaluation
        self.each_submission_runs: list[ExecResult | None] = []  # `evaluate_each`'s, one a probe (None: none ran)
        # Post-training models scored in this environment, by the digest of what their sandbox got (`_tree_digest`).
        self.scored: dict[str, tuple[dict[str, float], ExecResult, ExecResult | None]] = {}

    @property
    def isolated(self) -> bool:
        """Whether the evaluation follows gymforge's contract: nothing of the agent's code runs where the
        answers are (CSV tasks, whose artefact is data, and evaluators that reach the submission through
        `gymforge_eval`, `imports_gymforge_eval`). Otherwise it runs as MLGym runs it, agent code in the scorer's
        process."""
        task = self.installed.task
        if task.task_entrypoint == "CSVSubmissionTasks":
            return True
        script = self.installed.root / self.installed.layout().get(task.evaluation_paths[0], task.evaluation_paths[0])
        try:
            return imports_gymforge_eval(script.read_text(errors="replace"))
        except OSError:
            return False

    def artefact(self) -> str | None:
        """The artefact's path in the workspace (docs/integrity.md); None for LM tasks, which have none to check."""
        it = self.installed
        entrypoint = it.task.task_entrypoint
        if it.post_training is not None:
            return it.post_training.artefact(it.workspace)
        if entrypoint == "CSVSubmissionTasks":
            if not _regular(it.workspace, "submission.csv"):
                raise SubmissionNotFound(
                    "no submission.csv in the workspace (a regular file, not a symlink); write your predictions there"
                )
            return "submission.csv"
        if entrypoint == "ModelSubmissionTasks":
            skip = {"data", *it.data_targets()}
            configs = sorted(
                (rel for rel, _ in beneath.walk_files(it.workspace)
                 if rel.endswith(".yaml") and not any(rel == t or rel.startswith(t + "/") for t in skip)),
                key=lambda p: (p.count("/"), p),
            )
            if not configs:
                raise SubmissionNotFound("no *.yaml model config in the workspace (outside data/); save one for your model")
            return configs[0]
        if entrypoint == "LMSubmissionTasks":
            return None
        return it.task.baseline_paths[0] if it.task.baseline_paths else "target.py"

    def _argv(self, workdir: str, artefact: str | None) -> list[str]:
        """The evaluation's arguments after the script, per entrypoint as MLGym passes them, in a sandbox's view."""
        if self.installed.task.task_entrypoint == "CSVSubmissionTasks":
            return ["--submission_file", f"{workdir}/{artefact}"]
        if self.installed.task.task_entrypoint == "ModelSubmissionTasks":
            return ["--config_fname", f"{workdir}/{artefact}"]
        return []

    def evaluate(self, within: Session | None = None) -> tuple[dict[str, float], str]:
        """(metrics, artefact) of the workspace's current artefact; `within`: the episode's open session, whose
        limits bound the submission's sandbox too.

        The evaluation never runs in the agent's workspace. The host copies what it needs out of it (regular
        files only, never through a symlink, size-capped) into a private directory that becomes the scorer's
        /workspace, together with the task's pristine evaluation script and starter files and the read-only
        data; the answers are mounted at /answers. With gymforge's contract (`isolated`) nothing of the
        agent's code is importable there (`python -I`, only the artefact copied), and a Python or model
        submission runs in a second sandbox without the answers, reached through `gymforge_eval`. The metrics
        leave through a directory only the scorer writes. The agent is shown the metrics, or the error's
        class and its own code's output, never the output of a process that had the answers.
        """
        it = self.installed
        it.require_gpus()
        artefact = self.artefact()
        isolated = self.isolated
        entrypoint = it.task.task_entrypoint
        serve = isolated and entrypoint in ("PythonSubmissionTasks", "ModelSubmissionTasks", "LMSubmissionTasks")
        ev = it.run_dir / ".eval"
        key = None
        remove_path(ev)
        ev.mkdir(mode=0o755)
        try:
            scorer_ws = ev / "scorer"
            whole = not isolated or entrypoint == "LMSubmissionTasks"
            only = None if whole else ([artefact] if artefact and entrypoint != "PythonSubmissionTasks" else [])
            self._snapshot(scorer_ws, only, artefact)
            self._place_pristine(scorer_ws, everything=isolated)
            if serve and it.post_training is not None:  # only the model, checked and rebuilt from the base
                self._snapshot(ev / "submission", [posttraining.ARTEFACT], artefact)
                it.post_training.admit(ev / "submission")
                # The scorer holds only the task's files, and the submission's sandbox only this rebuilt folder, and
                # generation is greedy: the same folder scores the same. A model scored before (validated, then
                # submitted unchanged) is not generated for again.
                key = _tree_digest(ev / "submission")
                if key in self.scored:
                    metrics, self.last_evaluation, self.last_submission_run = self.scored[key]
                    return dict(metrics), f"{it.workdir}/{artefact}"
            elif serve:
                self._snapshot(ev / "submission", None, artefact)
            make_readable(ev)  # the sandboxes' users own nothing here and only read it
            result, metrics_text, status, server = self._score(ev, scorer_ws, artefact, isolated, serve, within)
        finally:
            remove_path(ev)
        self.last_evaluation, self.last_submission_run = result, server
        shown = f"{it.workdir}/{artefact}" if artefact else it.workdir
        metrics = self._metrics(result, metrics_text, status, server, shown, isolated)
        if key is not None:
            self.scored[key] = (dict(metrics), result, server)
        return metrics, shown

    def evaluate_each(self, probes: Sequence[dict[str, bytes]]) -> list[dict[str, float] | EvaluationFormatError | None]:
        """Each of `probes` (the files it writes over the workspace's, by workspace path) scored in turn as the
        workspace's artefact would be (the evaluator probes): its metrics, or the error `evaluate` would raise for it,
        with everything of `evaluate`'s contract but that the scorer's sandbox is one for them all. In it
        evalkit/score.py --each forks a child per probe from a process that has imported the evaluator's scientific
        libraries (nothing of the task's), after writing the probe's artefact to its path (a one-file bind, read-only
        to the child), and ends whatever the child left running before the next. A Python or model task's probe
        runs in a submission sandbox of its own, as in `evaluate`: a snapshot of the workspace with that probe's
        files, a channel only that child and that sandbox share, started once the previous probe's child has ended
        (`each_submission_runs` keeps how each sandbox ended).

        None for a probe this did not score (the task or the sandbox backend cannot batch, a child was ended by a
        signal, the sandbox stopped early): `evaluate` scores those one by one."""
        it = self.installed
        self.each_submission_runs = [None] * len(probes)
        if not probes or not self.batches():
            return [None] * len(probes)
        it.require_gpus()
        entrypoint = it.task.task_entrypoint
        serve = entrypoint != "CSVSubmissionTasks"
        artefact = "submission.csv" if entrypoint == "CSVSubmissionTasks" else None  # what the scorer reads
        if entrypoint == "ModelSubmissionTasks":  # its config; a Python task's scorer reads no artefact
            try:
                artefact = self.artefact()
            except SubmissionNotFound:
                return [None] * len(probes)
        ev = it.run_dir / ".eval"
        remove_path(ev)
        ev.mkdir(mode=0o755)
        try:
            scorer_ws, base = self._stage_each(ev, probes, artefact, serve)
            mounts, flags, hub_env, at = self._scorer_view(ev, scorer_ws)
            mounts += [Mount(host=ev / "each", target=at["each"])]
            if artefact:
                mounts.append(Mount(host=ev / "slot", target=artefact, read_only=False))
            thread, ended, unstaged = None, threading.Event(), set()
            if serve:
                channels = ev / "channels"
                channels.mkdir()
                for i in range(len(probes)):
                    (channels / str(i)).mkdir()
                    (channels / str(i)).chmod(0o1777)  # the two sandboxes may run as different users
                mounts.append(Mount(host=channels, target=at["channel"]))
                flags += ["--channel", at["channel"]]
                thread = threading.Thread(target=self._serve_each, args=(ev, base, probes, ended, unstaged),
                                          daemon=True)
                thread.start()
            workdir = it.sandbox.workdir(scorer_ws)
            argv = [*it.launcher(True), f"{at['kit']}/score.py", at["out"], *flags,
                    "--each", at["each"], f"{workdir}/{artefact}" if artefact else "-", f"{it.timeout:g}", "--wipe",
                    "/tmp", "--wipe", "/dev/shm", f"{workdir}/{it.task.evaluation_paths[0]}",
                    *self._argv(workdir, artefact)]
            try:
                it.sandbox.run_once(scorer_ws, argv, timeout=it.timeout * len(probes) + 60, limits=it.limits,
                                    mounts=mounts, env={**hub_env, "PYTHONSAFEPATH": "1"}, read_only=True)
            finally:
                ended.set()
                if thread is not None:
                    thread.join()
            shown = f"{it.workdir}/{artefact or self.artefact()}"
            return [None if i in unstaged else self._each_outcome(ev / "out", str(i), shown, self.each_submission_runs[i])
                    for i in range(len(probes))]
        finally:
            remove_path(ev)

    def _stage_each(self, ev: Path, probes: Sequence[dict[str, bytes]], artefact: str | None, serve: bool
                    ) -> tuple[Path, Path | None]:
        """`evaluate_each`'s folder `ev`: the scorer's workspace (pristine, with the artefact's path to bind the slot
        on), the submission's base copy when it serves (`base`, else None), each probe's artefact bytes under
        each/<i> and the slot file; readable to the sandboxes."""
        it = self.installed
        scorer_ws = ev / "scorer"
        self._snapshot(scorer_ws, [], None)
        self._place_pristine(scorer_ws, everything=True)
        if artefact and not (scorer_ws / artefact).is_file():
            (scorer_ws / artefact).parent.mkdir(parents=True, exist_ok=True)
            (scorer_ws / artefact).write_bytes(b"")  # where the slot is bound
        base = None
        if serve:  # the submission's side: the workspace as it is, each probe's files written over a copy
            base = ev / "base"
            self._snapshot(base, None, artefact)
        (ev / "each").mkdir()
        for i, files in enumerate(probes):
            slot = files.get(artefact) if artefact else b""
            if slot is None:  # the probe leaves the artefact as the workspace has it
                slot = beneath.read_bytes(base if base is not None else it.workspace, artefact, it.limits.disk_mb << 20)
            (ev / "each" / str(i)).write_bytes(slot)
        (ev / "slot").write_bytes(b"")
        make_readable(ev)
        return scorer_ws, base

    def batches(self) -> bool:
        """Whether `evaluate_each` can score several probes in one scorer sandbox, on a backend with one-file binds:
        a CSV task (its artefact is data, so only the task's evaluator runs in the scorer), or a Python or model task
        whose evaluator reaches the submission through gymforge_eval (`isolated`: the submission's code runs in a
        sandbox of its own, one per probe). Not under MLGym's way, where the submission runs in the scorer."""
        it = self.installed
        binds = getattr(it.sandbox, "single_file_binds", False)  # a backend written before the flag: one by one
        entrypoint = it.task.task_entrypoint
        kind = entrypoint == "CSVSubmissionTasks" or (
            entrypoint in AGENT_CODE_ENTRYPOINTS and self.isolated)
        return kind and it.post_training is None and binds and it.sandbox.workdir(it.workspace) == WORKDIR

    def _serve_each(self, ev: Path, base: Path, probes: Sequence[dict[str, bytes]], ended: threading.Event,
                    unstaged: set[int]) -> None:
        """The submission sandboxes of `evaluate_each`, one a probe: probe i's runs on a copy of `base` with its files
        written over it, reached through channel i, and is told to end (channel i's `done`) once scorer child i has
        ended (out/i/ended.json) or the scorer has. Probe i+1's starts then, as the scorer's child i+1 does, even if
        probe i's sandbox has not ended yet (a call that holds the interpreter ends with its sandbox's timeout, as
        it would alone); `evaluate_each` returns once every one has ended."""
        it = self.installed
        running: list[tuple[int, threading.Thread, list[ExecResult], Path]] = []
        try:
            for i, files in enumerate(probes):
                if ended.is_set():
                    return
                ws = ev / f"submission-{i}"
                try:
                    self._stage(base, ws, files)
                except (OSError, ValueError):
                    unstaged.add(i)  # its child finds no submission: `evaluate_each` leaves the probe to `evaluate`
                    continue
                channel, sink = ev / "channels" / str(i), []
                server = threading.Thread(target=self._serve, args=(ev, channel, it.data_mounts(), sink, None, ws,
                                                                     f"hf-submission-{i}"), daemon=True)
                server.start()
                running.append((i, server, sink, ws))
                while server.is_alive():
                    if ended.is_set() or _exists(ev / "out", f"{i}/ended.json"):
                        try:  # only that probe's sandbox reads this channel
                            beneath.write_bytes(channel, "done", b"", create=True)
                        except OSError:
                            pass
                        break
                    server.join(0.02)
        finally:
            for i, server, sink, ws in running:
                server.join()
                self.each_submission_runs[i] = sink[0] if sink else None
                remove_path(ws)

    @staticmethod
    def _stage(base: Path, ws: Path, files: dict[str, bytes]) -> None:
        """`ws`: a copy of the host-made snapshot `base` (regular files and folders only) with `files` written over it."""
        remove_path(ws)
        shutil.copytree(base, ws, symlinks=True)
        for rel, data in files.items():
            path = PurePosixPath(rel)
            if path.is_absolute() or ".." in path.parts:
                raise ValueError(f"a probe's file outside the workspace: {rel}")
            (ws / rel).parent.mkdir(parents=True, exist_ok=True)
            (ws / rel).write_bytes(data)
        make_readable(ws)

    def _each_outcome(self, out: Path, name: str, shown: str,
                      server: ExecResult | None = None) -> dict[str, float] | EvaluationFormatError | None:
        try:
            ended = json.loads(beneath.read_bytes(out, f"{name}/ended.json", 1 << 16))
            result = ExecResult(output=excerpt(beneath.read_bytes(out, f"{name}/output", 16 << 20).decode(
                errors="replace")), exit_code=int(ended["exit"]), timed_out=bool(ended["timed_out"]),
                duration_s=float(ended["seconds"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None  # not ended (the sandbox stopped first) or its output past 16 MiB: scored alone
        if result.exit_code >= 128 and not result.timed_out:
            return None  # a limit's signal: `evaluate` names the limit
        metrics_text, status = _read_out(out / name)
        try:
            return self._metrics(result, metrics_text, status, server, shown, True)
        except EvaluationFormatError as err:
            return err

    def _metrics(self, result: ExecResult, metrics_text: str, status: dict[str, Any] | None,
                 server: ExecResult | None, shown: str, isolated: bool) -> dict[str, float]:
        """The metrics of a finished scorer, or the error the agent is shown."""
        if status is None or status.get("exit") != 0 or result.timed_out or result.limit:
            raise self._failure(result, status, server, shown, isolated)
        try:
            return parse_metrics(metrics_text)
        except EvaluationFormatError as err:
            raise EvaluationFailed(str(err) if not self.installed.has_secrets else
                                   "the evaluation printed no readable metrics", detail=result.output) from None

    def _snapshot(self, dest: Path, only: list[str] | None, artefact: str | None) -> None:
        it = self.installed
        try:
            left_out = beneath.copy_tree(it.workspace, dest, max_bytes=it.limits.disk_mb << 20,
                                         skip=frozenset(it.data_targets()), only=only)
        except beneath.CopyLimitError as err:
            raise EvaluationFailed(f"the workspace is too large to evaluate ({err.strerror}; cap: "
                                   f"{it.limits.disk_mb} MiB)") from None
        if artefact and artefact in left_out:
            raise SubmissionNotFound(f"{artefact} is a symlink or not a regular file; write the artefact as a regular file")
        for t in it.data_targets():  # mount points for the read-only data
            (dest / t).mkdir(parents=True, exist_ok=True)

    def _place_pristine(self, dest: Path, *, everything: bool) -> None:
        """The task's own files (never the agent's versions): the evaluation script, and with `everything`
        all starter code (an isolated scorer imports nothing of the agent's, but may import the task's)."""
        it = self.installed
        withheld = {(it.root / p).resolve() for p in it.task.secret_files}
        local = set(it.local_data_paths())
        layout = it.layout()
        wanted = [d for d, src in layout.items() if src not in local] if everything else []
        wanted += [e for e in it.task.evaluation_paths[:1] if e not in wanted]
        for rel in wanted:
            src = it.root / layout.get(rel, rel)
            target = dest / rel
            if target.exists() or target.is_symlink():
                remove_path(target)
            if src.exists():
                copy_files(src, target, withheld)

    def _places(self, ws: Path) -> dict[str, str]:
        """Where the scorer's fixed places show in a sandbox on `ws`: fixed paths where the backend builds the
        view (bwrap, docker), links inside the workspace under the weak local confinements."""
        names = ("kit", "out", "channel", "answers", "each")
        if self.installed.sandbox.workdir(ws) == WORKDIR:
            return {n: f"/gymforge-{n}" if n != "answers" else "/answers" for n in names}
        return {n: str(ws.resolve() / f".gymforge-{n}") for n in names}

    def _score(
        self, ev: Path, scorer_ws: Path, artefact: str | None, isolated: bool, serve: bool, within: Session | None
    ) -> tuple[ExecResult, str, dict[str, Any] | None, ExecResult | None]:
        it = self.installed
        out = ev / "out"
        mounts, flags, hub_env, at = self._scorer_view(ev, scorer_ws)
        server: list[ExecResult] = []
        thread = None
        if serve:
            channel = ev / "channel"
            channel.mkdir()
            channel.chmod(0o1777)  # the two sandboxes may run as different users
            mounts.append(Mount(host=channel, target=at["channel"], read_only=False))
            flags += ["--channel", at["channel"]]
            thread = threading.Thread(target=self._serve, args=(ev, channel, it.data_mounts(), server, within),
                                      daemon=True)
            thread.start()
        workdir = it.sandbox.workdir(scorer_ws)
        script = f"{workdir}/{it.task.evaluation_paths[0]}"
        argv = [*it.launcher(isolated), f"{at['kit']}/score.py", at["out"], *flags, *([] if isolated else ["--mlgym"]),
                script]
        argv += self._argv(workdir, artefact)
        try:
            result = it.sandbox.run_once(scorer_ws, argv, timeout=it.timeout, limits=it.limits, mounts=mounts,
                                         env={**hub_env, "PYTHONSAFEPATH": "1"}, read_only=isolated)
        finally:
            if thread is not None:
                try:  # the submission shares this directory: never through a link it planted
                    beneath.write_bytes(ev / "channel", "done", b"", create=True)
                except OSError:
                    pass  # it sabotaged its own shutdown: its sandbox ends at the timeout
                thread.join()
        metrics, status = _read_out(out)
        return result, metrics, status, (server[0] if server else None)

    def _scorer_view(self, ev: Path, scorer_ws: Path) -> tuple[list[Mount], list[str], dict[str, str], dict[str, str]]:
        """The scorer's mounts (data, hub, evalkit, its output directory `ev`/out, the answers), its launcher's
        flags, its environment and where its fixed places show."""
        it = self.installed
        out = ev / "out"
        out.mkdir()
        at = self._places(scorer_ws)
        hub, hub_env = it.hub_view(ev / "hf-scorer")
        mounts = [*it.data_mounts(), *hub, Mount(host=EVALKIT, target=at["kit"]),
                  Mount(host=out, target=at["out"], read_only=False)]
        flags = []
        if it.has_secrets:
            mounts.append(Mount(host=it.secrets_dir, target=at["answers"]))
            flags += ["--answers", at["answers"]]
        return mounts, flags, hub_env, at

    def _serve(
        self, ev: Path, channel: Path, data: list[Mount], sink: list[ExecResult], within: Session | None,
        ws: Path | None = None, hub_home: str = "hf-submission",
    ) -> None:
        """The submission's sandbox: the agent's files (a read-only snapshot, `ws`: by default `ev`/submission), the
        data, no answers."""
        it = self.installed
        ws = ws or ev / "submission"
        at = self._places(ws)
        hub, hub_env = it.hub_view(ev / hub_home)
        mounts = [*data, *hub, Mount(host=EVALKIT, target=at["kit"]),
                  Mount(host=channel, target=at["channel"], read_only=False)]
        argv = ["python", "-I", f"{at['kit']}/serve.py", at["channel"]]
        session = within if within is not None and not getattr(within, "_closed", True) else None
        sink.append(it.sandbox.run_once(ws, argv, timeout=it.timeout, limits=it.limits, mounts=mounts,
                                        env=hub_env, read_only=True, within=session))

    def _failure(
        self, result: ExecResult, status: dict[str, Any] | None, server: ExecResult | None, shown: str, isolated: bool
    ) -> Exception:
        has_secrets = self.installed.has_secrets
        if result.timed_out:
            what = f"the evaluation ran past training_timeout ({self.installed.timeout:g} s)"
        elif result.limit:
            what = f"the evaluation was stopped by a sandbox limit ({result.limit})"
        else:
            error = (status or {}).get("error")
            # A class name, never a message; and only a known one (a name can carry data too).
            error = error if error in _ERROR_NAMES else ("an exception" if error else f"exit status {result.exit_code}")
            what = f"the evaluation of {shown} failed ({error})"
        message = what
        if server is not None and server.output.strip() and not has_secrets:
            # Only without held-out inputs: the scorer hands them to the submission, which could print them.
            message += f"; output of your code during the evaluation:\n{excerpt(server.output)}"
        elif not has_secrets and not isolated:
            message += f"; output tail (stdout and stderr):\n{excerpt(result.output)}"
        return EvaluationFailed(message, detail=result.output)
