"""One Snakemake job, run as `gymforge --log <log> <command> ...`: its log, its scratch dir, its failure record.

- Log: the job writes `<log>` itself, and while it runs the same file is also linked as `<log>.attempt-N`.
  Snakemake deletes `<log>` before it reruns a job; the link keeps a failed or killed attempt's log. It is
  removed when the attempt succeeds, so only earlier, unsuccessful attempts leave `.attempt-N` files.
- Scratch: `atomic` builds temporary files and directories in `.<log stem>.scratch/` beside the log, which
  the job empties when it starts and removes when it ends: nothing temporary survives a `kill -9` followed
  by a successful rerun.
- Failure: a failed job writes `<log stem>.failed.json` (`status: failed`, a reason code and a one-line
  reason) and prints that line to the terminal Snakemake runs in and as the log's last line; a successful
  rerun removes it. `gymforge status` counts these records per stage by reason code.

The job travels in the environment: a process that replaces the job's process (`with-gpus` execs its
command) carries on as the job, and other gymforge processes the job starts record their own failures.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from gymforge.core import atomic
from gymforge.core.atomic import SCRATCH_ENV

JOB_LOG_ENV = "GYMFORGE_JOB_LOG"
_ATTEMPT_ENV = "GYMFORGE_JOB_ATTEMPT_LOG"
_OWNER_ENV = "GYMFORGE_JOB_PID"  # the pid that finishes the job (exec keeps it)
_TERMINAL_ENV = "GYMFORGE_JOB_TERMINAL_FD"
_ATTEMPT = re.compile(r"\.attempt-(\d+)$")


def current_job() -> str | None:
    """The running job as `<stage>/<item>` (its log path below `logs/`, e.g. `tasks/t0003`), or None."""
    log = os.environ.get(JOB_LOG_ENV)
    return job_name(Path(log)) if log else None


def job_name(log: Path) -> str:
    parts = log.with_suffix("").parts
    if "logs" in parts:
        return "/".join(parts[len(parts) - parts[::-1].index("logs"):])
    return log.stem


def failure_path(log: Path) -> Path:
    return log.with_suffix(".failed.json")


def scratch_dir(log: Path) -> Path:
    return log.parent / f".{log.stem}.scratch"


def attempt_logs(log: Path) -> list[Path]:
    """Logs of earlier, unsuccessful attempts, oldest first."""
    found = [(int(m.group(1)), p) for p in log.parent.glob(f"{log.name}.attempt-*") if (m := _ATTEMPT.search(p.name))]
    return [p for _, p in sorted(found)]


# Reason codes the seams know and core cannot import (`gymforge.llm.client` registers the LLM errors': a job
# that never imported the client never raised them).
_CLASSIFIERS: list[Callable[[BaseException], str | None]] = []


def register_classifier(reason_code: Callable[[BaseException], str | None]) -> None:
    """`reason_code(err)`: a job failure's reason code, or None for errors it does not know."""
    if reason_code not in _CLASSIFIERS:
        _CLASSIFIERS.append(reason_code)


def classify(err: BaseException) -> tuple[str, str]:
    """(reason code, one-line reason) of a job's failure: an error's own `reason_code` (`BudgetExceeded`:
    `budget_exhausted`, with the bare message), else what a registered classifier says, else `crash`."""
    if isinstance(err, SystemExit) and err.__context__ is not None:
        return classify(err.__context__)  # `sys.exit(message)` while handling the real error
    if isinstance(err, KeyboardInterrupt):
        return "interrupted", "interrupted (SIGINT)"
    if isinstance(err, SystemExit):
        return ("error", str(err.code)) if isinstance(err.code, str) else ("error", f"exit status {err.code}")
    text = _short(" ".join(str(err).split()) or type(err).__name__)
    notes = "; ".join(getattr(err, "__notes__", ()))
    line = f"{type(err).__name__}: {text}" + (f" [{notes}]" if notes else "")
    if isinstance(code := getattr(err, "reason_code", None), str):
        return code, text
    for reason_code in _CLASSIFIERS:
        if code := reason_code(err):
            return code, line
    return "crash", line


def _short(text: str, limit: int = 500) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _write_failure(log: Path, code: str, reason: str) -> None:
    attempt = os.environ.get(_ATTEMPT_ENV) or None
    atomic.write_json(failure_path(log), {
        "job": job_name(log), "status": "failed", "reason_code": code, "reason": reason, "log": str(log),
        "attempt_log": attempt, "ts": datetime.now(UTC).isoformat(timespec="seconds"),
    })


def split_log_option(argv: list[str]) -> tuple[list[str], Path | None]:
    """`--log <file>` before the command makes the process a job (see the module docstring)."""
    if len(argv) >= 2 and argv[0] == "--log":
        return argv[2:], Path(argv[1])
    return argv, None


def _start(log: Path) -> tuple[int, Path | None]:
    log.parent.mkdir(parents=True, exist_ok=True)
    previous = attempt_logs(log)
    number = int(_ATTEMPT.search(previous[-1].name).group(1)) + 1 if previous else 1  # type: ignore[union-attr]
    attempt = log.with_name(f"{log.name}.attempt-{number}")
    log.unlink(missing_ok=True)
    attempt.unlink(missing_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    terminal = os.dup(2)
    os.set_inheritable(terminal, True)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.link(log, attempt)
    except OSError:  # a file system without hard links: earlier attempts' logs cannot be kept
        attempt = None
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    scratch = scratch_dir(log)
    shutil.rmtree(scratch, ignore_errors=True)  # what a killed attempt left
    scratch.mkdir(parents=True)
    failure_path(log).unlink(missing_ok=True)
    os.environ.update({JOB_LOG_ENV: str(log), _ATTEMPT_ENV: str(attempt or ""), SCRATCH_ENV: str(scratch),
                       _OWNER_ENV: str(os.getpid()), _TERMINAL_ENV: str(terminal)})
    return terminal, attempt


def _fail(log: Path, err: BaseException, terminal: int | None) -> None:
    """Record the failure (unless a process this job started already recorded the real cause) and say it."""
    code, reason = classify(err)
    if not (isinstance(err, SystemExit) and not isinstance(err.code, str) and failure_path(log).exists()):
        _write_failure(log, code, reason)  # else a process this job started has recorded the real cause
    else:
        record = json.loads(failure_path(log).read_text())
        code, reason = record["reason_code"], record["reason"]
    line = f"gymforge: job {job_name(log)} failed ({code}): {reason}"
    if not isinstance(err, SystemExit):
        traceback.print_exc()
    print(line, file=sys.stderr, flush=True)
    if terminal is not None:
        try:
            os.write(terminal, f"{line}\n    log: {log}\n".encode())
        except OSError:
            pass


@contextmanager
def running(log: Path | None) -> Iterator[None]:
    """Run the block as the job whose log is `log`, or as part of the job of the environment, or as no job."""
    inherited = os.environ.get(JOB_LOG_ENV)
    if log is None and not inherited:
        yield
        return
    if log is not None:
        terminal, attempt = _start(log)
    elif os.environ.get(_OWNER_ENV) == str(os.getpid()):  # the job's own process, after an exec
        log = Path(inherited)  # type: ignore[arg-type]
        attempt = Path(os.environ[_ATTEMPT_ENV]) if os.environ.get(_ATTEMPT_ENV) else None
        terminal = int(os.environ[_TERMINAL_ENV])
    else:
        terminal = attempt = None
    job_log = log if log is not None else Path(inherited)  # type: ignore[arg-type]
    try:
        yield
    except BaseException as err:
        if isinstance(err, SystemExit) and err.code in (0, None):
            _succeeded(log, attempt)
            raise
        _fail(job_log, err, terminal)
        if log is not None:
            shutil.rmtree(scratch_dir(log), ignore_errors=True)
        raise SystemExit(1) from None
    else:
        _succeeded(log, attempt)
    finally:
        if terminal is not None:
            try:
                os.close(terminal)
            except OSError:
                pass


def _succeeded(log: Path | None, attempt: Path | None) -> None:
    if log is None:
        return
    shutil.rmtree(scratch_dir(log), ignore_errors=True)
    failure_path(log).unlink(missing_ok=True)
    if attempt is not None:
        attempt.unlink(missing_ok=True)
