import pytest

from gymforge.llm.json_reply import NotJSON, extract_json


@pytest.mark.parametrize("text", [
    '["a", "b"]',
    'Here you go:\n```json\n["a", "b"]\n```\nEnjoy.',
    'Sure. ["a", "b"] are my picks',
])
def test_arrays_are_found_in_common_reply_shapes(text):
    assert extract_json(text, list) == ["a", "b"]


def test_object_after_a_broken_one():
    assert extract_json('{"topic": oops} then {"topic": "x"}', dict) == {"topic": "x"}


@pytest.mark.parametrize("text", ["", "topic: graph learning, metric: accuracy", '{"topic": "x",'])
def test_replies_without_json_raise(text):
    with pytest.raises(NotJSON):
        extract_json(text, dict)
