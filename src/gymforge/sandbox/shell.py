"""The persistent-shell protocol shared by all backends.

A long-lived `bash --noprofile --norc` reads its script from a channel (a pipe locally, an exec socket
in docker). Each command is sent as one line, `eval $'<command>' </dev/null; __gf_done $?`, so the
command runs in the shell itself (cd, export, functions and plain variables persist) while its stdin is
/dev/null (an interactive program gets EOF instead of eating the protocol). `__gf_done` prints a line
with a per-session random token, the exit status and the quoted cwd, then `export -p` and an end line;
the host keeps the last cwd and exports as a snapshot.

On timeout the channel kills every process in the sandbox except the shell; the shell sees its
foreground job die and reports as usual, with all its state. Only when the shell itself does not answer
within a grace period (a busy loop in a builtin, a `set -e` exit, `exec`) is it killed and restarted,
restoring the cwd and exported variables of the last completed command; plain variables, functions and
background processes are lost then.
"""

from __future__ import annotations

import logging
import re
import secrets
import shlex
import threading
import time
from pathlib import Path
from typing import Callable, Protocol

from .base import ExecResult, LimitWatch, OutputBuffer, SandboxError, Session
from .base import tree_bytes as base_tree_bytes

log = logging.getLogger(__name__)

START_TIMEOUT = 60.0
"""Seconds a fresh shell may take to answer (docker may be slow to exec on a loaded host)."""
KILL_GRACE = 3.0
"""Seconds the shell gets to report after its command was killed, before it is restarted."""

# `export -p` output: only `declare -x NAME="value"` records (values escape ", \, $ and `), nothing else.
_EXPORTS = re.compile(rb'(?:declare -[a-zA-Z-]+ [A-Za-z_][A-Za-z0-9_]*(?:="(?:[^"\\]|\\[\s\S])*")?\n)*')


class Channel(Protocol):
    """A running shell inside a sandbox, as the host sees it."""

    def send(self, data: bytes) -> None: ...

    def recv(self, timeout: float) -> bytes | None:
        """Output bytes; b"" at end of stream; None when nothing came within `timeout` seconds."""
        ...

    def interrupt(self, keep_pid: int) -> None:
        """Kill every process of the sandbox except `keep_pid` (the shell, as `$$` reports it)."""
        ...

    def kill(self) -> None:
        """Kill everything, the shell included; idempotent."""
        ...

    def exit_code(self) -> int:
        """The shell's exit status once the stream has ended."""
        ...


def bash_quote(s: str) -> str:
    """Quote as one line of bash: $'...' with every non-printable or non-ASCII byte escaped."""
    out = []
    for b in s.encode():
        c = chr(b)
        if c in "\\'":
            out.append("\\" + c)
        elif 0x20 <= b < 0x7F:
            out.append(c)
        else:
            out.append(f"\\x{b:02x}")
    return "$'" + "".join(out) + "'"


def collect(chan: Channel, deadline: float, buf: OutputBuffer) -> bool:
    """Read `chan` into `buf` until end of stream (True) or the deadline (False)."""
    while (left := deadline - time.monotonic()) > 0:
        data = chan.recv(left)
        if data == b"":
            return True
        if data:
            buf.add(data)
    return False


class ShellSession(Session):
    """A `Session` over any `Channel`; `spawn` starts a fresh shell, `on_close` releases the sandbox."""

    def __init__(
        self,
        workspace: Path,
        workdir: str,
        spawn: Callable[[], Channel],
        max_output: int,
        on_close: Callable[[], None],
        *,
        watch: LimitWatch | None = None,
        confinement: str | None = None,
    ) -> None:
        self.workspace = workspace
        self.confinement = confinement
        self._watch = watch
        self._limit: str | None = None
        self.workdir = self.cwd = workdir
        self._spawn = spawn
        self._max_output = max_output
        self._on_close = on_close
        self._token = secrets.token_hex(12).encode()
        self._cwd_q = shlex.quote(workdir)
        self._exports = b""
        self._chan: Channel | None = None
        self._pid = 0
        self._closed = False
        self._start()
        self._stop = threading.Event()
        self._busy = False  # a command runs: its own checks apply
        self._pending_limit: str | None = None
        if watch is not None and not watch.hard:
            threading.Thread(target=self._guard_disk, daemon=True).start()

    def _guard_disk(self) -> None:
        """Between commands too: a background process that keeps filling the workspace past its cap is killed
        (every process but the shell); the next command's result names the limit."""
        assert self._watch is not None
        last = base_tree_bytes(self.workspace)
        while not self._stop.wait(LimitWatch.INTERVAL_S * 2):
            size = base_tree_bytes(self.workspace)
            over = size > self._watch.limits.disk_mb << 20 and size > last
            last = size
            if over and self._chan is not None and not self._busy:
                try:
                    self._chan.interrupt(self._pid)
                except (OSError, ValueError):
                    continue
                self._pending_limit = (f"disk: the workspace holds more than {self._watch.limits.disk_mb} MiB; "
                                       "background processes that kept writing were stopped")

    def _start(self) -> None:
        chan = self._spawn()
        tok = self._token.decode()
        done = f"__gf_done() {{ printf '\\n{tok} %d %q\\n' \"$1\" \"$PWD\"; export -p; printf '{tok}-end\\n'; }}\n"
        chan.send(
            # Locally stderr is already merged by the host; in docker this merges it in the shell.
            b"exec 2>&1\n"
            + done.encode()
            + self._exports
            + f"cd -- {self._cwd_q} 2>/dev/null\nprintf '{tok}-ready %d\\n' $$\n".encode()
        )
        buf = bytearray()
        deadline = time.monotonic() + START_TIMEOUT
        ready = self._token + b"-ready "
        while (i := buf.find(ready)) < 0 or b"\n" not in buf[i:]:
            data = chan.recv(max(deadline - time.monotonic(), 0))
            if not data:  # EOF or the deadline
                chan.kill()
                raise SandboxError(f"sandbox shell did not start: {bytes(buf).decode(errors='replace')[-2000:]}")
            buf += data
        self._pid = int(buf[i + len(ready) :].split(b"\n", 1)[0])
        self._chan = chan

    def run(self, command: str, timeout: float) -> ExecResult:
        if self._closed:
            raise SandboxError("session is closed")
        if self._chan is None:
            self._start()
        chan = self._chan
        assert chan is not None
        t0 = time.monotonic()
        buf = OutputBuffer(self._max_output)
        marker = b"\n" + self._token + b" "
        end = self._token + b"-end\n"
        pending = bytearray()
        timed_out = False
        self._limit, self._pending_limit = self._pending_limit, None
        self._busy = True
        if self._watch is not None:
            self._watch.start()
        deadline = t0 + timeout
        chan.send(f"eval {bash_quote(command)} </dev/null; __gf_done $?\n".encode())
        while True:
            left = deadline - time.monotonic()
            if not timed_out and self._watch is not None and (hit := self._watch.during()):
                self._limit, left = hit, 0  # stop the command as a timeout would
            if left <= 0:
                if timed_out:  # the shell itself is stuck: replace it
                    buf.add(bytes(pending))
                    log.info("sandbox shell in %s stuck after a timeout; restarting it", self.workspace)
                    self._drop()
                    return self._result(buf, 137, True, t0)
                timed_out = True
                chan.interrupt(self._pid)
                deadline = time.monotonic() + KILL_GRACE
                continue
            data = chan.recv(min(left, LimitWatch.INTERVAL_S) if self._watch is not None else left)
            if data is None:
                continue
            if data == b"":  # the shell exited (`exit`, `set -e`, `exec`)
                buf.add(bytes(pending))
                code = chan.exit_code()
                self._drop()
                return self._result(buf, code, timed_out, t0)
            pending += data
            i = pending.find(marker)
            if i < 0:
                keep = len(marker) - 1  # a marker may be split across reads
                buf.add(bytes(pending[:-keep]))
                del pending[:-keep]
                continue
            j = pending.find(end, i)
            if j < 0:
                continue
            buf.add(bytes(pending[:i]))
            line, _, exports = bytes(pending[i + len(marker) : j]).partition(b"\n")
            code, _, cwd_q = line.decode(errors="replace").partition(" ")
            self._remember(cwd_q, exports)
            return self._result(buf, int(code), timed_out, t0)

    def _remember(self, cwd_q: str, exports: bytes) -> None:
        self._cwd_q = cwd_q
        try:
            self.cwd = shlex.split(cwd_q)[0]
        except (ValueError, IndexError):  # $'...' quoting of control characters, shown as is
            self.cwd = cwd_q
        # A background process writing at the same moment can interleave; never replay a mangled block.
        if _EXPORTS.fullmatch(exports):
            self._exports = exports

    def _result(self, buf: OutputBuffer, code: int, timed_out: bool, t0: float) -> ExecResult:
        self._busy = False
        limit = self._limit or (self._watch.after(code) if self._watch is not None else None)
        return ExecResult(
            output=buf.text(), exit_code=code, timed_out=timed_out and self._limit is None,
            duration_s=round(time.monotonic() - t0, 4), limit=limit,
        )

    def _drop(self) -> None:
        if self._chan is not None:
            self._chan.kill()
            self._chan = None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._drop()
        self._on_close()
