"""Runs an evaluation script as `__main__` and hands its stdout to the host (gymforge's scorer launcher).

Usage: python -I score.py OUT_DIR [--answers DIR] [--channel DIR] [--mlgym]
                         [--each PROBES_DIR ARTEFACT SECONDS [--wipe DIR]...] SCRIPT [ARGS...]

The script's stdout goes to OUT_DIR/stdout[.RANK] and a record of how it ended to OUT_DIR/status[.RANK].json
(exit code, class of the uncaught exception), both written only when it is done. Its stderr is the sandbox's
output, which the host keeps for the task's author and never shows the agent. With --mlgym the script runs
as MLGym runs it (its directory first on sys.path); otherwise nothing of the workspace is importable.
--answers names the held-out answers' directory (GYMFORGE_SECRETS for the script), --channel the one where
the submission's sandbox listens (for gymforge_eval).

--each scores several artefacts in this one sandbox (a task's evaluator probes): for each file N of
PROBES_DIR in turn, its bytes are written to ARTEFACT (a writable file, made read-only before the script
runs; "-": none, a Python task's scorer reads no artefact) and a forked child runs the script, with OUT_DIR/N/
as its OUT_DIR and its stdout and stderr in OUT_DIR/N/output. With --channel, child N reaches its submission
through CHANNEL/N (the host starts one submission sandbox per probe). The children fork from this process after
it has compiled the script and imported what the script imports at its top level (try and if blocks included) from
the standard library (but a few modules with effects on import), gymforge_eval and the scientific libraries (numpy,
pandas, scipy, sklearn: the second or so a fresh interpreter spends on them), so a child costs what the script
itself computes. A child runs the compiled script as `__main__` as runpy.run_path would (random and numpy seed
their global generators afresh after a fork, as a fresh interpreter would). After each child, everything it left
running is killed (this process is their subreaper), what it added to the --wipe directories (the sandbox's private
/tmp) is removed, and OUT_DIR/N/ended.json records its exit status, whether it ran past SECONDS and how long it
took. Only then is the next artefact written: the children never run side by side.
"""

import ast
import gc
import importlib
import io
import json
import os
import runpy
import select
import signal
import sys
import time
import traceback
import types

PRELOAD = ("numpy", "pandas", "scipy", "sklearn")  # side-effect-free to import, and the bulk of a scorer's start
# Standard-library modules that do something when imported (print, open a browser, touch the terminal) or that
# only make sense in an interpreter of their own: a child imports them itself.
NOT_PRELOADED = frozenset({"__hello__", "__phello__", "antigravity", "this", "idlelib", "turtle", "turtledemo",
                           "tkinter", "ensurepip", "venv", "pydoc", "site", "readline", "rlcompleter", "webbrowser",
                           "multiprocessing", "concurrent", "asyncio", "pdb", "code", "getpass", "tty", "pty", "curses"})
# What a module imports only when first used, in every child again unless imported before the fork: argparse's
# parser imports shutil (the terminal's width) and gettext's locale.
LAZY = {"argparse": ("shutil", "locale")}


def main() -> int:
    out_dir, args = sys.argv[1], sys.argv[2:]
    options, each, wipe = {}, None, []
    while args and args[0] in ("--answers", "--channel", "--each", "--wipe"):
        if args[0] == "--each":
            each, args = args[1:4], args[4:]
        elif args[0] == "--wipe":
            wipe.append(args[1])
            args = args[2:]
        else:
            options[args[0]], args = args[1], args[2:]
    mlgym = args[:1] == ["--mlgym"]
    if mlgym:
        args = args[1:]
    script = args[0]
    if "--answers" in options:
        os.environ["GYMFORGE_SECRETS"] = options["--answers"]
    if "--channel" in options:
        os.environ["GYMFORGE_CHANNEL"] = options["--channel"]
    here = os.path.dirname(os.path.abspath(__file__))
    if mlgym:
        sys.path[0] = os.path.dirname(os.path.abspath(script))
    else:
        # Only the standard library, site-packages and gymforge_eval: no script directory, no cwd.
        sys.path[:] = [here] + [p for p in sys.path if p and not p.startswith(("/workspace", here))]
    if each is not None:
        return score_each(out_dir, args, *each, wipe=wipe)
    rank = os.environ.get("RANK", "")
    return run_script(out_dir, args, suffix=f".{rank}" if rank else "")


def run_script(out_dir: str, args: list[str], suffix: str = "", compiled: types.CodeType | None = None) -> int:
    """Run `args[0]` as __main__ with `args` as sys.argv (`compiled`: its code, compiled before); its stdout and how
    it ended go to `out_dir`."""
    captured = io.StringIO()
    real_stdout = sys.stdout
    sys.stdout = captured
    sys.argv = args
    code, error = 0, None
    try:
        if compiled is None:
            runpy.run_path(args[0], run_name="__main__")
        else:
            _run_main(compiled, args[0])
    except SystemExit as exit_:
        if exit_.code is None or exit_.code == 0:
            code = 0
        elif isinstance(exit_.code, int):
            code, error = exit_.code, "SystemExit"
        else:
            print(exit_.code, file=sys.stderr)
            code, error = 1, "SystemExit"
    except BaseException as exc:  # noqa: BLE001 - every failure is reported by class
        traceback.print_exc()
        code, error = 1, type(exc).__name__
    finally:
        sys.stdout = real_stdout
    try:
        sys.stdout.flush()
    except OSError:
        pass
    _write(os.path.join(out_dir, "stdout" + suffix), captured.getvalue())
    _write(os.path.join(out_dir, "status" + suffix + ".json"), json.dumps({"exit": code, "error": error}))
    return code


def score_each(out_dir: str, args: list[str], probes: str, artefact: str, seconds: str, wipe: list[str]) -> int:
    """--each: one forked child per file of `probes`, in order (see the module's docstring)."""
    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
        return 3  # without it a child's daemons could outlive it: the host scores one artefact at a time instead
    compiled = preload(args[0])
    channel = os.environ.get("GYMFORGE_CHANNEL")
    before = {d: _tree(d) for d in wipe}
    gc.freeze()  # what is loaded stays shared with the children: their collector never writes to it
    for name in sorted(os.listdir(probes), key=lambda n: (len(n), n)):
        with open(os.path.join(probes, name), "rb") as f:
            data = f.read()
        if artefact != "-":
            os.chmod(artefact, 0o644)
            with open(artefact, "wb") as f:
                f.write(data)
            os.chmod(artefact, 0o444)
        mine = os.path.join(out_dir, name)
        os.mkdir(mine)
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:
            if channel is not None:
                os.environ["GYMFORGE_CHANNEL"] = os.path.join(channel, name)
            _child(mine, args, compiled)
        status, timed_out = _wait(pid, started + float(seconds))
        _end_descendants()
        for d in wipe:
            _empty(d, before[d])
        code = os.waitstatus_to_exitcode(status)
        _write(os.path.join(mine, "ended.json"), json.dumps(
            {"exit": code if code >= 0 else 128 - code, "timed_out": timed_out,
             "seconds": round(time.monotonic() - started, 3)}))
    return 0


def preload(script: str) -> types.CodeType | None:
    """`script` compiled (None where it cannot be read or compiled: each child meets that error itself, as alone),
    after importing the modules it imports at its top level that are in the standard library (but NOT_PRELOADED,
    with what LAZY names), gymforge_eval or among the PRELOAD libraries."""
    try:
        with io.open_code(script) as f:
            source = f.read()
        tree = ast.parse(source)
        compiled = compile(source, script, "exec")  # as runpy compiles it
    except (OSError, SyntaxError, ValueError):
        return None
    names = []
    for node in _top_level(tree.body):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
    for name in names + [m for n in names for m in LAZY.get(n, ())]:
        top = name.split(".")[0]
        if top in PRELOAD or top == "gymforge_eval" or (top in sys.stdlib_module_names and top not in NOT_PRELOADED):
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - the script meets the same error itself
                pass
    return compiled


def _top_level(body: list[ast.stmt]):
    """The statements that run when the module is imported: `body` and, within it, the blocks of try, if and with
    (`try: from gymforge_eval import ...`), not function or class bodies."""
    for node in body:
        yield node
        for block in ("body", "orelse", "finalbody"):
            if isinstance(node, (ast.Try, ast.If, ast.With)) and isinstance(getattr(node, block, None), list):
                yield from _top_level(getattr(node, block))
        for handler in getattr(node, "handlers", []) if isinstance(node, ast.Try) else []:
            yield from _top_level(handler.body)


def _run_main(compiled: types.CodeType, path: str) -> None:
    """`compiled` run as the script at `path` in a fresh `__main__` module (what runpy.run_path does with a file)."""
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __cached__=None, __package__="")
    sys.modules["__main__"] = main
    exec(compiled, main.__dict__)


def _child(out_dir: str, args: list[str], compiled: types.CodeType | None) -> None:
    fd = os.open(os.path.join(out_dir, "output"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    code = 1
    try:
        code = run_script(out_dir, args, compiled=compiled)
    finally:
        try:
            sys.stderr.flush()
        finally:
            os._exit(code)


def _wait(pid: int, deadline: float) -> tuple[int, bool]:
    """The child's wait status, and whether it was killed for running past `deadline`."""
    try:
        fd = os.pidfd_open(pid)  # readable once the child has ended: no polling
    except (AttributeError, OSError):
        fd = None
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return status, False
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                return os.waitpid(pid, 0)[1], True
            if fd is None:
                time.sleep(min(left, 0.01))
            else:
                select.select([fd], [], [], left)
    finally:
        if fd is not None:
            os.close(fd)


def _descendants() -> list[int]:
    me, parents = os.getpid(), {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found = []
    for pid in parents:
        p, hops = parents.get(pid), 0
        while p is not None and p != me and hops < 4096:
            p, hops = parents.get(p), hops + 1
        if p == me:
            found.append(pid)
    return found


def _end_descendants() -> None:
    """Kill and reap whatever the last child left running (orphans are re-parented to this subreaper)."""
    for _ in range(100):
        left = _descendants()
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        if not left:
            return
        time.sleep(0.01)


def _tree(folder: str) -> set[str]:
    """Every path beneath `folder` on its own file system: mounts inside it (a read-only venv under /tmp) are
    neither listed nor entered."""
    dev, found = os.lstat(folder).st_dev, set()
    for top, dirs, files in os.walk(folder):
        kept = []
        for name in dirs:
            path = os.path.join(top, name)
            try:
                if os.lstat(path).st_dev == dev:
                    kept.append(name)
                    found.add(path)
            except OSError:
                continue
        dirs[:] = kept
        found.update(os.path.join(top, name) for name in files)
    return found


def _empty(folder: str, keep: set[str]) -> None:
    """Remove what is beneath `folder` (on its own file system) and not in `keep`, deepest first."""
    for path in sorted(_tree(folder) - keep, key=len, reverse=True):
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                os.rmdir(path)
            else:
                os.unlink(path)
        except OSError:
            pass


def _write(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
