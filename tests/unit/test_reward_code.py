"""reward.fn=code without running anything: code blocks, the rows' test layouts, output matching."""

from __future__ import annotations

import pytest

from reasonrl.reward.code import last_code_block, row_tests, same_output


def test_the_last_fenced_block_is_the_program():
    text = "first\n```python\nprint(1)\n```\nthen\n```py\nprint(2)\n```\nand ```\nplain\n```"
    assert last_code_block(text) == "plain\n"
    assert last_code_block("```python\nx = 1\n```") == "x = 1\n"
    assert last_code_block("no code here") is None


def test_tests_in_every_layout():
    io = '{"inputs": ["1 2\\n", ["3", "4"]], "outputs": ["3\\n", "7"]}'
    assert row_tests(io, {}) == ("io", (["1 2\n", "3\n4"], ["3\n", "7"]))
    assert row_tests("", {"input_output": io})[0] == "io"
    assert row_tests("", {"test_list": ["assert f(1)==2"], "test_imports": ["import math"], "test_setup_code": "y = 1"}) == (
        "asserts", ("import math\ny = 1", ["assert f(1)==2"]))
    assert row_tests('["assert f(0)==1"]', {}) == ("asserts", ("", ["assert f(0)==1"]))
    with pytest.raises(ValueError, match="2 inputs but 1 outputs"):
        row_tests('{"inputs": ["1", "2"], "outputs": ["1"]}', {})
    with pytest.raises(ValueError, match="the row has no tests"):
        row_tests("42", {})


def test_outputs_match_up_to_trailing_whitespace():
    assert same_output("3  \n4\n\n", "3\n4")
    assert not same_output("3 4", "3\n4") and not same_output(" 3", "3")
