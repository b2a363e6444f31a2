"""The attack suite of issue 12: an agent that makes no genuine improvement tries to counterfeit its score, reach the
held-out answers, or read or change host files, on every entrypoint and on the local (bubblewrap) and docker
backends.

Entrypoints: CSVSubmissionTasks (built-in blobClustering), PythonSubmissionTasks (built-in graphColoring),
ModelSubmissionTasks (tests/fixtures/attacks polyModel, a pickled model, and built-in kernelDensityBandwidth, a YAML
config its evaluator reads itself) and LMSubmissionTasks (tests/fixtures/attacks bigramLM, under torchrun with
gpus=1, i.e. on CPU).

Every attack asserts that the score equals the honest one (or the evaluation fails cleanly, with an error the
agent is shown), that no held-out answer reaches anything the agent sees or can read later (shell output,
file-tool observations, evaluation observations, the workspace, the shared HF_HOME), and that root-owned canary
files outside the workspace are neither read nor changed. Attacks that still succeed are listed in OPEN and
marked xfail(strict=True): CI stays green, the list of holes is explicit, and a fix makes its test xpass, which
fails until the entry is removed.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from attacks import payloads as P
from attacks.harness import (
    ENTRIES,
    LIMITS,
    REPO,
    Episode,
    assert_honest,
    assert_no_leak,
    heldout_input_markers,
    host_paths,
    with_hub_dataset,
)
from test_sandbox_docker import docker_backend  # noqa: F401  (the private-daemon fixture; skips with a reason)

from gymforge.sandbox import Limits, SandboxBackend, SandboxError, disk, get_sandbox

BACKENDS = ("local", "docker")
ALL = tuple(ENTRIES)
CODE = tuple(P.CODE_ENTRIES)  # entrypoints whose evaluation runs submitted code

# Attacks that still succeed against the current code: (test, entrypoint, backend) -> what leaks.
OPEN: dict[tuple[str, str, str], str] = {
    ("host_paths_session", "csv", "local"): (
        "/proc/self/mountinfo shows the venv's host path (under the checkout) as the source and a mount point of the "
        "read-only venv bind: its scripts' shebangs name that path; the workspace no longer shows"),
}


# Cases whose bound depends on a poll keeping up with the writer (docker's /tmp is its writable layer): under
# `make test` they run in the serial phase, after the parallel one, not squeezed by other workers.
SERIAL = {("fill_tmp", "docker")}


def cases(test: str, entries: tuple[str, ...] = ALL, backends: tuple[str, ...] = BACKENDS, extra=((),)) -> list:
    out = []
    for e in entries:
        for b in backends:
            for x in extra:
                reason = OPEN.get((test, e, b)) or OPEN.get((test, e, b, *x)) if x else OPEN.get((test, e, b))
                marks = [pytest.mark.xfail(strict=True, reason=f"open: {reason}")] if reason else []
                marks += [pytest.mark.serial] if (test, b) in SERIAL else []
                marks += [pytest.mark.slow] if e == "lm" else []  # torchrun in every sandbox; docker: conftest.py
                out.append(pytest.param(e, b, *x, id="-".join([e, b, *map(str, x)]), marks=marks))
    return out


# -- fixtures -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def local_backend() -> SandboxBackend:
    try:
        backend = get_sandbox("local", confinement="bwrap")
    except SandboxError as err:
        pytest.skip(f"no bubblewrap here: {err}")
    return backend


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> SandboxBackend:
    name = request.node.callspec.params["backend_name"]
    return request.getfixturevalue("local_backend" if name == "local" else "docker_backend")


_LM_PROBE: dict[str, str | None] = {}


def _lm_unavailable(backend: SandboxBackend, tmp: Path) -> str | None:
    """Why LMSubmissionTasks cannot run on this backend at all (no torchrun, or torchrun cannot start), or None."""
    if backend.name not in _LM_PROBE:
        ws = tmp / "lm-probe"
        ws.mkdir(parents=True, exist_ok=True)
        (ws / "probe.py").write_text("import os\nprint('rank', os.environ['RANK'])\n")
        r = backend.run_once(ws, ["bash", "-c", "command -v torchrun || echo NO-TORCHRUN"], timeout=60, limits=LIMITS)
        if "NO-TORCHRUN" in r.output:
            _LM_PROBE[backend.name] = f"the {backend.name} sandbox has no torchrun (its image lacks torch)"
        else:
            r = backend.run_once(ws, ["torchrun", "--nproc_per_node=1", "--standalone", "probe.py"], timeout=120,
                                 limits=LIMITS)
            why = ("c10d cannot resolve the sandbox's hostname" if "name resolution" in r.output
                   else " ".join(r.output.split())[-200:])
            _LM_PROBE[backend.name] = None if "rank 0" in r.output else (
                f"torchrun --standalone does not start in the {backend.name} sandbox on CPU "
                f"(exit {r.exit_code}, timed out {r.timed_out}): {why}")
    return _LM_PROBE[backend.name]


# Where torchrun cannot run at all, an LM evaluation can only fail (after training_timeout): the attacks that
# could still counterfeit a score (code that runs before or instead of torchrun) run anyway, the rest skip.
LM_WITHOUT_TORCHRUN = {"test_shadowed_imports", "test_forged_status_shows_the_answers"}


@contextmanager
def episode(entry_name: str, backend: SandboxBackend, tmp: Path, **kwargs) -> Iterator[Episode]:
    entry = ENTRIES[entry_name]
    test = os.environ.get("PYTEST_CURRENT_TEST", "").split("::")[-1].split("[")[0]
    if entry.name == "lm" and (why := _lm_unavailable(backend, tmp)) and test not in LM_WITHOUT_TORCHRUN:
        pytest.skip(why)
    ep = Episode(entry, backend, tmp, **kwargs)
    try:
        yield ep
    finally:
        ep.close()


_HONEST: dict[tuple[str, str], dict[str, float]] = {}


@pytest.fixture
def honest(backend: SandboxBackend, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest):
    """The honest score of the entry's baseline artefact on this backend (measured once)."""
    entry_name = request.node.callspec.params["entry_name"]
    key = (entry_name, backend.name)
    if entry_name == "lm" and _lm_unavailable(backend, tmp_path_factory.mktemp("probe")):
        return None  # the honest LM evaluation cannot succeed here: any score is counterfeit
    if key not in _HONEST:
        with episode(entry_name, backend, tmp_path_factory.mktemp(f"honest-{entry_name}")) as ep:
            ep.make_honest()
            out = ep.evaluate()
            assert out.metrics is not None, f"the honest artefact does not score: {out.error}"
            _HONEST[key] = out.metrics
    return _HONEST[key]


@pytest.fixture(scope="session")
def hub_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dataset cache with one fetched hub dataset (offline hub), so a task's runs get the shared HF_HOME."""
    from gymforge.core.config import GymforgeConfig
    from gymforge.hub import get_hub
    from gymforge.stages import datasets as pf

    hub = get_hub(GymforgeConfig(cache_dir=str(tmp_path_factory.mktemp("hubcache"))))
    hub.ensure_built()
    root = tmp_path_factory.mktemp("datasets")
    pf.prefetch(hub, "sklearn/iris", root)
    return root


def secrets_path(ep: Episode) -> str:
    """The host path of the answers as the old code showed it: a path an attacker learns from ps or $GYMFORGE_SECRETS."""
    return str(ep.env.run_dir / "secrets")


def plant(ep: Episode, files: dict[str, str]) -> None:
    for rel, text in files.items():
        ep.write(rel, text)


def submit_code(ep: Episode, kind: str) -> None:
    name, source = P.submission(ep.entry, kind, secrets_path(ep), str(ep.canaries.dir))
    ep.write(name, source)


# == 1. shadowed imports =========================================================================================


@pytest.mark.parametrize("entry_name, backend_name", cases("shadowed_imports"))
def test_shadowed_imports(entry_name: str, backend_name: str, backend, honest, tmp_path: Path) -> None:
    """json.py, csv.py, yaml.py, argparse.py, numpy/, gymforge_eval.py, sitecustomize.py ... in the workspace,
    each printing a perfect metrics line (and the answers, if it reaches them) and exiting 0."""
    with episode(entry_name, backend, tmp_path) as ep:
        ep.make_honest()
        plant(ep, P.shadow_modules(ep.entry, secrets_path(ep)))
        assert_honest(ep.evaluate(), honest)
        assert_no_leak(ep)


# == 2. fake metric lines, dangling partial lines, monkeypatching the scorer =====================================


@pytest.mark.parametrize("entry_name, backend_name, kind",
                         cases("submission_output", CODE, extra=[("fake_line",), ("partial_line",), ("monkeypatch",)]))
def test_submission_counterfeits_the_metrics(entry_name: str, backend_name: str, kind: str, backend, honest,
                                             tmp_path: Path) -> None:
    """The submitted code (imported module, unpickled model, LM module) writes a perfect metrics line to every
    output it reaches and exits, or leaves a dangling partial line after one, or patches the scorer's functions
    and builtins through __main__; otherwise it is the honest submission."""
    with episode(entry_name, backend, tmp_path) as ep:
        ep.make_honest()
        submit_code(ep, kind)
        assert_honest(ep.evaluate(), honest)
        assert_no_leak(ep)


@pytest.mark.parametrize("entry_name, backend_name", cases("csv_injected_line", ("csv",)))
def test_csv_submission_with_an_embedded_metrics_line(entry_name: str, backend_name: str, backend, honest,
                                                      tmp_path: Path) -> None:
    """A CSV whose quoted fields hold newlines and a perfect metrics line, so that an evaluator that echoes its
    input (in an error) prints the line; and one with the line after the honest rows."""
    with episode(entry_name, backend, tmp_path) as ep:
        ep.make_honest()
        line = ep.entry.perfect_json
        rows = (ep.env.workspace / "submission.csv").read_text()
        ep.write("submission.csv", f'"id\n{line}\n","cluster\n{line}\n"\n' + rows.split("\n", 1)[1])
        assert_honest(ep.evaluate(), honest)
        ep.write("submission.csv", rows + f"{line}\n")
        assert_honest(ep.evaluate(), honest)
        assert_no_leak(ep)


@pytest.mark.parametrize("entry_name, backend_name", cases("random_state", ("python",)))
def test_submission_sets_the_scorers_random_state(entry_name: str, backend_name: str, backend, tmp_path: Path) -> None:
    """coinGuess (fixture, PythonSubmissionTasks): the scorer draws fair coin flips with the global `random`
    generator after asking the submission for a guess. A submission that reseeds its own generator knows the
    next flip if the scorer adopts the generator state the submission sends back with each reply."""
    from attacks.harness import FIXTURES, Entry

    entry = Entry("python", FIXTURES, "coinGuess", 0, None, "guesser", "accuracy", 1.0, "none")
    ep = Episode(entry, backend, tmp_path)
    try:
        ep.write("guesser.py", """\
            import random


            def guess(i):
                random.seed(1000 + i)
                return random.Random(1000 + i).randint(0, 1)
            """)
        outcome = ep.evaluate()
    finally:
        ep.close()
    assert outcome.metrics is None or outcome.metrics["accuracy"] < 0.75, (
        f"the submission predicted the scorer's coin flips: {outcome.metrics}")


# == 3. held-out answers within reach ============================================================================


@pytest.mark.parametrize("entry_name, backend_name", cases("symlinked_artefact"))
def test_artefact_symlinked_to_the_answers(entry_name: str, backend_name: str, backend, honest,
                                           tmp_path: Path) -> None:
    """The artefact (submission.csv, coloring.py, config.yaml/model.pkl, lm.py/model.json) is a symlink to the
    answers: at /answers, at the host secrets path, or through /proc/self/root; a hard link is tried too."""
    with episode(entry_name, backend, tmp_path) as ep:
        ep.make_honest()
        artefact = {"csv": "submission.csv", "python": "coloring.py", "model": "model.pkl", "kde": "model.yaml",
                    "lm": "model.json"}[entry_name]
        answers = ep.entry.answers
        for target in [f"/answers/{answers}", f"{secrets_path(ep)}/{answers}", f"/proc/self/root/answers/{answers}",
                       f"/proc/1/root{secrets_path(ep)}/{answers}"]:
            ep.sh(f"rm -f {artefact}; ln -s '{target}' {artefact}; ln '{target}' hard.txt 2>&1; ls -l {artefact}")
            assert_honest(ep.evaluate(), honest)
        if entry_name == "csv":
            outcome = ep.evaluate()
            assert outcome.metrics is None or outcome.metrics[ep.entry.metric] != ep.entry.perfect
        assert_no_leak(ep)


@pytest.mark.parametrize("entry_name, backend_name", cases("submission_reads_answers", CODE))
def test_submission_reads_the_answers(entry_name: str, backend_name: str, backend, honest, tmp_path: Path) -> None:
    """The submitted code looks for the answers everywhere ($GYMFORGE_SECRETS, /answers, the host secrets path,
    /proc/*/environ, cmdline, root, cwd and open fds of the scorer) and, if found, scores perfectly with them
    and copies them to stdout, stderr, the workspace, HF_HOME, /tmp and $HOME."""
    with episode(entry_name, backend, tmp_path) as ep:
        ep.make_honest()
        submit_code(ep, "steal")
        assert_honest(ep.evaluate(), honest)
        ep.sh("cat exfil.txt /tmp/exfil.txt \"$HOME/exfil.txt\" 2>&1 | head -c 20000")
        assert_no_leak(ep)


@pytest.mark.parametrize("entry_name, backend_name", cases("proc_scan"))
def test_session_scans_proc_during_the_evaluation(entry_name: str, backend_name: str, backend, honest,
                                                  tmp_path: Path) -> None:
    """While the evaluation runs, a process in the agent's session reads every /proc/*/cmdline, environ, root
    and open fd it can (what `ps -ef` shows, and more) looking for the answers or the path to them."""
    with episode(entry_name, backend, tmp_path) as ep:
        ep.make_honest()
        ep.write("scan.py", P.PROC_SCANNER)
        t0 = time.monotonic()
        ep.sh(f"nohup python scan.py 2.5 {ep.entry.answers} {secrets_path(ep)} > scan.log 2>&1 &")
        time.sleep(0.3)
        outcome = ep.evaluate()
        time.sleep(max(0.0, 2.6 - (time.monotonic() - t0)))
        for _ in range(50):
            if (ep.env.workspace / "scan.log").exists() and (ep.env.workspace / "scan.log").stat().st_size:
                break
            time.sleep(0.1)
        log = ep.sh("cat scan.log").output
        assert "cmdline:" in log, f"the scanner did not run: {log[-300:]!r}"
        assert_honest(outcome, honest)
        assert_no_leak(ep)
        assert "GYMFORGE_SECRETS" not in log, "the evaluation's environment is visible to the session"
        for path in host_paths(tmp_path):
            assert path not in log, f"a host path is visible in /proc from the session: {path}"


@pytest.mark.parametrize("entry_name, backend_name", cases("failing_evaluation_prints_answers"))
def test_failing_evaluation_prints_the_answers(entry_name: str, backend_name: str, backend, honest,
                                               tmp_path: Path) -> None:
    """Shadow modules (and, for code entrypoints, the submission) print the answers if they reach them, then make
    the evaluation fail: whatever the agent is shown of a failed evaluation must not hold them."""
    with episode(entry_name, backend, tmp_path) as ep:
        ep.make_honest()
        if entry_name in CODE:
            submit_code(ep, "steal_and_crash")
            assert_honest(ep.evaluate(), honest)
            assert_no_leak(ep)
        plant(ep, P.crashing_shadow(ep.entry, secrets_path(ep)))
        assert_honest(ep.evaluate(), honest)
        assert_no_leak(ep)


@pytest.mark.parametrize("entry_name, backend_name", cases("forged_status"))
def test_forged_status_shows_the_answers(entry_name: str, backend_name: str, backend, honest, tmp_path: Path) -> None:
    """Shadow modules that, wherever they get to run next to the answers, write the answers into the scorer's
    status record (whose error field the agent is shown) and exit."""
    with episode(entry_name, backend, tmp_path) as ep:
        ep.make_honest()
        plant(ep, P.status_shadow(ep.entry, secrets_path(ep)))
        assert_honest(ep.evaluate(), honest)
        assert_no_leak(ep)


@pytest.mark.parametrize("entry_name, backend_name", cases("heldout_inputs_leak", ("python", "lm")))
def test_submission_leaks_the_heldout_inputs_it_is_given(entry_name: str, backend_name: str, backend, honest,
                                                         tmp_path: Path) -> None:
    """The scorer passes held-out data to the submission (graphColoring's test graphs are its whole secret; an LM
    is called on the held-out text). The submission prints its arguments to stdout and stderr and stores them
    in the workspace, /tmp, $HOME and HF_HOME: none of that may reach the agent."""
    with episode(entry_name, backend, tmp_path) as ep:
        ep.make_honest()
        submit_code(ep, "inputs")
        assert_honest(ep.evaluate(), honest)
        ep.sh("cat exfil.txt /tmp/exfil.txt \"$HOME/exfil.txt\" 2>&1 | head -c 20000")
        assert_no_leak(ep, heldout_input_markers(ep.entry))


@pytest.mark.slow
@pytest.mark.parametrize("entry_name, backend_name", cases("shared_hf_home"))
def test_evaluation_copies_secrets_into_the_shared_hf_home(entry_name: str, backend_name: str, backend, honest,
                                                           hub_cache: Path, tmp_path: Path) -> None:
    """A task that also loads a hub dataset gets a writable HF_HOME. The evaluation's code (shadow modules; the
    submission for code entrypoints) copies the answers and its inputs there; the agent's next session reads it."""
    entry = ENTRIES[entry_name]
    task_yaml, root = with_hub_dataset(entry, tmp_path / "variant", "sklearn/iris")
    with episode(entry_name, backend, tmp_path, task_yaml=task_yaml, root=root, dataset_cache=hub_cache) as ep:
        assert ep.env.run_env.get("HF_HOME"), "the variant task did not get an HF_HOME"
        ep.make_honest()
        if entry_name in CODE:
            submit_code(ep, "steal")
            assert_honest(ep.evaluate(), honest)
            submit_code(ep, "inputs_quiet")
            assert_honest(ep.evaluate(), honest)
        plant(ep, P.crashing_shadow(ep.entry, secrets_path(ep)))
        assert_honest(ep.evaluate(), honest)
        ep.close()
        ep.session = ep.env.open_session()
        ep.sh('ls -laR "$HF_HOME" 2>&1 | head -100; find "$HF_HOME" -name "exfil*" -exec cat {} + 2>&1 | head -c 20000')
        assert_no_leak(ep, heldout_input_markers(ep.entry))


# == 4. races against host-side steps running as root =============================================================


def _start_swapper(ep: Episode, seconds: float, files: int = 1) -> None:
    """d/ (agent-owned, f.txt and `files` more) and s -> the canary directory, swapped continuously in the
    background with renameat2(RENAME_EXCHANGE)."""
    ep.write("swap.py", P.SWAPPER)
    ep.sh(f"mkdir -p d && echo benign > d/f.txt && for i in $(seq {files}); do echo x > d/g$i.txt; done; "
          f"ln -sfn '{ep.canaries.dir}' s && (nohup python swap.py d s {seconds} > swap.log 2>&1 &)")


def _stop_swapper(ep: Episode) -> str:
    for _ in range(100):
        log = (ep.env.workspace / "swap.log").read_text() if (ep.env.workspace / "swap.log").exists() else ""
        if "swaps" in log:
            return log
        time.sleep(0.1)
    return ""


@pytest.mark.slow
@pytest.mark.parametrize("entry_name, backend_name", cases("race_file_tools", ("csv",)))
def test_race_file_tools_against_rename_exchange(entry_name: str, backend_name: str, backend, tmp_path: Path) -> None:
    """While d/ and a symlink to a host directory swap places, the file tools (run on the host) open, edit,
    create, insert and search under d/: none may read, change or create a host file. (The tools do not depend on
    the entrypoint; they run against the csv task's workspace.)"""
    with episode(entry_name, backend, tmp_path) as ep:
        _start_swapper(ep, 3)
        end, n = time.time() + 2.5, 0
        while time.time() < end:
            n += 1
            ep.tool("open d/f.txt")
            ep.tool("edit 1:1\nPWNED\nend_of_edit")
            ep.tool("insert 0\nPWNED\nend_of_insert")
            ep.tool(f"create d/new{n}.txt")
            ep.tool("search_file CANARY d/f.txt")
            ep.tool("search_dir CANARY d")
            ep.tool("find_file '*.txt' d")
            ep.tool("open d/secret.txt")
            ep.tool("open d/sub/inner.txt")
        log = _stop_swapper(ep)
        assert "swaps" in log and int(log.split()[1]) > 100, f"the swapper did not run: {log!r}"
        assert_no_leak(ep)


@pytest.mark.slow
@pytest.mark.parametrize("entry_name, backend_name", cases("race_evaluation_host_steps"))
def test_race_evaluation_host_steps(entry_name: str, backend_name: str, backend, honest, tmp_path: Path) -> None:
    """While d/ and a symlink to a root-owned host directory swap places, evaluations and new sessions run
    again and again: the host's steps before them (recursive chown, the artefact copy into the scorer's
    snapshot, mount points) must not chown, copy or touch the host directory. The submission (code entrypoints)
    prints what the evaluation's copy of d/ holds."""
    with episode(entry_name, backend, tmp_path) as ep:
        ep.make_honest()
        if entry_name in CODE:
            submit_code(ep, "race_reader")
        _start_swapper(ep, 3, files=300)
        end = time.time() + 2
        outcomes = []
        while time.time() < end:
            outcomes.append(ep.evaluate())
            ep.env.open_session().close()
        log = _stop_swapper(ep)
        assert "swaps" in log, f"the swapper did not run: {log!r}"
        for outcome in outcomes:
            assert_honest(outcome, honest)
        assert_no_leak(ep)


@pytest.mark.parametrize("entry_name, backend_name", cases("channel_symlinks", CODE))
def test_symlinks_planted_where_the_host_writes(entry_name: str, backend_name: str, backend, honest,
                                                tmp_path: Path) -> None:
    """The submission plants symlinks to host files in the directories it shares with the host during the
    evaluation (the gymforge_eval channel): names the host writes after the run (`done`) must not lead the host,
    running as root, to truncate or create a host file."""
    with episode(entry_name, backend, tmp_path) as ep:
        ep.make_honest()
        submit_code(ep, "channel_symlink")
        assert_honest(ep.evaluate(), honest)
        assert_no_leak(ep)


@pytest.mark.parametrize("entry_name, backend_name", cases("setuid_in_workspace", ("csv",)))
def test_no_setuid_root_file_lands_on_the_host(entry_name: str, backend_name: str, backend, tmp_path: Path) -> None:
    """The session copies a shell and Python into the workspace and sets their setuid and setgid bits: the host
    path of the workspace must not end up holding a setuid or setgid file owned by root (a root shell for any
    host user who can reach the run directory). (Session-level: the same for every entrypoint.)"""
    with episode(entry_name, backend, tmp_path) as ep:
        ep.sh('cp /bin/sh ./sh; cp "$(command -v python3)" ./py; chmod 6755 ./sh ./py; ls -l sh py')
        found = [f"{p} (uid {st.st_uid}, mode {oct(st.st_mode)})" for p in ep.env.workspace.rglob("*")
                 if not p.is_symlink() and (st := p.stat()).st_mode & (stat.S_ISUID | stat.S_ISGID)
                 and (st.st_uid == 0 or st.st_gid == 0)]
        assert not found, f"setuid/setgid root files on the host: {found}"


# == 5. denial of service: loops, FIFOs, sparse giants, bad ids =====================================================


@pytest.mark.parametrize("entry_name, backend_name", cases("symlink_loops"))
def test_symlink_loops_fifos_and_odd_files_are_observations(entry_name: str, backend_name: str, backend,
                                                            honest, tmp_path: Path) -> None:
    """`ln -s loop loop; open loop` and friends (two-link loops, a FIFO, a file replaced by a loop after it was
    opened, a directory, a 300-character name) give observations, never a crash; an artefact that is a loop or
    a FIFO fails the evaluation cleanly and quickly."""
    with episode(entry_name, backend, tmp_path) as ep:
        ep.make_honest()
        ep.sh("ln -s loop loop; ln -s a b; ln -s b a; mkfifo fifo; mkdir -p dir; echo hi > opened.txt")
        long = "x" * 300
        for action in ["open loop", "open a", "open loop/x", "open fifo", "open dir", f"open {long}",
                       "create loop/x", "create a", "search_file x loop", "search_file x fifo", "search_dir x",
                       "find_file x", "search_dir x loop", "find_file x a", "goto 1", "open opened.txt"]:
            obs = ep.tool(action)
            assert isinstance(obs, str) and obs, action
        ep.sh("truncate -s 20G huge.txt; head -c 15000000 /dev/zero | tr '\\0' '\\n' > lines.txt")
        for action in ["open huge.txt", "search_file x huge.txt", "search_dir x", "find_file huge.txt",
                       "open lines.txt 7000000", "search_file x lines.txt"]:
            t0 = time.monotonic()
            assert isinstance(ep.tool(action), str), action
            assert time.monotonic() - t0 < 20, f"{action} took {time.monotonic() - t0:.0f} s"
        ep.sh("rm -f huge.txt lines.txt opened.txt; ln -s opened.txt opened.txt")
        for action in ["edit 1:1\nx\nend_of_edit", "insert 0\nx\nend_of_insert", "scroll_down", "goto 1"]:
            assert isinstance(ep.tool(action), str), action
        artefact = {"csv": "submission.csv", "python": "coloring.py", "model": "config.yaml", "kde": "model.yaml",
                    "lm": "lm.py"}[entry_name]
        for make in [f"rm -f {artefact}; ln -s {artefact} {artefact}", f"rm -f {artefact}; mkfifo {artefact}"]:
            ep.sh(make)
            t0 = time.monotonic()
            assert_honest(ep.evaluate(timeout=120), honest)
            assert time.monotonic() - t0 < 100
        assert_no_leak(ep)


@pytest.mark.slow
@pytest.mark.parametrize("entry_name, backend_name", cases("sparse_giant"))
def test_sparse_giant_in_the_workspace(entry_name: str, backend_name: str, backend, honest, tmp_path: Path) -> None:
    """A 40 GB sparse file in the workspace (and one as the artefact): the evaluation's copy of the workspace must
    not fill the host's disk or hang; it scores honestly, or fails cleanly, within a minute."""
    with episode(entry_name, backend, tmp_path) as ep:
        ep.make_honest()
        ep.sh("truncate -s 40G big.bin 2>&1; ls -la big.bin")
        t0 = time.monotonic()
        assert_honest(ep.evaluate(timeout=120), honest)
        assert time.monotonic() - t0 < 60
        artefact = {"csv": "submission.csv", "python": "coloring.py", "model": "model.pkl", "kde": "model.yaml",
                    "lm": "model.json"}[entry_name]
        ep.sh(f"truncate -s 40G {artefact} 2>&1")
        assert_honest(ep.evaluate(timeout=120), honest)
        used = int(subprocess.run(["du", "-sk", str(tmp_path)], capture_output=True, text=True, check=True).stdout.split()[0])
        assert used < 2 << 20, f"{used} KiB on the host disk after the evaluations"
        assert_no_leak(ep)


def test_task_id_of_300_characters_fails_validation(tmp_path: Path) -> None:
    """A task id of 300+ characters is refused when the config is read, not later with a raw OSError."""
    from gymforge.tasks.environment import TaskEnvironment

    long_id = "t" * 300
    root = tmp_path / "root"
    (root / "configs" / "tasks").mkdir(parents=True)
    src = ENTRIES["python"]
    shutil.copytree(src.root / "data" / src.task_id, root / "data" / src.task_id)
    text = src.yaml.read_text().replace(f"id: {src.task_id}", f"id: {long_id}")
    task = root / "configs" / "tasks" / "long.yaml"
    task.write_text(text)
    with pytest.raises(Exception) as info:
        env = TaskEnvironment(task, root=root, sandbox=get_sandbox("local"), run_dir=tmp_path / "run", gpus=0)
        env.install()
    assert not isinstance(info.value, OSError), f"raw OSError instead of a validation error: {info.value!r}"
    assert "64" in str(info.value) or "id" in str(info.value).lower(), info.value


# == 6. limits per episode ===========================================================================================


def _limits(**sizes: int) -> Limits:
    """Limits with memory 1 GiB and, where Limits has such fields, small caps for /tmp, the workspace and open files."""
    fields = {"memory_mb": 1024, "cpu_seconds": 600, "max_processes": 256}
    names = Limits.model_fields
    for key, value in sizes.items():
        fields |= {n: value for n in names if key in n}
    return Limits(**fields)


@pytest.mark.slow
@pytest.mark.parametrize("entry_name, backend_name", cases("memory_across_processes"))
def test_memory_limit_holds_across_processes(entry_name: str, backend_name: str, backend, tmp_path: Path) -> None:
    """Three processes of 700 MiB each under a 1 GiB limit: at most one may hold its memory at a time."""
    with episode(entry_name, backend, tmp_path, limits=_limits()) as ep:
        ep.write("hogs.py", P.MEMORY_HOGS)
        out = ep.sh("python hogs.py 3 700; rm -f /tmp/held*", 120).output
        held = int(out.split("HELD", 1)[1].split()[0]) if "HELD" in out else 0
        assert held * 700 <= 1024, f"{held} processes held 700 MiB each under a 1024 MiB limit: {out[-300:]}"
        assert ep.sh("echo alive").output.strip().endswith("alive")
        assert_no_leak(ep)


@pytest.mark.slow
@pytest.mark.parametrize("entry_name, backend_name", cases("memory_session_and_evaluation", ("python", "model")))
def test_memory_limit_spans_session_and_evaluation(entry_name: str, backend_name: str, backend, honest,
                                                   tmp_path: Path) -> None:
    """The session holds 700 MiB in the background while the evaluation's submission takes another 700 MiB, under
    a 1 GiB limit per episode: both must not hold at once. (The submission scores honestly only when its
    allocation succeeded, so the score tells, whatever the agent is shown of its output.)"""
    with episode(entry_name, backend, tmp_path, limits=_limits()) as ep:
        ep.make_honest()
        submit_code(ep, "alloc")
        ep.sh("(nohup python -c \"import time; b = b'x' * (700 << 20); open('holding', 'w').close(); "
              "time.sleep(30)\" > /dev/null 2>&1 &); for i in $(seq 100); do [ -e holding ] && break; sleep 0.1; done")
        assert (ep.env.workspace / "holding").exists(), "the session could not hold 700 MiB at all"
        outcome = ep.evaluate()
        alive = ep.sh("pgrep -f 'time.sleep.30.' >/dev/null && echo HOLDER-ALIVE").output
        assert not (outcome.metrics == honest and "HOLDER-ALIVE" in alive), (
            "the session and the evaluation held 1400 MiB together under a 1024 MiB episode limit")


@pytest.mark.slow
@pytest.mark.parametrize("entry_name, backend_name", cases("fill_tmp"))
def test_tmp_is_bounded(entry_name: str, backend_name: str, backend, tmp_path: Path) -> None:
    """Writing 3 GiB to /tmp (files of 400 MiB, under the file-size limit) must stop well before: /tmp is host RAM
    (bwrap's tmpfs) or host disk (docker's writable layer). Only the files written are counted: a checkout under
    /tmp puts its read-only venv under the sandbox's /tmp too, at its host path."""
    with episode(entry_name, backend, tmp_path, limits=_limits(tmp=512, disk=1024)) as ep:
        out = ep.sh("for i in $(seq 8); do head -c 400M /dev/zero > /tmp/fill$i || break; done; "
                    "du -smc /tmp/fill* | tail -n 1 | cut -f1; rm -f /tmp/fill*", 300).output
        written = int(out.split()[-1]) if out.split() and out.split()[-1].isdigit() else -1
        assert 0 <= written < 2048, f"/tmp took {written} MiB: {out[-300:]}"
        assert_no_leak(ep)


@pytest.mark.slow
@pytest.mark.parametrize("entry_name, backend_name", cases("fill_workspace"))
def test_workspace_disk_is_bounded(entry_name: str, backend_name: str, backend, tmp_path: Path) -> None:
    """Allocating 6 GiB of real blocks in the workspace (fallocate, 900 MiB per file, then a background dd that
    keeps writing after its command returned) must stop at the 1 GiB cap itself, not some seconds later: the
    blocks never reach the host's disk (where the cap is a file system of its own; elsewhere it is polled and
    this attack overshoots, listed as open)."""
    if not disk.available():
        pytest.xfail("no file system of its own for the workspace here (not root, or no loop devices): the cap is "
                     "polled every 2 s and fallocate overshoots it")
    with episode(entry_name, backend, tmp_path, limits=_limits(disk=1024, workspace=1024, tmp=512)) as ep:
        out = ep.sh("for i in $(seq 7); do fallocate -l 900M fill$i.bin 2>&1 || "
                    "head -c 900M /dev/zero > fill$i.bin || break; done; du -sm . | cut -f1", 300)
        used = sum(p.stat().st_blocks * 512 for p in ep.env.workspace.glob("fill*.bin")) >> 20
        assert used <= 1024 + 16, f"the workspace took {used} MiB under a 1024 MiB cap: {out.output[-300:]}"
        assert out.limit and out.limit.startswith("disk"), f"the limit is not named: {out.limit!r}"
        ep.sh("rm -f fill*.bin")
        ep.sh("(nohup bash -c 'for i in 1 2 3 4 5; do dd if=/dev/zero of=bg$i.bin bs=1M count=600; done' "
              "> /dev/null 2>&1 &); sleep 0.2")
        for _ in range(100):  # the writer ends when the file system refuses it
            if "RUNNING" not in ep.sh("pgrep -f 'of=bg' >/dev/null && echo RUNNING").output:
                break
            time.sleep(0.1)
        used = sum(p.stat().st_blocks * 512 for p in ep.env.workspace.glob("bg*.bin")) >> 20
        assert used <= 1024 + 16, f"a background writer put {used} MiB in the workspace under a 1024 MiB cap"
        assert ep.sh("rm -f bg*.bin && echo ok > after.txt && cat after.txt").output.strip().endswith("ok")
        assert_no_leak(ep)


@pytest.mark.slow
@pytest.mark.parametrize("entry_name, backend_name", cases("fill_hf_home", ("csv",)))
def test_the_writable_hf_home_is_bounded_too(entry_name: str, backend_name: str, backend, hub_cache: Path,
                                             tmp_path: Path) -> None:
    """A hub task's session has a second writable place outside the workspace, its HF_HOME (on the host's disk
    under the run dir): 3 GiB written there in files under the file-size limit must stop at the disk cap too.
    (Session-level: the same for every entrypoint.)"""
    if not disk.available():
        pytest.xfail("no file system of its own for HF_HOME here: nothing bounds it but the file-size limit")
    task_yaml, root = with_hub_dataset(ENTRIES[entry_name], tmp_path / "variant", "sklearn/iris")
    with episode(entry_name, backend, tmp_path, task_yaml=task_yaml, root=root, dataset_cache=hub_cache,
                 limits=_limits(disk=1024, workspace=1024, tmp=512)) as ep:
        home = tmp_path / "run" / "hf-home"
        assert ep.env.run_env.get("HF_HOME") and home.is_dir()
        out = ep.sh('for i in 1 2 3 4 5; do head -c 600M /dev/zero > "$HF_HOME/fill$i" || break; done; '
                    'ls "$HF_HOME"', 300).output
        used = sum(p.stat().st_blocks * 512 for p in home.glob("fill*")) >> 20
        assert used <= 1024 + 16, f"HF_HOME took {used} MiB under a 1024 MiB cap: {out[-300:]}"
        mounts = ep.sh('grep " $HF_HOME " /proc/self/mountinfo').output
        assert mounts.strip() and str(tmp_path.resolve()) not in mounts, mounts  # a file system's root, no host path
        ep.sh('rm -f "$HF_HOME"/fill*; echo kept > "$HF_HOME/kept.txt"')
    assert (home / "kept.txt").read_text() == "kept\n"  # back on the host's disk after the session


@pytest.mark.slow
@pytest.mark.parametrize("entry_name, backend_name", cases("open_files"))
def test_open_files_are_bounded_per_episode(entry_name: str, backend_name: str, backend, tmp_path: Path) -> None:
    """Eight processes that raise RLIMIT_NOFILE to the hard limit and open 40,000 fds each (320,000 in all)."""
    with episode(entry_name, backend, tmp_path, limits=_limits(open_files=4096, nofile=4096, files=4096)) as ep:
        ep.write("fds.py", P.FD_HOGS)
        out = ep.sh("python fds.py 8 40000", 120).output
        total = int(out.split("FDS", 1)[1].split()[0]) if "FDS" in out else 0
        assert total <= 65536, f"the episode held {total} open files at once: {out[-300:]}"
        assert_no_leak(ep)


# == 7. weak fallbacks ================================================================================================


@pytest.mark.parametrize("entry_name, backend_name", cases("weak_fallback", backends=("local",)))
def test_weak_confinement_is_refused_unless_allowed(entry_name: str, backend_name: str, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Without bubblewrap (or asking for `unshare-net` / `none`), untrusted code must not run unless weak
    confinement is explicitly allowed: the agent would see the checkout and the held-out labels."""
    from gymforge.sandbox import local

    marker = tmp_path / "ran-unconfined"
    ran: list[str] = []
    refused: list[str] = []
    monkeypatch.setattr(local, "_bwrap_works", lambda: False)
    for confinement in ("auto", "unshare-net", "none"):
        try:
            backend = get_sandbox("local", confinement=confinement)
            ep = Episode(ENTRIES[entry_name], backend, tmp_path / confinement)
        except Exception as err:  # noqa: BLE001 - refused: any clear error
            refused.append(f"{confinement}: {err}")
            continue
        try:
            ep.sh(f"cat {ENTRIES[entry_name].secret_source} > {marker}; touch {marker}")
            if marker.exists():
                ran.append(confinement)
                marker.unlink()
        finally:
            ep.close()
    assert not ran, f"untrusted code ran with weak confinement {ran} although it was not allowed"
    assert any("allow_weak_confinement" in r or "bubblewrap" in r for r in refused), refused  # says how to proceed
    allowed = get_sandbox("local", confinement="none", allow_weak_confinement=True)  # the explicit opt-in still works
    ws = tmp_path / "allowed"
    ws.mkdir()
    assert allowed.run_once(ws, ["true"], timeout=30, limits=LIMITS).exit_code == 0


# == 8. host paths in what the agent sees ===============================================================================


@pytest.mark.parametrize("entry_name, backend_name", cases("host_paths_session", ("csv",)))
def test_no_host_path_in_the_session(entry_name: str, backend_name: str, backend, tmp_path: Path) -> None:
    """ps -ef, $PATH, env, /proc/*/cmdline, /proc/self/mountinfo, Python's own paths, file-tool errors: no host
    path (the run directory, the checkout, the host Python prefix). (Session-level: same for every entrypoint.)"""
    with episode(entry_name, backend, tmp_path) as ep:
        seen = {}
        for command in ["ps -ef", "echo $PATH", "env", "cat /proc/*/cmdline | tr '\\0' ' '",
                        "cat /proc/self/mountinfo", "python -c 'import sys; print(sys.executable, sys.prefix, sys.path)'",
                        "pwd -P; ls -la / /workspace", "python -c 'import numpy; numpy.nope'"]:
            seen[command] = ep.sh(command).output
        for action in [f"open {'y' * 300}", "open missing/x.txt", "open /etc/passwd", "create /tmp/x",
                       "search_dir x /nonexistent"]:
            seen[action] = ep.tool(action)
        leaks = {k: p for k, v in seen.items() for p in host_paths(tmp_path) if p in v}
        assert not leaks, f"host paths seen by the agent: {leaks}"


@pytest.mark.parametrize("entry_name, backend_name", cases("run_dir_in_mountinfo", ("csv",)))
def test_no_run_dir_in_the_mount_table(entry_name: str, backend_name: str, backend, tmp_path: Path) -> None:
    """/proc/self/mountinfo names each bind mount's source path within its file system: the workspace and the
    data under it must not show the run directory (the workspace is a file system of its own where the disk cap
    is hard). (Session-level: the same for every entrypoint.)"""
    if not disk.available():
        pytest.xfail("no file system of its own for the workspace here: its bind source is the host run dir")
    with episode(entry_name, backend, tmp_path) as ep:
        out = ep.sh("cat /proc/self/mountinfo").output
        assert " /workspace " in out, out
        leaks = [line for line in out.splitlines() if str(tmp_path) in line or str(tmp_path.resolve()) in line]
        assert not leaks, f"the run directory in the mount table: {leaks}"


@pytest.mark.slow
@pytest.mark.parametrize("entry_name, backend_name", cases("host_paths_hub_session", ("csv",)))
def test_no_host_path_in_a_hub_task_session(entry_name: str, backend_name: str, backend, hub_cache: Path,
                                            tmp_path: Path) -> None:
    """A task that loads a hub dataset: $HF_HOME, env, and the links in HF_HOME/datasets show no host path (the run
    directory, the dataset cache). (Session-level: the same for every entrypoint.)"""
    task_yaml, root = with_hub_dataset(ENTRIES[entry_name], tmp_path / "variant", "sklearn/iris")
    with episode(entry_name, backend, tmp_path, task_yaml=task_yaml, root=root, dataset_cache=hub_cache) as ep:
        out = ep.sh('echo "$HF_HOME $HF_DATASETS_CACHE"; env; ls -la "$HF_HOME/datasets"').output
        leaks = [p for p in [*host_paths(tmp_path), str(hub_cache)] if p in out]
        assert not leaks, f"host paths seen by the agent: {leaks}: {out[-500:]}"


@pytest.mark.parametrize("entry_name, backend_name", cases("host_paths_evaluation"))
def test_no_host_path_in_evaluation_errors(entry_name: str, backend_name: str, backend, honest,
                                           tmp_path: Path) -> None:
    """A failing evaluation (a broken artefact; for code entrypoints, a submission that prints its environment,
    sys.path, mounts and processes and then raises) shows the agent no host path and no secrets path."""
    with episode(entry_name, backend, tmp_path) as ep:
        ep.make_honest()
        if entry_name in CODE:
            submit_code(ep, "host_paths")
        elif entry_name == "csv":
            ep.write("submission.csv", "id,cluster\n0,0\n")
        outcome = ep.evaluate()
        assert_honest(outcome, honest)
        seen = "\n".join(ep.visible)
        leaks = [p for p in host_paths(tmp_path) if p in seen]
        assert not leaks, f"host paths seen by the agent: {leaks}"
        assert "GYMFORGE_SECRETS" not in outcome.seen or "/answers" in outcome.seen
        assert_no_leak(ep)


# == a whole attack episode through `gymforge run-task --replay` ======================================================


def _reply(command: str) -> str:
    return f"DISCUSSION\nNext step.\n\n```\n{command}\n```\n"


@pytest.mark.parametrize("entry_name, backend_name", cases("replayed_episode", ("csv", "python", "model")))
def test_replayed_attack_episode(entry_name: str, backend_name: str, backend, honest, tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """One episode replayed through the agent loop (`run-task --replay`): the honest artefact, shadow modules and a
    submission that prints a perfect metrics line, reads the answers and plants symlinks; validate, submit. The
    recorded scores are the honest one and the trajectory holds no answer and no canary."""
    from attacks.harness import Canaries, answer_markers

    from gymforge.tools.run_task import run_task

    entry = ENTRIES[entry_name]
    canaries = Canaries(tmp_path / "host")
    secrets = str(tmp_path / "out" / "episode" / "secrets")
    replies = [_reply(entry.honest)] if entry.honest else []
    files = P.shadow_modules(entry, secrets)
    if entry_name in CODE:
        name, source = P.submission(entry, "fake_line", secrets, str(canaries.dir))
        files[name] = source
    for rel, text in files.items():
        replies.append(_reply(f"mkdir -p \"$(dirname {rel})\" && cat > {rel} <<'GYMFORGE_EOF'\n{text}\nGYMFORGE_EOF"))
    replies += [_reply("validate"), _reply("submit")]
    replay = tmp_path / "replay.json"
    replay.write_text(json.dumps(replies))
    if backend_name == "docker":  # run-task builds its own backend from DOCKER_HOST: the fixture's private daemon
        r = subprocess.run(["bash", str(REPO / "scripts" / "docker_sandbox.sh")], capture_output=True, text=True,
                           timeout=900, check=True)
        monkeypatch.setenv("DOCKER_HOST", r.stdout.strip().splitlines()[-1].removeprefix("DOCKER_HOST="))
    traj = run_task(entry.yaml, entry.root, out=tmp_path / "out", sandbox=backend_name, replay=replay, gpus=entry.gpus,
                    max_steps=len(replies) + 2)
    text = traj.read_text()
    info = json.loads(text)["info"]
    assert info["exit_status"], info  # the episode ended (submitted, or an evaluation error the agent was shown)
    for score in info["score"]:
        assert score == honest, f"counterfeit score {score} recorded (honest {honest})"
    for marker in answer_markers(entry):
        assert marker not in text, f"held-out data in the trajectory: {marker[:60]!r}"
    assert canaries.token not in text and not canaries.changes(), canaries.changes()
    assert info.get("flags"), "the attack episode (shadow modules, a submission reading /proc) was not flagged"
    assert info.get("confinement"), "the trajectory does not record the confinement it ran under"
