"""Runs an evaluation script as `__main__` and hands its stdout to the host (gymforge's scorer launcher).

Usage: python -I score.py OUT_DIR [--answers DIR] [--channel DIR] [--mlgym] SCRIPT [ARGS...]

The script's stdout goes to OUT_DIR/stdout[.RANK] and a record of how it ended to OUT_DIR/status[.RANK].json
(exit code, class of the uncaught exception), both written only when it is done. Its stderr is the sandbox's
output, which the host keeps for the task's author and never shows the agent. With --mlgym the script runs
as MLGym runs it (its directory first on sys.path); otherwise nothing of the workspace is importable.
--answers names the held-out answers' directory (GYMFORGE_SECRETS for the script), --channel the one where
the submission's sandbox listens (for gymforge_eval).
"""

import io
import json
import os
import runpy
import sys
import traceback


def main() -> int:
    out_dir, args = sys.argv[1], sys.argv[2:]
    options = {}
    while args and args[0] in ("--answers", "--channel"):
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
    rank = os.environ.get("RANK", "")
    suffix = f".{rank}" if rank else ""
    captured = io.StringIO()
    real_stdout = sys.stdout
    sys.stdout = captured
    sys.argv = args
    code, error = 0, None
    try:
        runpy.run_path(script, run_name="__main__")
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


def _write(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
