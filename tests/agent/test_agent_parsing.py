from __future__ import annotations

import pytest

from gymforge.agent.parsing import FormatError, parse_reply


def test_discussion_and_command() -> None:
    thought, action = parse_reply("DISCUSSION\nLet me look around.\n\n```bash\nls -la\n```\n")
    assert (thought, action) == ("DISCUSSION\nLet me look around.", "ls -la")


def test_text_after_the_block_is_part_of_the_thought() -> None:
    thought, action = parse_reply("First.\n```\npwd\n```\nThen we will see.")
    assert (thought, action) == ("First.\nThen we will see.", "pwd")


@pytest.mark.parametrize(
    ("reply", "needle"),
    [
        ("I will list the files: ls -la", "no command block"),
        ("one\n```\nls\n```\ntwo\n```\npwd\n```", "2 command blocks"),
        ("empty\n```\n\n   \n```", "empty"),
        ("open\n```\nls -la\n", "never closed"),
        ("", "empty"),
        (None, "empty"),
        ("   \n", "empty"),
    ],
)
def test_malformed_replies(reply: str | None, needle: str) -> None:
    with pytest.raises(FormatError, match=needle):
        parse_reply(reply)


def test_multiline_edit_block_is_one_action() -> None:
    reply = "Fix the loop.\n```\nedit 3:5\nfor i in range(10):\n    total += i\nend_of_edit\n```"
    _, action = parse_reply(reply)
    assert action == "edit 3:5\nfor i in range(10):\n    total += i\nend_of_edit"


def test_fences_inside_an_edit_body_are_content() -> None:
    reply = (
        "Update the README.\n```\nedit 1:2\n# Usage\n```bash\npython train.py\n```\nend_of_edit\n```\n"
    )
    _, action = parse_reply(reply)
    assert action == "edit 1:2\n# Usage\n```bash\npython train.py\n```\nend_of_edit"


def test_backticks_inside_the_command() -> None:
    reply = 'Note ```inline``` is prose.\n```\necho "`date`" && echo \'``` not a fence\'\n```'
    thought, action = parse_reply(reply)
    assert action == "echo \"`date`\" && echo '``` not a fence'"
    assert thought == "Note ```inline``` is prose."


def test_longer_fence_may_contain_a_shorter_one() -> None:
    _, action = parse_reply("x\n````\ncat <<EOF\n```\nEOF\n````")
    assert action == "cat <<EOF\n```\nEOF"


def test_trailing_whitespace_and_crlf() -> None:
    thought, action = parse_reply("DISCUSSION  \r\nRun it.\r\n```bash   \r\n  python train.py   \r\n```   \r\n")
    assert (thought, action) == ("DISCUSSION  \nRun it.", "python train.py")


def test_indented_fence_is_dedented() -> None:
    _, action = parse_reply("Plan:\n  ```\n  edit 1:1\n      x = 1\n  end_of_edit\n  ```")
    assert action == "edit 1:1\n    x = 1\nend_of_edit"


def test_indented_fences_are_content_when_fences_start_in_column_0() -> None:
    # As MLGym reads them: a line "  ```" inside a column-0 block neither closes it nor counts in an edit body.
    _, action = parse_reply("Indent the README's example.\n```\nedit 3:4\n  ```\n  pip install .\nend_of_edit\n```")
    assert action == "edit 3:4\n  ```\n  pip install .\nend_of_edit"
    _, action = parse_reply("Run it:\n```\nx = 1\n  ```\n```")
    assert action == "x = 1\n  ```"


# Replies MLGym's parser turns into an action (measured on its released trajectories by
# bench/parser_agreement.py): the same action here. Examples written for these tests.

def test_quirk_command_repeated_after_the_block() -> None:
    # gemini-2.0-flash-thinking: block, a line COMMAND, the command again, a closing fence (left unmatched).
    reply = "DISCUSSION\nList the data.\n\n```\nls data/\n```\nCOMMAND\nls data/\n```"
    thought, action = parse_reply(reply)
    assert action == "ls data/"
    assert thought == "DISCUSSION\nList the data.\n\nCOMMAND\nls data/\n```"


def test_quirk_complete_edit_repeated_after_the_block() -> None:
    edit = "edit 4:4\n    lr = 0.01\nend_of_edit"
    _, action = parse_reply(f"Lower the rate.\n```\n{edit}\n```\nCOMMAND\n{edit}\n```\n")
    assert action == edit


def test_quirk_edit_closed_before_its_terminator() -> None:
    # The first copy lacks end_of_edit, the repeat has it: MLGym runs the first copy (and its edit tool
    # reports the missing terminator); the fence after the first copy closes the block.
    body = "edit 4:4\n    lr = 0.01"
    reply = f"Lower the rate.\n```\n{body}\n```\nCOMMAND\n{body}\nend_of_edit\n```"
    assert parse_reply(reply)[1] == body


def test_quirk_insert_closed_before_its_terminator() -> None:
    body = "insert 10\n    print(loss)"
    reply = f"Debug.\n```\n{body}\n```\nCOMMAND\n{body}\nend_of_insert\n```\n\n"
    assert parse_reply(reply)[1] == body


def test_single_fence_line_before_the_terminator_closes_the_edit() -> None:
    # One fence before end_of_edit cannot be a fenced example inside the file: the block ends there.
    reply = "Close the README's code block.\n```\nedit 9:9\n```\nend_of_edit\n```"
    assert parse_reply(reply)[1] == "edit 9:9"


def test_stray_fence_with_text_after_it_is_a_second_command() -> None:
    # Genuinely ambiguous: two commands, the second unclosed. MLGym would run the first; we ask again.
    with pytest.raises(FormatError, match="line 5 is never closed"):
        parse_reply("First.\n```\nls\n```\n```\npython train.py\n")


def test_fenced_discussion_before_an_unclosed_command_is_ambiguous() -> None:
    # The fences pair up as (discussion) + unclosed (command); MLGym ran the discussion as a command.
    reply = "```\nDISCUSSION\nAdd a print.\n```\ninsert 3\nprint(x)\nend_of_insert\n```\nCOMMAND\ninsert 3\nprint(x)"
    with pytest.raises(FormatError, match="never closed"):
        parse_reply(reply)


def test_stray_fence_without_any_block_is_unclosed() -> None:
    with pytest.raises(FormatError, match="never closed"):
        parse_reply("Run it:\nls -la\n```")
