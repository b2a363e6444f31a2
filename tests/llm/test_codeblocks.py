"""Splitting a teacher answer into files."""

from __future__ import annotations

import pytest

from gymforge.llm.codeblocks import CodeBlockError, parse_files


def test_yaml_and_python_blocks_with_prose() -> None:
    answer = (
        "Here is the task config.\n\n"
        "```yaml\n# configs/tasks/penguins.yaml\nid: penguins\nname: Penguins\n```\n\n"
        "And the baseline:\n"
        "```python\n# data/penguins/baseline.py\nimport numpy as np\n\n\nprint(np.pi)\n\n\n```\n"
        "Good luck!"
    )
    assert parse_files(answer) == {
        "configs/tasks/penguins.yaml": "id: penguins\nname: Penguins\n",
        "data/penguins/baseline.py": "import numpy as np\n\n\nprint(np.pi)\n",
    }


@pytest.mark.parametrize(
    ("first_line", "path"),
    [
        ("# data/t/a.py", "data/t/a.py"),
        ("// web/app.js", "web/app.js"),
        ("<!-- docs/README.md -->", "docs/README.md"),
        ("-- sql/q.sql", "sql/q.sql"),
        ("#data/t/requirements.txt", "data/t/requirements.txt"),
        ("# file: data/t/b.py", "data/t/b.py"),
        ("# ./data/t/c.py", "data/t/c.py"),
    ],
)
def test_path_comment_styles(first_line: str, path: str) -> None:
    assert parse_files(f"```\n{first_line}\nbody\n```") == {path: "body\n"}


def test_tilde_fence_crlf_and_no_language_tag() -> None:
    assert parse_files("~~~\r\n# a/b.txt\r\nx\r\ny\r\n~~~\r\n") == {"a/b.txt": "x\ny\n"}


def test_long_fence_may_contain_short_fences() -> None:
    answer = "````markdown\n# data/t/NOTES.md\nRun:\n```bash\npython baseline.py\n```\n````\n"
    assert parse_files(answer) == {"data/t/NOTES.md": "Run:\n```bash\npython baseline.py\n```\n"}


def test_no_blocks() -> None:
    with pytest.raises(CodeBlockError, match="no fenced code blocks"):
        parse_files("I think the task should predict species.")


def test_unterminated_block() -> None:
    with pytest.raises(CodeBlockError, match=r"opened with ``` at line 2\) is never closed"):
        parse_files("ok\n```python\n# a.py\nx = 1\n")


def test_block_without_path_comment() -> None:
    with pytest.raises(CodeBlockError, match="does not start with a comment naming its file") as err:
        parse_files("```python\n# Train the model\nx = 1\n```")
    assert "'# Train the model'" in str(err.value)


@pytest.mark.parametrize(("path", "why"), [("/etc/passwd", "absolute"), ("data/../../x.py", "'..'")])
def test_unsafe_paths(path: str, why: str) -> None:
    with pytest.raises(CodeBlockError, match=why):
        parse_files(f"```\n# {path}\nx\n```")


def test_duplicate_path_and_all_errors_collected() -> None:
    answer = "```\n# a.py\n1\n```\n```\n# ./a.py\n2\n```\n```\nno path\n```\n"
    with pytest.raises(CodeBlockError) as err:
        parse_files(answer)
    assert len(err.value.errors) == 2
    assert "'a.py' is written twice" in err.value.errors[0]
    assert "code block 3" in err.value.errors[1]
