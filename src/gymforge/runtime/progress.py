"""A small progress reporter for long stages (rollout shards, evaluation jobs).

`Progress(total, label, log).advance(n, detail)` reports `label k/N (p%) elapsed mm:ss ETA mm:ss — detail`.
In a job (stderr redirected to the job's log file) every advance is one log line. On an interactive
terminal (stderr is a TTY) one status line is redrawn in place instead, and finished with a newline
when the count reaches the total; the ETA is the mean time per finished item times the items left.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from typing import Callable, TextIO


def fmt_duration(seconds: float | None) -> str:
    """`mm:ss`, or `h:mm:ss` from one hour on; `--:--` when unknown."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "--:--"
    total = int(round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


class Progress:
    """Counts finished items of a known total and reports each step with elapsed time and ETA."""

    def __init__(self, total: int, label: str, log: logging.Logger | None = None, *,
                 stream: TextIO | None = None, tty: bool | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total = max(0, int(total))
        self.label = label
        self.log = log or logging.getLogger("gymforge.runtime.progress")
        self.stream = stream if stream is not None else sys.stderr
        if tty is None:
            isatty = getattr(self.stream, "isatty", None)
            try:
                tty = bool(isatty and isatty())
            except ValueError:  # a closed stream
                tty = False
        self.tty = tty
        self.clock = clock
        self.start = clock()
        self.done = 0
        self._drawn = False

    @property
    def elapsed(self) -> float:
        return self.clock() - self.start

    def eta(self) -> float | None:
        """Seconds left at the mean pace so far; None before the first item (unknown)."""
        if self.done <= 0:
            return None
        return self.elapsed / self.done * max(0, self.total - self.done)

    def line(self, detail: str = "") -> str:
        pct = 100.0 * self.done / self.total if self.total else 100.0
        text = (f"{self.label} {self.done}/{self.total} ({pct:.0f}%) elapsed {fmt_duration(self.elapsed)} "
                f"ETA {fmt_duration(self.eta())}")
        return f"{text} — {detail}" if detail else text

    def advance(self, n: int = 1, detail: str = "") -> str:
        """Count `n` more finished items and report; returns the line reported."""
        self.done += n
        text = self.line(detail)
        if self.tty:
            self.stream.write("\r\x1b[K" + text)
            self._drawn = True
            if self.done >= self.total:
                self.close()
            else:
                self.stream.flush()
        else:
            self.log.info("%s", text)
        return text

    def close(self) -> None:
        """End the redrawn line (TTY mode), so later output starts on a fresh line."""
        if self.tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
