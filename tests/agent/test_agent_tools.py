from __future__ import annotations

import os
from pathlib import Path

import pytest

from gymforge.agent.tools import MAX_RESULTS, FileTools, Workspace, blocked, is_training_command
from gymforge.sandbox import Mount

REMOTE = "/home/agent/workspace"  # the sandbox's name for the workspace; files live under tmp_path


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "ten.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    (root / "train.py").write_text("import os\n\n\ndef main():\n    return os.getcwd()\n")
    (root / "src" / "model.py").write_text("class Net:\n    depth = 3\n")
    return root


def tools(ws: Path, window: int = 1000) -> FileTools:
    return FileTools(Workspace(ws, REMOTE), window=window)


def shown(obs: str) -> list[str]:
    """The numbered lines of a file view."""
    return [ln for ln in obs.splitlines() if ln.split(":", 1)[0].isdigit()]


def test_open_goto_and_scroll_move_a_window(ws: Path) -> None:
    t = tools(ws, window=4)
    obs = t.run('open "ten.txt"', REMOTE)
    assert f"[File: {REMOTE}/ten.txt (10 lines total)]" in obs
    assert shown(obs) == ["1:line 1", "2:line 2", "3:line 3", "4:line 4"]
    assert "(0 more lines above)" in obs and "(6 more lines below)" in obs
    assert t.open_file == f"{REMOTE}/ten.txt"
    assert shown(t.run("scroll_down", REMOTE))[0] == "5:line 5"
    assert shown(t.run("scroll_down", REMOTE)) == ["7:line 7", "8:line 8", "9:line 9", "10:line 10"]  # clamped
    assert shown(t.run("scroll_up", REMOTE))[0] == "3:line 3"
    assert shown(t.run("goto 6", REMOTE)) == ["4:line 4", "5:line 5", "6:line 6", "7:line 7"]
    assert shown(t.run("open ten.txt 2", REMOTE))[0] == "1:line 1"
    assert "out of range" in t.run("goto 11", REMOTE)


def test_default_window_is_1000_lines(ws: Path) -> None:
    (ws / "big.txt").write_text("x\n" * 2500)
    obs = tools(ws).run("open big.txt", REMOTE)
    assert len(shown(obs)) == 1000 and "(1500 more lines below)" in obs


def test_viewer_needs_an_open_file(ws: Path) -> None:
    t = tools(ws)
    assert t.run("goto 3", REMOTE).startswith("Error: no file is open")
    assert t.run("scroll_down", REMOTE).startswith("Error: no file is open")
    assert "not found" in t.run("open missing.py", REMOTE)
    assert "is a directory" in t.run("open src", REMOTE)


def test_relative_paths_follow_the_shell_directory(ws: Path) -> None:
    t = tools(ws)
    assert "[File: /home/agent/workspace/src/model.py" in t.run("open model.py", f"{REMOTE}/src")
    assert "[File: /home/agent/workspace/train.py" in t.run(f"open {REMOTE}/train.py", f"{REMOTE}/src")


def test_create_makes_an_empty_file_and_opens_it(ws: Path) -> None:
    t = tools(ws)
    obs = t.run("create src/new.py", REMOTE)
    assert (ws / "src" / "new.py").read_text() == "\n"
    assert f"[File: {REMOTE}/src/new.py (1 lines total)]" in obs
    t.run("edit 1:1\nprint('hi')\nend_of_edit", REMOTE)
    assert (ws / "src" / "new.py").read_text() == "print('hi')\n"
    assert "already exists" in t.run("create train.py", REMOTE)


def test_edit_replaces_an_inclusive_range(ws: Path) -> None:
    t = tools(ws)
    t.run("open ten.txt", REMOTE)
    obs = t.run("edit 3:5\nthree\n  four and five\nend_of_edit", REMOTE)
    assert obs.startswith("File updated.")
    assert (ws / "ten.txt").read_text().splitlines() == [
        "line 1", "line 2", "three", "  four and five", "line 6", "line 7", "line 8", "line 9", "line 10",
    ]
    t.run("edit 1:2\nend_of_edit", REMOTE)  # an empty body deletes
    assert (ws / "ten.txt").read_text().splitlines()[:2] == ["three", "  four and five"]
    t.run("edit 7:100\nlast\nend_of_edit", REMOTE)  # a range past the end means "to the end"
    assert (ws / "ten.txt").read_text().splitlines()[-1] == "last"
    assert "invalid range" in t.run("edit 5:4\nx\nend_of_edit", REMOTE)
    assert "end_of_edit" in t.run("edit 1:1\nx", REMOTE)
    assert "nothing may follow" in t.run("edit 1:1\nx\nend_of_edit\nls", REMOTE)


def test_insert_after_a_line(ws: Path) -> None:
    t = tools(ws)
    t.run("open ten.txt", REMOTE)
    t.run("insert 0\nfirst\nend_of_insert", REMOTE)
    t.run("insert 11\nafter ten\nend_of_insert", REMOTE)
    t.run("insert 2\nsecond half\nend_of_insert", REMOTE)
    lines = (ws / "ten.txt").read_text().splitlines()
    assert lines[:4] == ["first", "line 1", "second half", "line 2"] and lines[-1] == "after ten"
    assert "out of range" in t.run("insert 99\nx\nend_of_insert", REMOTE)


def test_python_edit_with_a_syntax_error_is_rejected(ws: Path) -> None:
    t = tools(ws)
    t.run("open train.py", REMOTE)
    before = (ws / "train.py").read_text()
    obs = t.run("edit 5:5\n    return os.getcwd(\nend_of_edit", REMOTE)
    assert "NOT applied" in obs and "syntax error" in obs
    assert (ws / "train.py").read_text() == before


def test_python_edit_with_an_undefined_name_is_rejected(ws: Path) -> None:
    t = tools(ws)
    t.run("open train.py", REMOTE)
    before = (ws / "train.py").read_text()
    obs = t.run("insert 5\n    print(np.zeros(3))\nend_of_insert", REMOTE)
    assert "NOT applied" in obs and "undefined name 'np'" in obs and "import numpy as np" in obs
    assert (ws / "train.py").read_text() == before


def test_clean_python_edit_passes_and_old_errors_do_not_block(ws: Path) -> None:
    (ws / "old.py").write_text("x = undefined_thing\n\n\ndef f():\n    return 1\n")
    t = tools(ws)
    t.run("open old.py", REMOTE)
    assert t.run("edit 5:5\n    return 2\nend_of_edit", REMOTE).startswith("File updated.")
    t.run("open train.py", REMOTE)
    assert t.run("insert 0\nimport numpy as np\nend_of_insert", REMOTE).startswith("File updated.")
    assert t.run("insert 6\nprint(np.zeros(3))\nend_of_insert", REMOTE).startswith("File updated.")
    assert (ws / "train.py").read_text().splitlines()[0] == "import numpy as np"


def test_search_dir_file_and_find_file(ws: Path) -> None:
    (ws / ".hidden").mkdir()
    (ws / ".hidden" / "secret.py").write_text("depth\n")
    (ws / "blob.bin").write_bytes(b"\xff\xfe depth \x00")
    t = tools(ws)
    obs = t.run("search_dir depth", REMOTE)
    assert obs.splitlines() == [
        f'Found 1 matches for "depth" in {REMOTE}:', f"{REMOTE}/src/model.py (1 matches)", "End of matches",
    ]
    assert "No matches" in t.run('search_dir "no such text"', REMOTE)
    obs = t.run('search_file "line 1" ten.txt', REMOTE)
    assert obs.splitlines()[1:] == ["Line 1:line 1", "Line 10:line 10", "End of matches"]
    t.run("open train.py", REMOTE)
    assert "Line 4:def main():" in t.run('search_file "def "', REMOTE)
    assert t.run('find_file "*.py"', REMOTE).splitlines()[1:] == [f"{REMOTE}/train.py", f"{REMOTE}/src/model.py"]
    assert t.run("find_file model.py src", REMOTE).splitlines()[1:] == [f"{REMOTE}/src/model.py"]
    for i in range(MAX_RESULTS + 1):
        (ws / f"f{i}.txt").write_text("needle\n")
    assert "narrow your search" in t.run("search_dir needle", REMOTE)


def test_paths_outside_the_workspace_are_refused(ws: Path, tmp_path: Path) -> None:
    (tmp_path / "outside.txt").write_text("secret\n")
    os.symlink(tmp_path / "outside.txt", ws / "link.txt")
    os.symlink(tmp_path, ws / "up")
    t = tools(ws)
    for command in ("open ../outside.txt", "open /etc/passwd", "open link.txt", "create up/new.py",
                    f"open {REMOTE}/../outside.txt", "search_file secret link.txt", "search_dir secret up"):
        obs = t.run(command, REMOTE)
        assert obs.startswith("Error:") and ("outside the workspace" in obs or "symlink" in obs), command
        assert "secret" not in obs.replace('"secret"', "").replace("secret ", ""), command
    assert not (tmp_path / "new.py").exists()
    assert "outside the workspace" in t.run("open train.py", "/tmp")  # the shell left the workspace
    assert "No matches" in t.run("search_dir secret", REMOTE)  # the walk skips symlinks that leave


def test_mounts_are_readable_but_read_only_ones_not_writable(ws: Path, tmp_path: Path) -> None:
    data = tmp_path / "dataset"
    data.mkdir()
    (data / "train.csv").write_text("a,b\n1,2\n")
    (ws / "data").mkdir()  # the empty mount point the host sees where the sandbox binds the data
    t = FileTools(Workspace(ws, REMOTE, [Mount(host=data, target="data", read_only=True)]))
    assert f"[File: {REMOTE}/data/train.csv (2 lines total)]" in t.run("open data/train.csv", REMOTE)
    assert "is read-only" in t.run("edit 1:1\nx,y\nend_of_edit", REMOTE)
    assert "is read-only" in t.run("create data/new.csv", REMOTE)
    assert (data / "train.csv").read_text() == "a,b\n1,2\n" and not (data / "new.csv").exists()
    assert f"{REMOTE}/data/train.csv" in t.run('find_file "*.csv"', REMOTE)
    assert f"{REMOTE}/data/train.csv (1 matches)" in t.run("search_dir a,b", REMOTE)
    assert "outside the workspace" in t.run("open data/../../x", REMOTE)


def test_files_the_sandbox_user_cannot_write_stay_unchanged(ws: Path) -> None:
    (ws / "evaluate.py").write_text("print(1)\n")
    (ws / "evaluate.py").chmod(0o444)
    t = tools(ws)
    t.run("open evaluate.py", REMOTE)
    assert "is read-only" in t.run("edit 1:1\nprint(2)\nend_of_edit", REMOTE)
    assert (ws / "evaluate.py").read_text() == "print(1)\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="ownership is only adjusted when the host tools run as root")
def test_created_files_belong_to_the_workspace_owner(ws: Path) -> None:
    os.chown(ws, 4242, 4242)  # what the local sandbox does to give the workspace to its own uid
    (ws / "root_owned.py").write_text("x = 1\n")
    t = tools(ws)
    t.run("create new.py", REMOTE)
    assert (ws / "new.py").stat().st_uid == 4242
    t.run("open root_owned.py", REMOTE)  # root's 0644 file: the sandbox user could not write it either
    assert "is read-only" in t.run("edit 1:1\nx = 2\nend_of_edit", REMOTE)


@pytest.mark.parametrize(
    "command",
    [
        "vim train.py", "vi x", "nano x", "emacs x", "less log.txt", "cat log | less", "more x", "top", "htop",
        "python", "python3", "ipython", "python -i train.py", "bash", "sh", "/usr/bin/python3 -u",
        "git log", "git -C repo diff", "tail -f log.txt", "tail -n 5 -F log.txt", "tail --follow=name x",
        "cd src && vim model.py", "ls # look\nvim x.py", "FOO=1 python", "timeout 10 python", "sudo nano /etc/x",
        "watch nvidia-smi", "exit",
    ],
)
def test_interactive_commands_are_blocked(command: str) -> None:
    reason = blocked(command)
    assert reason is not None and "not allowed" in reason


@pytest.mark.parametrize(
    "command",
    [
        "python train.py", "python3 -u train.py --epochs 3", "python -c 'print(1)'", "python -m pip list",
        "python - <<'EOF'\nimport vim\nEOF", "cat script.py | python", "bash run.sh", "sh -c 'ls'",
        "git --no-pager log -n 3", "git status", "git log | head", "git log > log.txt", "top -b -n 1",
        "tail -n 20 log.txt", "echo vim", "grep less notes.txt", "ls -la", "timeout 60 python train.py",
        "cat <<EOF > notes.md\nvim and less\nEOF", 'echo "unbalanced',
        "nohup python train.py > log 2>&1 &",
    ],
)
def test_ordinary_commands_are_not_blocked(command: str) -> None:
    assert blocked(command) is None


def test_a_symlink_loop_is_an_observation_not_a_crash(ws: Path) -> None:
    os.symlink("loop", ws / "loop")
    os.symlink("a", ws / "b")
    os.symlink("b", ws / "a")
    t = tools(ws)
    for command in ("open loop", "open a", "create loop/x.py", "search_file x loop", "search_dir x loop", "find_file x loop"):
        assert t.run(command, REMOTE).startswith("Error:"), command
    assert "No matches" in t.run("search_dir nothing-here", REMOTE)


def test_a_hard_link_is_not_written_through(ws: Path, tmp_path: Path) -> None:
    outside = tmp_path / "host.txt"
    outside.write_text("host\n")
    os.link(outside, ws / "linked.txt")
    t = tools(ws)
    t.run("open linked.txt", REMOTE)
    assert "Error" in t.run("edit 1:1\nchanged\nend_of_edit", REMOTE)
    assert outside.read_text() == "host\n"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_swapping_a_directory_for_a_symlink_never_leads_the_tools_outside(ws: Path, tmp_path: Path) -> None:
    """A process swaps `d` (a real directory) and `s` (a symlink to a host directory) as fast as it can
    (renameat2 RENAME_EXCHANGE) while the host tools read, edit, create and search under `d`."""
    import ctypes

    host = tmp_path / "host"
    host.mkdir()
    (host / "f.txt").write_text("HOST SECRET\n")
    (ws / "d").mkdir()
    (ws / "d" / "f.txt").write_text("mine\n")
    os.symlink(host, ws / "s")
    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "renameat2"):
        pytest.skip("no renameat2 in libc")
    pid = os.fork()
    if pid == 0:  # the attacker
        a, b = str(ws / "d").encode(), str(ws / "s").encode()
        while True:
            libc.renameat2(-100, a, -100, b, 2)  # AT_FDCWD, RENAME_EXCHANGE
    try:
        t = tools(ws)
        for i in range(300):
            for obs in (t.run("open d/f.txt", REMOTE), t.run("search_file SECRET d/f.txt", REMOTE),
                        t.run("search_dir SECRET d", REMOTE), t.run(f"create d/new{i}.txt", REMOTE),
                        t.run("edit 1:1\npwned\nend_of_edit", REMOTE)):
                assert "HOST SECRET" not in obs and "Found" not in obs
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    assert (host / "f.txt").read_text() == "HOST SECRET\n" and sorted(os.listdir(host)) == ["f.txt"]


TRAINING = ["python train.py", "python3 -m pkg.train", "cd src && python3 main.py", "torchrun --nproc_per_node=2 t.py",
            "accelerate launch t.py", "deepspeed t.py", "timeout 60 python train.py"]
NOT_TRAINING = ["ls -la", "cat python_notes.txt", "pip list | grep pythonic", "echo done", "pytorch_info"]


@pytest.mark.parametrize("command", TRAINING + NOT_TRAINING)
def test_training_commands_are_those_that_run_python_or_a_launcher(command: str) -> None:
    assert is_training_command(command) is (command in TRAINING)
