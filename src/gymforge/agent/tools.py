"""The agent's file commands, run on the host against the workspace, and the interactive-command guard.

Paths the model writes are in the sandbox's terms (what `pwd` prints there); `Workspace` maps them
onto the host copy and opens them by file descriptor beneath it, following no symlink, so code racing
the host tools (which may run as root) cannot lead them out of the workspace.
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
import re
import shlex
import stat
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from gymforge.runtime.codecheck import check_python
from gymforge.sandbox import Mount, beneath

FILE_COMMANDS = frozenset(
    {"open", "goto", "scroll_up", "scroll_down", "create", "edit", "insert", "search_dir", "search_file", "find_file"}
)
MAX_RESULTS = 100  # beyond this a search asks to be narrowed instead of flooding the context


class ToolError(Exception):
    """A command that cannot run as written; the message is the observation."""


MAX_FILE_BYTES = 16 << 20  # the viewer and the editor refuse larger files; search skips them


@dataclass(frozen=True)
class Loc:
    """A path as the model wrote it, mapped onto the host: `rel` beneath the host directory `root`."""

    root: Path
    rel: str
    read_only: bool
    remote: str


class Workspace:
    """Sandbox paths <-> host paths: the workspace plus the sandbox's mounts (read-only ones stay so).

    Host-side commands may run as root while the sandboxed code changes the workspace under them, so a
    path is never resolved on the host and then opened: every access goes through
    `gymforge.sandbox.beneath`, which walks it by file descriptor and refuses symlinks anywhere on the way.
    """

    def __init__(self, host_root: Path, remote_root: str, mounts: Sequence[Mount] = ()) -> None:
        self.host_root = host_root.resolve()
        self.remote_root = posixpath.normpath(remote_root)
        roots = [
            (posixpath.normpath(posixpath.join(self.remote_root, m.target)), m.host.resolve(), m.read_only)
            for m in mounts
        ]
        # Deepest first, so a mount inside the workspace wins over the workspace itself.
        self.roots = sorted(roots, key=lambda r: -r[0].count("/")) + [(self.remote_root, self.host_root, False)]
        self._owner = self.host_root.stat().st_uid

    def locate(self, path: str, cwd: str) -> Loc:
        """Where a path as the model wrote it (relative to the shell's cwd) lies on the host."""
        remote = posixpath.normpath(posixpath.join(cwd, path))
        for target, host, read_only in self.roots:
            rel = posixpath.relpath(remote, target)
            if rel == ".." or rel.startswith("../"):
                continue
            if rel == "." and host.is_file():  # a mount of a single file
                return Loc(host.parent, host.name, read_only, remote)
            return Loc(host, rel, read_only, remote)
        raise ToolError(f"{path}: outside the workspace {self.remote_root}; file commands work only inside it")

    def stat(self, loc: Loc) -> os.stat_result | None:
        """The entry itself (a symlink is not followed), None when nothing is there."""
        try:
            return beneath.lstat(loc.root, loc.rel)
        except FileNotFoundError:
            return None
        except beneath.OutsideError as exc:
            raise ToolError(f"{loc.remote}: goes through a symlink; file commands do not follow symlinks") from exc

    def regular(self, loc: Loc, shown: str) -> Loc:
        """`loc` when it is a regular file; otherwise a ToolError that says what is there instead."""
        st = self.stat(loc)
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise ToolError(f"{shown} is a directory; use ls to list it")
        if st is not None and stat.S_ISLNK(st.st_mode):
            raise ToolError(f"{shown} is a symlink; file commands do not follow symlinks, open its target instead")
        if st is None or not stat.S_ISREG(st.st_mode):
            raise ToolError(f"file {shown} not found")
        return loc

    def is_file(self, loc: Loc) -> bool:
        st = self.stat(loc)
        return st is not None and stat.S_ISREG(st.st_mode)

    def read_text(self, loc: Loc) -> str:
        try:
            data = beneath.read_bytes(loc.root, loc.rel, MAX_FILE_BYTES)
        except beneath.OutsideError as exc:
            raise ToolError(f"{loc.remote} is a symlink or lies behind one; file commands do not follow symlinks") from exc
        try:
            return data.decode()
        except UnicodeDecodeError:
            raise ToolError(f"{loc.remote} is not a UTF-8 text file") from None

    def write_text(self, loc: Loc, text: str, *, create: bool = False) -> None:
        try:
            beneath.write_bytes(loc.root, loc.rel, text.encode(), create=create)
        except beneath.OutsideError as exc:
            raise ToolError(f"{loc.remote} is a symlink or lies behind one; file commands do not follow symlinks") from exc

    def writable(self, st: os.stat_result) -> bool:
        """Whether the sandbox user could write an entry with this stat; the host tools may run as root."""
        if os.geteuid() != 0:
            if st.st_uid == os.geteuid():
                return bool(st.st_mode & 0o200)
            return bool(st.st_mode & 0o002 or (st.st_gid in os.getgroups() and st.st_mode & 0o020))
        return bool(st.st_mode & 0o002 or (st.st_uid == self._owner and st.st_mode & 0o200))

    def walk(self, remote_dir: str) -> Iterator[tuple[str, int, str]]:
        """(sandbox path, directory fd, name) of each non-hidden regular file under a sandbox directory,
        mounts included, symlinks skipped. The fd is valid only until the next item."""
        top = self.locate(remote_dir, "/")
        prefix = remote_dir.rstrip("/") + "/"
        inside = [r for r in self.roots if r[0] != self.remote_root and (r[0] == remote_dir or r[0].startswith(prefix))]
        # Outermost first: a mount's files replace the empty mount point the workspace shows for it.
        starts = [(remote_dir, top.root, top.rel)] + [(t, h, ".") for t, h, _ in sorted(inside, key=lambda r: r[0].count("/"))]
        for target, root, rel in starts:
            if rel == "." and root.is_file():
                yield target, beneath.open_root(root.parent), root.name
                continue
            try:
                for path, dfd in beneath.walk_files(root, rel, hidden=False):
                    yield posixpath.join(target, path), dfd, posixpath.basename(path)
            except OSError:
                continue  # a mount point the code replaced, a directory gone meanwhile


def split_args(text: str, usage: str, lo: int, hi: int) -> list[str]:
    """The shell-quoted arguments in `text`, from `lo` to `hi` of them; a ToolError naming the usage otherwise."""
    try:
        args = shlex.split(text)
    except ValueError as exc:
        raise ToolError(f"cannot parse the arguments ({exc}). Usage: {usage}") from None
    if not lo <= len(args) <= hi:
        raise ToolError(f"wrong number of arguments. Usage: {usage}")
    return args


def _args(line: str, usage: str, lo: int, hi: int) -> list[str]:
    """The arguments after a command line's first word (the command)."""
    return split_args(line, usage, lo + 1, hi + 1)[1:]


def _int(text: str, usage: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ToolError(f"{text!r} is not a line number. Usage: {usage}") from None


def _body(action: str, terminator: str, usage: str) -> list[str]:
    """Lines between the command line and its terminator line."""
    lines = action.split("\n")[1:]
    ends = [i for i, ln in enumerate(lines) if ln.strip() == terminator]
    if not ends:
        raise ToolError(f"the text must end with a line containing only {terminator}. Usage: {usage}")
    if any(ln.strip() for ln in lines[ends[-1] + 1 :]):
        raise ToolError(f"nothing may follow {terminator}; run other commands in a later turn")
    return lines[: ends[-1]]


def _problems(source: str, name: str) -> list[str]:
    # Without the `file:line:` prefix, so an error that only moved lines does not count as new.
    return [e.split(": ", 1)[-1] for e in check_python(source, name)]


class FileTools:
    """State of the file viewer (open file, first line shown) and the commands that use it."""

    def __init__(self, workspace: Workspace, window: int = 1000) -> None:
        self.ws = workspace
        self.window = window
        self.file: Loc | None = None
        self.first = 1

    @property
    def open_file(self) -> str:
        return self.file.remote if self.file else "n/a"

    def run(self, action: str, cwd: str) -> str:
        name = action.split(None, 1)[0]
        try:
            return getattr(self, f"_{name}")(action, cwd)
        except ToolError as exc:
            return f"Error: {exc}"
        except OSError as exc:  # the code changed the workspace under us, a file the host cannot read...
            return f"Error: {exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")

    # -- viewer ---------------------------------------------------------------------------------

    def _lines(self, loc: Loc | None = None) -> list[str]:
        return self.ws.read_text(loc or self._need_file()).splitlines()

    def _need_file(self) -> Loc:
        if self.file is None:
            raise ToolError("no file is open; use `open <path>` first")
        if not self.ws.is_file(self.file):
            raise ToolError(f"{self.open_file} no longer exists")
        return self.file

    def _center(self, line: int, n: int) -> None:
        self.first = max(1, min(line - self.window // 2, n - self.window + 1))

    def _show(self, note: str = "") -> str:
        lines = self._lines()
        n = len(lines)
        self.first = max(1, min(self.first, n - self.window + 1))
        last = min(n, self.first + self.window - 1)
        body = [f"{i}:{lines[i - 1]}" for i in range(self.first, last + 1)]
        return "\n".join([
            *([note] if note else []),
            f"[File: {self.open_file} ({n} lines total)]",
            f"({self.first - 1} more lines above)",
            *body,
            f"({n - last} more lines below)",
        ])

    def _open(self, action: str, cwd: str) -> str:
        usage = 'open "<path>" [<line_number>]'
        args = _args(action, usage, 1, 2)
        loc = self.ws.regular(self.ws.locate(args[0], cwd), args[0])
        n = len(self._lines(loc))
        self.file, self.first = loc, 1
        if len(args) == 2:
            line = _int(args[1], usage)
            if not 1 <= line <= max(n, 1):
                raise ToolError(f"line {line} is out of range; the file has {n} lines")
            self._center(line, n)
        return self._show()

    def _goto(self, action: str, cwd: str) -> str:
        usage = "goto <line_number>"
        line = _int(_args(action, usage, 1, 1)[0], usage)
        n = len(self._lines())
        if not 1 <= line <= max(n, 1):
            raise ToolError(f"line {line} is out of range; the file has {n} lines")
        self._center(line, n)
        return self._show()

    def _scroll_down(self, action: str, cwd: str) -> str:
        _args(action, "scroll_down", 0, 0)
        self._need_file()
        self.first += self.window
        return self._show()

    def _scroll_up(self, action: str, cwd: str) -> str:
        _args(action, "scroll_up", 0, 0)
        self._need_file()
        self.first = max(1, self.first - self.window)
        return self._show()

    # -- editor ---------------------------------------------------------------------------------

    def _create(self, action: str, cwd: str) -> str:
        (name,) = _args(action, "create <path>", 1, 1)
        loc = self.ws.locate(name, cwd)
        if self.ws.stat(loc) is not None:
            raise ToolError(f"{name} already exists; open it instead")
        parent = Loc(loc.root, posixpath.dirname(loc.rel) or ".", loc.read_only, posixpath.dirname(loc.remote))
        st = self.ws.stat(parent)
        if st is None or not stat.S_ISDIR(st.st_mode):
            raise ToolError(f"directory {parent.remote} does not exist; make it with mkdir -p first")
        if loc.read_only or not self.ws.writable(st):
            raise ToolError(f"{parent.remote} is read-only")
        self.ws.write_text(loc, "\n", create=True)  # one empty line, so `edit 1:1` fills the new file
        self.file, self.first = loc, 1
        return self._show()

    def _edit(self, action: str, cwd: str) -> str:
        usage = "edit <start_line>:<end_line>, the new lines, then end_of_edit"
        (span,) = _args(action.split("\n", 1)[0], usage, 1, 1)
        start, sep, end = span.partition(":")
        if not sep:
            raise ToolError(f"{span!r} is not a line range like 3:5. Usage: {usage}")
        start, end = _int(start, usage), _int(end, usage)
        body = _body(action, "end_of_edit", usage)
        lines = self._lines()
        if not 1 <= start <= max(len(lines), 1) or end < start:
            raise ToolError(f"invalid range {start}:{end}; the file has {len(lines)} lines (ranges are inclusive)")
        end = min(end, len(lines))  # a range past the end means "to the end"
        return self._write(lines[: start - 1] + body + lines[end:], start, "edit")

    def _insert(self, action: str, cwd: str) -> str:
        usage = "insert <line_number>, the new lines, then end_of_insert (0 inserts at the top)"
        (at,) = _args(action.split("\n", 1)[0], usage, 1, 1)
        line = _int(at, usage)
        body = _body(action, "end_of_insert", usage)
        lines = self._lines()
        if not 0 <= line <= len(lines):
            raise ToolError(f"line {line} is out of range; the file has {len(lines)} lines")
        return self._write(lines[:line] + body + lines[line:], line + 1, "insert")

    def _write(self, new: list[str], at: int, verb: str) -> str:
        loc = self._need_file()
        st = self.ws.stat(loc)
        if loc.read_only or st is None or not self.ws.writable(st):
            raise ToolError(f"{self.open_file} is read-only")
        old_text, new_text = self.ws.read_text(loc), "\n".join(new) + "\n"
        if loc.rel.endswith(".py"):
            name = self.open_file
            before, after = _problems(old_text, name), _problems(new_text, name)
            added = list((Counter(after) - Counter(before)).elements())
            # A file that does not parse yet can only be repaired step by step, so it is not guarded.
            if added and not any(b.startswith("syntax error") for b in before):
                shown = "\n".join(f"- {e}" for e in check_python(new_text, name) if e.split(": ", 1)[-1] in added)
                return (
                    f"Your {verb} was NOT applied: it would introduce these errors:\n{shown}\n"
                    f"The file is unchanged. Fix the {verb} command (indentation, brackets, missing "
                    "imports or definitions) and try again."
                )
        self.ws.write_text(loc, new_text)
        self._center(at, len(new))
        return self._show("File updated. Check that the indentation is right and that nothing is duplicated.")

    # -- search ---------------------------------------------------------------------------------

    def _dir(self, arg: str | None, cwd: str) -> str:
        st = self.ws.stat(self.ws.locate(arg or ".", cwd))
        if st is not None and stat.S_ISLNK(st.st_mode):
            raise ToolError(f"{arg} is a symlink; file commands do not follow symlinks")
        if st is None or not stat.S_ISDIR(st.st_mode):
            raise ToolError(f"directory {arg} not found")
        return posixpath.normpath(posixpath.join(cwd, arg or "."))

    def _search_dir(self, action: str, cwd: str) -> str:
        args = _args(action, "search_dir <term> [<dir>]", 1, 2)
        term, where = args[0], self._dir(args[1] if len(args) == 2 else None, cwd)
        hits: dict[str, int] = {}
        for remote, dfd, name in self.ws.walk(where):
            data = beneath.read_at(dfd, name, MAX_FILE_BYTES)
            try:
                count = data.decode().count(term) if data is not None else 0
            except UnicodeDecodeError:
                count = 0  # binary
            hits[remote] = count  # a mount's file replaces what the workspace showed at its place
        hits = {r: k for r, k in hits.items() if k}
        if not hits:
            return f'No matches found for "{term}" in {where}'
        if len(hits) > MAX_RESULTS:
            return f'More than {MAX_RESULTS} files matched for "{term}" in {where}. Please narrow your search.'
        rows = [f"{r} ({k} matches)" for r, k in hits.items()]
        return "\n".join([f'Found {sum(hits.values())} matches for "{term}" in {where}:', *rows, "End of matches"])

    def _search_file(self, action: str, cwd: str) -> str:
        args = _args(action, "search_file <term> [<file>]", 1, 2)
        loc = self.ws.regular(self.ws.locate(args[1], cwd), args[1]) if len(args) == 2 else self._need_file()
        term, where = args[0], loc.remote
        hits = [(i, ln) for i, ln in enumerate(self._lines(loc), 1) if term in ln]
        if not hits:
            return f'No matches found for "{term}" in {where}'
        if len(hits) > MAX_RESULTS:
            return f'More than {MAX_RESULTS} lines matched for "{term}" in {where}. Please narrow your search.'
        rows = [f"Line {i}:{ln}" for i, ln in hits]
        return "\n".join([f'Found {len(hits)} matches for "{term}" in {where}:', *rows, "End of matches"])

    def _find_file(self, action: str, cwd: str) -> str:
        args = _args(action, "find_file <name> [<dir>]", 1, 2)
        name, where = args[0], self._dir(args[1] if len(args) == 2 else None, cwd)
        hits = list(dict.fromkeys(r for r, _, base in self.ws.walk(where) if fnmatch.fnmatchcase(base, name)))
        if not hits:
            return f'No matches found for "{name}" in {where}'
        if len(hits) > MAX_RESULTS:
            return f'More than {MAX_RESULTS} files matched for "{name}" in {where}. Please narrow your search.'
        return "\n".join([f'Found {len(hits)} matches for "{name}" in {where}:', *hits])


# -- interactive-command guard --------------------------------------------------------------------

_EDITOR = "it is an interactive editor that would hang this non-interactive shell; use open, edit, insert or create"
_PAGER = "it is an interactive pager; use cat, head, tail -n, sed -n 'A,Bp' or grep"
_ALWAYS = {
    "vim": _EDITOR, "vi": _EDITOR, "nano": _EDITOR, "emacs": _EDITOR,
    "less": _PAGER, "more": _PAGER, "man": _PAGER,
    "htop": "it is an interactive monitor; use `top -b -n 1`, ps or nvidia-smi",
    "watch": "it never ends; run the command once instead",
    "exit": "it would close the shell; use submit to end the task",
    "logout": "it would close the shell; use submit to end the task",
}
_REPL = {"python", "python3", "ipython", "bash", "sh"}
_GIT_PAGED = {"log", "show", "diff", "blame", "reflog", "shortlog", "whatchanged", "help"}
_PREFIXES = {"sudo", "time", "nice", "env", "command", "exec", "then", "do", "else", "!", "{", "nohup"}
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)([\w.-]+)\1")
_PUNCT = "();<>|&\n"


def _strip_heredocs(command: str) -> str:
    """Drop here-document bodies, which are data, not commands."""
    out, delim = [], None
    for line in command.split("\n"):
        if delim is not None:
            delim = None if line.strip() == delim else delim
            continue
        out.append(line)
        if m := _HEREDOC.search(line):
            delim = m[2]
    return "\n".join(out)


def _segments(command: str) -> list[tuple[list[str], str, str]] | None:
    """(words, operator before, operator after) per simple command; None when quoting is unbalanced."""
    lex = shlex.shlex(_strip_heredocs(command), posix=True, punctuation_chars=_PUNCT)
    lex.whitespace, lex.commenters, lex.whitespace_split = " \t\r", "", True
    try:
        tokens = list(lex)
    except ValueError:
        return None  # bash reports the syntax error itself
    segments, words, before = [], [], ""
    for tok in tokens + [";"]:
        is_op = set(tok) <= set(_PUNCT) and not set(tok) & set("<>")
        if not is_op:
            words.append(tok)
            continue
        if words:
            segments.append((words, before, tok))
        words, before = [], tok
    return segments


# A command that runs python or a launcher of it: the agent loop gives it the task's training timeout instead
# of the short one, and the RL reward's `ran_code` milestone counts it when it exits 0.
_TRAINING = re.compile(r"\b(python3?|torchrun|accelerate|deepspeed)\b")


def is_training_command(command: str) -> bool:
    """Whether `command` runs python (or torchrun, accelerate, deepspeed) anywhere in it."""
    return bool(_TRAINING.search(command))


def blocked(command: str) -> str | None:
    """Why the command is refused (it would wait for a terminal or never end), or None to run it."""
    for words, before, after in _segments(command) or []:
        while words and (words[0] in _PREFIXES or re.match(r"^\w+=", words[0])):
            words = words[1:]
        if words and words[0] == "timeout":  # timeout [flags] DURATION cmd...
            i = 1
            while i < len(words) and words[i].startswith("-"):
                i += 2 if words[i] in ("-s", "-k") else 1
            words = words[i + 1 :]
        if not words or words[0].startswith("#"):
            continue
        name = words[0].rsplit("/", 1)[-1]
        args = words[1:]
        args = args[: next((i for i, a in enumerate(args) if a.startswith("#")), len(args))]
        piped_in, redirected_in = before.strip() == "|", any("<" in a for a in args)
        piped_out = after.strip() == "|" or any(">" in a for a in args)
        if name in _ALWAYS:
            return f"`{name}` is not allowed: {_ALWAYS[name]}."
        if name in _REPL:
            flags = [a for a in args if a.startswith("-") and a != "-"]
            scripted = any(a in ("-c", "-m") for a in flags) or any(not a.startswith("-") for a in args)
            if "-i" in flags or not (scripted or piped_in or redirected_in):
                return (
                    f"`{' '.join(words)}` is not allowed: it starts an interactive session that would hang this "
                    f"shell; run a script (`{name} file`) or pass code with -c or a here-document."
                )
        if name == "top" and "-b" not in args:
            return "`top` is not allowed: it is interactive; use `top -b -n 1` instead."
        follow = [a for a in args if a.startswith("--f") or (a[:1] == "-" and a[1:2] != "-" and set("fF") & set(a))]
        if name == "tail" and follow:
            return "`tail -f` is not allowed: it never ends; use `tail -n 50 <file>` instead."
        if name == "git" and not piped_out:
            opts = []
            rest = list(args)
            while rest and rest[0].startswith("-"):
                opt = rest.pop(0)
                opts.append(opt)
                if opt in ("-C", "-c") and rest:
                    rest.pop(0)
            if rest and rest[0] in _GIT_PAGED and not {"--no-pager", "-P"} & set(opts):
                return f"`git {rest[0]}` is not allowed without a pager switch-off: use `git --no-pager {rest[0]} ...`."
    return None
