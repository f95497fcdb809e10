"""reasonrl.env: the protocol and its checks, make_env, the grid and tool_arith envs, tools,
ToolEnv, EnvPool (failures, timeouts, dead workers) and env_check."""

from __future__ import annotations

import math
import os
import re

import numpy as np
import pytest

from reasonrl.config import EnvConfig, load
from reasonrl.env import (EnvCheckReport, EnvFailure, EnvPool, EnvProtocolError, GridEnv, GymTextAdapter,
                          ToolArithEnv, ToolCall, ToolCallError, ToolEnv, check_reset, check_step, env_attribute,
                          env_check, make_env, parse_tool_calls)
from reasonrl.env.arith import FORMAT_HINT
from reasonrl.env.calculator import CalculatorError, calculate
from reasonrl.env.grid import parse_move
from reasonrl.env.tools import CALCULATOR, PYTHON, TOOLS, check_response_format, format_tool_call, tool_call_regex
from reasonrl.errors import InputError
from reasonrl.runtime.pool import PoolStart
from reasonrl.runtime.topology import plan as plan_topology

FIXTURES = "tests.env_fixtures"


def workers(count: int, timeout_s: float = 10.0) -> PoolStart | None:
    """``count`` env worker processes, each call bounded by ``timeout_s`` (None: in this process)."""
    return PoolStart("env", count, timeout_s) if count else None


def alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def call(expression: str) -> str:
    return format_tool_call("calculator", {"expression": expression})


# --- grid ---------------------------------------------------------------------------------------


def test_grid_board_of_a_seed_and_its_shortest_path():
    env = GridEnv()
    # seed 3: S at (1,3), G at (2,1), holes (0,2) (1,1) (2,0): one row down, two columns left
    assert env.reset(3) == ("..H.\n.H.S\nHG..\n....\nmove:", {"optimal_steps": 3})
    assert env.demonstration(3) == ["D", "L", "L"]
    assert env.step("D") == ("..H.\n.H.S\nHG.@\n....\nmove:", 0.0, False, False, {"move": "D"})
    assert env.step("l")[0] == "..H.\n.H.S\nHG@.\n....\nmove:"
    assert env.step(" left\n") == ("..H.\n.H.S\nH@..\n....\ngoal", 1.0, True, False, {"move": "L", "success": True})
    with pytest.raises(RuntimeError, match="reset first"):
        env.step("U")


def test_grid_is_deterministic_solvable_and_compact():
    env, again = GridEnv(), GridEnv()
    for seed in range(200):
        board = env.board(seed)
        assert board == again.board(seed)
        assert 2 <= len(board.path) <= env.max_steps
        observation, _ = env.reset(seed)
        assert len(observation) < 40
        for k, move in enumerate(env.demonstration(seed)):
            observation, reward, terminated, truncated, info = env.step(move)
            assert len(observation) < 40
            last = k == len(board.path) - 1
            assert (reward, terminated, truncated) == ((1.0, True, False) if last else (0.0, False, False))
        assert info["success"] is True
    assert len({env.reset(seed)[0] for seed in range(50)}) > 40


def test_grid_hole_ends_the_episode_without_reward():
    env = GridEnv()
    assert env.reset(2)[0] == "...H\nG...\n.S..\n.H.H\nmove:"  # S at (2,1), a hole right below
    assert env.step("D") == ("...H\nG...\n.S..\n.@.H\nhole", 0.0, True, False, {"move": "D", "success": False})


def test_grid_walls_and_invalid_moves_count_until_truncation():
    env = GridEnv(max_steps=3)
    assert env.reset(0)[0] == "H...\nH.H.\n....\nS..G\nmove:"  # S in the bottom-left corner
    assert env.step("D") == ("wall\nH...\nH.H.\n....\nS..G\nmove:", 0.0, False, False, {"move": "D"})
    assert env.step("jump") == ("invalid move\nH...\nH.H.\n....\nS..G\nmove:", 0.0, False, False, {"move": None})
    assert env.step("L") == ("H...\nH.H.\n....\nS..G\nout of moves", 0.0, False, True, {"move": "L", "success": False})


def test_grid_reads_moves_leniently():
    assert [parse_move(a) for a in ("R", " d\n", "Up", "left!", "go right", "turn Down now", "", "x", "north")] == [
        "R", "D", "U", "L", "R", "D", None, None, None]


def test_grid_arguments_are_checked():
    with pytest.raises(InputError, match=r"env\.args\.size = 1: expected an integer from 2 to 8"):
        GridEnv(size=1)
    with pytest.raises(InputError, match=r"env\.args\.holes = 14: no 4x4 board"):
        GridEnv(holes=14)  # S and G alone, next to each other: a 1-move path
    with pytest.raises(InputError, match=r"env\.args\.max_steps"):
        GridEnv(max_steps=1)


# --- calculator and tool calls ------------------------------------------------------------------


@pytest.mark.parametrize("expression, value", [
    ("347*29", "10063"), ("7/2", "3.5"), ("6/3", "2"), ("2**10 - 1", "1023"), ("-(3+4)*2", "-14"),
    ("17//5", "3"), ("17 % 5", "2"), ("1/3", "0.333333333333"), ("0.1+0.2", "0.3"), ("+5", "5"),
])
def test_calculator_values(expression, value):
    assert calculate(expression) == value


@pytest.mark.parametrize("expression, message", [
    ("__import__('os').system('ls')", "function call"),
    ("x + 1", "the name 'x'"),
    ("(1).real", "attribute"),
    ("'a' * 3", "str literal"),
    ("2**1000", "exponent 1000 out of range"),
    ("10**99 * 10**99", "too large"),
    ("11**99", "too large"),  # 99 * log10(11) = 103 digits
    ("1/0", "division by zero"),
    ("5 % 0", "division by zero"),
    ("2^3", "use \\*\\*"),
    ("(-8)**0.5", "not a real number"),
    ("1 < 2", "Compare"),
    ("1+", "cannot parse"),
    ("1" * 201, "at most 200"),
])
def test_calculator_refuses_anything_but_arithmetic(expression, message):
    with pytest.raises(CalculatorError, match=message):
        calculate(expression)
    assert CALCULATOR.run({"expression": expression}).startswith("error: ")


def test_tool_schema_is_openai_style():
    assert CALCULATOR.schema() == {"type": "function", "function": {
        "name": "calculator",
        "description": CALCULATOR.description,
        "parameters": {"type": "object", "properties": {"expression": {"type": "string", "description": "e.g. 347*29"}},
                       "required": ["expression"]}}}
    assert set(TOOLS) == {"calculator", "python"}


def test_parse_tool_calls():
    text = ('first <tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call> then\n'
            '<tool_call>\n{"name": "calculator",\n "arguments": "{\\"expression\\": \\"4*5\\"}"}\n</tool_call>')
    assert parse_tool_calls(text) == [ToolCall("calculator", {"expression": "2+3"}),
                                      ToolCall("calculator", {"expression": "4*5"})]
    assert parse_tool_calls("Answer: 5") == []
    assert parse_tool_calls('CALL({"name":"calculator","arguments":{"expression":"1"}})', r"CALL\((.*?)\)") == [
        ToolCall("calculator", {"expression": "1"})]


@pytest.mark.parametrize("body, message", [
    ('{"name": "calculator", ', "malformed JSON"),
    ('["calculator"]', 'expected {"name": TOOL'),
    ('{"name": "abacus", "arguments": {}}', "unknown tool 'abacus' \\(tools: calculator, python\\)"),
    ('{"name": "calculator", "arguments": {}}', "calculator: missing argument 'expression'"),
    ('{"name": "calculator", "arguments": {"expression": "1", "x": 2}}',
     "unexpected argument 'x' \\(takes expression\\)"),
    ('{"name": "calculator", "arguments": {"expression": 5}}', "argument 'expression' must be string, got int"),
    ('{"name": "calculator", "arguments": "{oops"}', "arguments are malformed JSON"),
    ('{"name": "calculator", "arguments": [1]}', "arguments must be an object, got list"),
])
def test_parse_tool_calls_reports_bad_calls(body, message):
    (got,) = parse_tool_calls(f"<tool_call>{body}</tool_call>")
    assert isinstance(got, ToolCallError) and got.text == body.strip()
    assert re.search(message, got.message), got.message


def test_tool_call_pattern_and_response_format_are_checked():
    with pytest.raises(InputError, match="env.tool_call_pattern = '\\(': not a regular expression"):
        tool_call_regex("(")
    with pytest.raises(InputError, match="env.tool_call_pattern = 'CALL': expected a group"):
        tool_call_regex("CALL")
    with pytest.raises(InputError, match="env.tool_response_format"):
        check_response_format("<r>{out}</r>")
    with pytest.raises(InputError, match="env.tool_response_format"):
        check_response_format("no field")


def test_python_tool_runs_in_the_sandbox():
    assert PYTHON.run({"code": "print(6*7)"}) == "42\n"
    assert PYTHON.run({"code": "print('a'); raise ValueError('bad')"}) == "a\nerror: ValueError: bad"


def test_tool_env_routes_tool_calls_and_moves():
    env = ToolEnv(GridEnv(), [CALCULATOR], max_tool_turns=2)
    assert env.reset(3) == ("tools: calculator(expression)\n..H.\n.H.S\nHG..\n....\nmove:", {"optimal_steps": 3})
    assert env.step(call("2+3")) == ("<tool_response>5</tool_response>", 0.0, False, False, {
        "tool": [{"name": "calculator", "arguments": {"expression": "2+3"}, "output": "5"}]})
    assert env.step("D")[:4] == ("..H.\n.H.S\nHG.@\n....\nmove:", 0.0, False, False)  # the grid's move
    observation, reward, terminated, truncated, info = env.step("<tool_call>{bad</tool_call>")
    assert observation.startswith("<tool_response>error: malformed JSON") and (reward, terminated, truncated) == (
        0.0, False, False)
    assert info["tool"][0]["call"] == "{bad"
    assert env.step(call("1/0")) == ("<tool_response>error: division by zero</tool_response>", 0.0, False, True, {
        "tool": [{"name": "calculator", "arguments": {"expression": "1/0"}, "output": "error: division by zero"}],
        "success": False})  # the second tool turn in a row: truncated


def test_tool_env_answers_the_inner_envs_own_tools():
    env = ToolEnv(ToolArithEnv(), [PYTHON, CALCULATOR])
    first, _ = env.reset(0)
    assert first == "tools: python(code)\n964*59=? <tool_call> calculator(expression), or Answer: N"
    assert env.step(call("964*59"))[0] == "<tool_response>56876</tool_response>"
    assert env.step("Answer: 56876")[:4] == ("correct", 1.0, True, False)


# --- tool_arith ---------------------------------------------------------------------------------


def test_tool_arith_demonstration_succeeds():
    env = ToolArithEnv()
    assert env.problem(0) == ("964*59", 56876)  # 964*60 - 964
    assert env.reset(0) == ("964*59=? <tool_call> calculator(expression), or Answer: N", {})
    first, second = env.demonstration(0)
    assert first == '<tool_call>{"name":"calculator","arguments":{"expression":"964*59"}}</tool_call>'
    assert env.step(first) == ("<tool_response>56876</tool_response>", 0.0, False, False, {
        "tool": [{"name": "calculator", "arguments": {"expression": "964*59"}, "output": "56876"}]})
    assert env.step(second) == ("correct", 1.0, True, False, {"success": True})
    for seed in range(100):
        observations = [env.reset(seed)[0]] + [env.step(a)[0] for a in env.demonstration(seed)]
        assert max(map(len, observations)) < 80
        assert observations[-1] == "correct"


def test_tool_arith_wrong_answers_and_format_errors():
    env = ToolArithEnv(max_turns=2)
    env.reset(0)
    assert env.step("Answer: 56877") == ("wrong", 0.0, True, False, {"success": False})
    env.reset(0)
    assert env.step("so answer: 56,876.")[:4] == ("correct", 1.0, True, False)
    env.reset(0)
    assert env.step("hmm") == (FORMAT_HINT, 0.0, False, False, {})
    assert env.step("still thinking") == (FORMAT_HINT, 0.0, False, True, {"success": False})
    env.reset(1)
    observation = env.step('<tool_call>{"name": "' + "x" * 200 + '"}</tool_call>')[0]
    assert observation.startswith("<tool_response>error: unknown tool") and len(observation) < 80
    for seed in range(50):
        (guess,) = env.guess(seed)
        env.reset(seed)
        assert env.step(guess)[1] == 0.0


def test_tool_arith_arguments_are_checked():
    assert ToolArithEnv(digits=2, digits2=1, ops="+").problem(5)[0].count("+") == 1
    with pytest.raises(InputError, match=r"env\.args\.ops = '/'"):
        ToolArithEnv(ops="/")
    with pytest.raises(InputError, match=r"env\.args\.digits = 0"):
        ToolArithEnv(digits=0)


# --- protocol checks and make_env ---------------------------------------------------------------


@pytest.mark.parametrize("result, message", [
    (("x", "1", False, False, {}), "step\\(\\) returned reward of type str, expected a number"),
    (("x", True, False, False, {}), "reward of type bool"),
    (("x", math.nan, False, False, {}), "reward nan, expected a finite number"),
    ((3, 0.0, False, False, {}), "step\\(\\) returned observation of type int, expected str"),
    (("x", 0.0, 1, False, {}), "terminated of type int, expected bool"),
    (("x", 0.0, False, None, {}), "truncated of type NoneType"),
    (("x", 0.0, False, False, None), "info of type NoneType, expected dict"),
    (("x", 0.0, False, False), "a tuple of 4 items, expected a tuple of 5"),
    (["x", 0.0, False, False, {}], "step\\(\\) returned a list"),
])
def test_check_step_names_the_field(result, message):
    with pytest.raises(EnvProtocolError, match=message):
        check_step(result)


def test_checks_accept_numpy_and_return_plain_values():
    step = check_step(("x", np.float32(0.5), np.bool_(True), np.bool_(False), {}))
    assert step == ("x", 0.5, True, False, {}) and [type(v) for v in step[1:4]] == [float, bool, bool]
    assert check_step(("x", 1, False, False, {}))[1] == 1.0
    assert check_reset(("x", {})) == ("x", {})
    with pytest.raises(EnvProtocolError, match="reset\\(\\) returned observation of type int"):
        check_reset((1, {}))
    with pytest.raises(EnvProtocolError, match="reset\\(\\) returned a str"):
        check_reset("x")


def test_make_env_by_registry_name_and_import_path():
    env = make_env("grid", {"size": 3, "holes": 1})
    assert isinstance(env, GridEnv) and env.size == 3
    assert make_env(f"{FIXTURES}:NeedsLevel", {"level": 2}).reset(0) == ("level 2", {})
    wrapped = make_env("grid", {}, tools=("calculator",))
    assert isinstance(wrapped, ToolEnv) and env_attribute(wrapped, "demonstration")(3) == ["D", "L", "L"]
    assert env_attribute(wrapped, "no_such_thing") is None


@pytest.mark.parametrize("name, args, message", [
    ("gird", {}, "env.name = 'gird': unknown environment; did you mean 'grid'\\?"),
    ("no_such_module:Env", {}, "env.name = 'no_such_module:Env': cannot import module 'no_such_module'"),
    (f"{FIXTURES}:Nope", {}, "env.name = 'tests.env_fixtures:Nope': module 'tests.env_fixtures' has no attribute"),
    (f"{FIXTURES}:NotAnEnv", {}, "has no reset\\(\\) and step\\(\\)"),
    (f"{FIXTURES}:Exploding", {}, "env.name = 'tests.env_fixtures:Exploding': building it .* RuntimeError: no GPU"),
    ("grid", {"sise": 4}, "env.args.sise: grid takes no argument 'sise'; did you mean env.args.size\\?"),
    ("grid", {"size": 1}, "env.args.size = 1"),
    (f"{FIXTURES}:NeedsLevel", {}, "env.args.level: tests.env_fixtures:NeedsLevel needs this argument"),
])
def test_make_env_errors_name_the_key(name, args, message):
    with pytest.raises(InputError, match=message):
        make_env(name, args)


def test_make_env_rejects_unknown_tools():
    with pytest.raises(InputError, match="env.tools: unknown tool 'abacus'; expected some of calculator, python"):
        make_env("grid", {}, tools=("abacus",))


def test_make_env_adapts_a_text_gymnasium_env():
    pytest.importorskip("gymnasium")
    env = make_env(f"{FIXTURES}:TextGym")
    assert isinstance(env, GymTextAdapter)
    first, _ = env.reset(7)
    assert first == env.reset(7)[0] and first.startswith("start ")
    step = env.step("stop")
    assert step == (f"{first[6:]} stop", 0.5, True, False, {}) and type(step[2]) is bool


def test_make_env_adapts_gymnasium_style_keywords_without_gymnasium():
    env = make_env(f"{FIXTURES}:GemLike")
    assert isinstance(env, GymTextAdapter)
    assert env.reset(4) == ("gem 4", {"options": None})
    assert env.step("go") == ("4:go", 0.5, True, False, {})
    with pytest.raises(EnvProtocolError, match="step\\(\\) returned a list"):
        env.step("list")


# --- EnvPool ------------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [0, 1, 2])
@pytest.mark.parametrize("name, turns", [("grid", [["R", "U", "x"], [None, "R", "L"]]),  # a wall, ice, a hole
                                         ("tool_arith", [[call("1+1"), "hi", "Answer: 3"], ["Answer: 1", "x", None]])])
def test_pool_results_equal_in_process_results(count, name, turns):
    envs = [make_env(name) for _ in range(3)]
    seeds = [4, 5, 4]
    with EnvPool(name, {}, size=3, workers=workers(count, 5.0)) as pool:
        assert pool.reset_many(seeds) == [env.reset(seed) for env, seed in zip(envs, seeds)]
        for actions in turns:
            expected = [None if a is None else env.step(a) for env, a in zip(envs, actions)]
            assert pool.step_many(actions) == expected
        assert all(t is None or t >= 0 for t in pool.last_call_s)
        assert pool.replacements == 0


@pytest.mark.parametrize("count", [0, 2])
def test_pool_env_errors_fail_their_slot_only(count):
    with EnvPool(f"{FIXTURES}:Faulty", {}, size=3, workers=workers(count, 5.0)) as pool:
        assert pool.reset_many([1, -1, 3]) == [("seed 1", {}), EnvFailure(1, "reset() raised ValueError: negative seed",
                                                                          "error"), ("seed 3", {})]
        got = pool.step_many(["raise", None, "a"])
        assert got == [EnvFailure(0, "step() raised ValueError: boom", "error"), None, ("a 1", 0.0, False, False, {})]
        with pytest.raises(ValueError, match="slot 0 has no episode in progress"):
            pool.step_many(["a", None, None])
        got = pool.step_many([None, None, "lambda"])[2]  # an info that does not pickle
        if count:
            assert got.kind == "protocol" and got.message.startswith("step() returned a result that cannot be sent")
        else:
            assert got[0] == "x"
        pool.reset_many([0, 0, 0])
        assert pool.step_many(["b", "b", "b"]) == [("b 1", 0.0, False, False, {})] * 3


def test_pool_reports_protocol_violations():
    with EnvPool(f"{FIXTURES}:WrongReward", {}, size=2, workers=workers(1, 5.0)) as pool:
        pool.reset_many([0, 1])
        assert pool.step_many(["a", None]) == [
            EnvFailure(0, "step() returned reward of type str, expected a number", "protocol"), None]


def test_pool_timeout_kills_the_worker_and_the_pool_goes_on():
    # slots 0 and 2 live in worker 0, slot 1 in worker 1
    with EnvPool(f"{FIXTURES}:Faulty", {}, size=3, workers=workers(2, 0.5)) as pool:
        old = pool.pids[0]
        pool.reset_many([0, 1, 2])
        got = pool.step_many(["hang", "a", "a"])
        assert got[0] == EnvFailure(0, "step() took longer than runtime.roles.env.timeout_s = 0.5s", "timeout")
        assert got[1] == ("a 1", 0.0, False, False, {})
        assert got[2].kind == "died" and "replaced after slot 0's step() timed out" in got[2].message
        assert pool.replacements == 1 and pool.pids[0] != old and not alive(old)
        assert pool.step_many([None, "b", None]) == [None, ("b 2", 0.0, False, False, {}), None]
        assert pool.reset_many([5, 6, 7])[0] == ("seed 5", {})
        assert pool.step_many(["c", "c", "c"]) == [("c 1", 0.0, False, False, {}), ("c 1", 0.0, False, False, {}),
                                                   ("c 1", 0.0, False, False, {})]
        # a slot of the killed worker that was not called loses its episode: its next step fails
        assert pool.step_many([None, None, "hang"])[2].kind == "timeout"
        lost = pool.step_many(["d", None, None])[0]
        assert lost.kind == "died" and "replaced after slot 2's step() timed out" in lost.message
        assert pool.reset_many([0, 1, 2])[0] == ("seed 0", {})


def test_pool_replaces_a_worker_that_dies():
    with EnvPool(f"{FIXTURES}:Faulty", {}, size=2, workers=workers(1, 5.0)) as pool:
        pool.reset_many([0, 1])
        got = pool.step_many(["exit", "a"])
        assert got[0].kind == "died" and got[0].message.startswith("step() ended the env worker")
        assert "exit code 3" in got[0].message
        assert got[1].kind == "died"
        assert pool.replacements == 1
        pool.reset_many([0, 1])
        assert pool.step_many(["a", "a"]) == [("a 1", 0.0, False, False, {})] * 2


def test_pool_start_errors_are_input_errors_and_close_reaps_workers():
    with pytest.raises(InputError, match="env.args.size = 1"):
        EnvPool("grid", {"size": 1}, size=2, workers=workers(1))
    with pytest.raises(InputError, match="Exploding': building it .* no GPU here"):
        EnvPool(f"{FIXTURES}:Exploding", size=1, workers=workers(1))
    with pytest.raises(InputError, match="runtime.roles.env.timeout_s = 0"):
        workers(1, timeout_s=0)
    pool = EnvPool.from_config(EnvConfig(name="grid"), size=4, workers=workers(3))
    procs = pool.pids
    assert len(procs) == 3 and all(alive(p) for p in procs)
    with pytest.raises(ValueError, match="5 seeds for 4 slots"):
        pool.reset_many([0, 1, 2, 3, 4])
    # the first slots only: a smaller wave
    assert [r[0] for r in pool.reset_many([3, 2])] == ["..H.\n.H.S\nHG..\n....\nmove:", "...H\nG...\n.S..\n.H.H\nmove:"]
    assert [r[:4] for r in pool.step_many(["D", "D"])] == [("..H.\n.H.S\nHG.@\n....\nmove:", 0.0, False, False),
                                                          ("...H\nG...\n.S..\n.@.H\nhole", 0.0, True, False)]
    with pytest.raises(ValueError, match="slot 2 has no episode in progress"):
        pool.step_many([None, None, "D"])
    pool.close()
    pool.close()
    assert not any(alive(p) for p in procs)


# --- env_check ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["grid", "tool_arith"])
@pytest.mark.parametrize("policy", ["random", "scripted"])
def test_env_check_passes_the_shipped_envs(name, policy):
    report = env_check(name, {}, episodes=10, policy=policy, workers=workers(1))
    assert report.problems == [] and report.passed
    assert len(report.returns) == len(report.lengths) == 10
    assert report.endings["failed"] == 0 and report.endings["cut"] == 0
    if policy == "scripted":
        assert report.returns == [1.0] * 10 and report.success_rate == 1.0
    text = report.describe()
    assert text.startswith(f"env-check {name} {{}} (policy {policy}, 10 episodes, seeds 0..9)")
    assert text.endswith("PASS") and "success: " in text and "timing:  reset median" in text


@pytest.mark.parametrize("env, policy, message", [
    ("WrongReward", "scripted", "seed 0: step() returned reward of type str, expected a number (in 3 episodes)"),
    ("Unseeded", "scripted", "reset(0) twice gave different observations"),
    ("NoisyStep", "random", "seed 0, turn 1 (action"),
])
def test_env_check_names_the_problem(env, policy, message):
    report = env_check(f"{FIXTURES}:{env}", episodes=3, policy=policy, max_turns=3, workers=workers(1))
    assert not report.passed
    assert any(message in p for p in report.problems), report.problems
    assert "FAIL" in report.describe() and message in report.describe()


@pytest.mark.parametrize("policy", ["scripted", "random"])
def test_env_check_passes_an_env_whose_seed_shows_after_the_first_observation(policy):
    """Guess-the-number: one first observation for all seeds, but the seed's secret decides the
    replies and rewards of the same actions, so the seed is used: no problem, no warning."""
    report = env_check(f"{FIXTURES}:GuessNumber", episodes=5, policy=policy, max_turns=3, workers=workers(1))
    assert report.passed and report.warnings == [], report.describe()
    assert report.describe().endswith("PASS")


def test_env_check_warns_where_the_seed_changes_nothing_observable():
    report = env_check(f"{FIXTURES}:SeedIgnored", episodes=3, policy="scripted", max_turns=3, workers=workers(1))
    assert report.passed, report.problems
    assert report.warnings == ["all 3 seeds gave the same first observation 'start', and the 1 actions of seed 0's "
                               "episode gave the same steps on every seed: the seed changes nothing observable "
                               "(is reset(seed) using its seed?)"]
    text = report.describe()
    assert f"warning: {report.warnings[0]}\nPASS" in text


def test_env_check_reports_raising_and_hanging_envs():
    report = env_check(f"{FIXTURES}:Faulty", {"script": ["a", "raise"]}, episodes=2, policy="scripted", workers=workers(1))
    assert report.problems == ["seed 0: step() raised ValueError: boom (in 2 episodes)"]
    assert report.endings["failed"] == 2
    report = env_check(f"{FIXTURES}:Faulty", {"script": ["hang"]}, episodes=1, policy="scripted",
                       workers=workers(1, 0.5))
    assert report.problems == ["seed 0: step() took longer than runtime.roles.env.timeout_s = 0.5s"]


def test_env_check_needs_a_demonstration_for_the_scripted_policy():
    with pytest.raises(InputError, match="has no demonstration"):
        env_check(f"{FIXTURES}:NeedsLevel", {"level": 1}, policy="scripted")
    with pytest.raises(InputError, match="policy = 'greedy'"):
        env_check("grid", policy="greedy")


def test_report_histogram_of_many_values():
    report = EnvCheckReport("x", {}, "random", range(10), returns=[float(v) for v in range(10)],
                            lengths=[1] * 10, successes=[False] * 10)
    lines = report.describe().splitlines()
    assert lines[1] == "return:  min 0 mean 4.5 max 9"
    # bins of width 1.8 from 0: two values in each
    assert lines[2:7] == [f"  {label:>12} | {'#' * 30} 2" for label in ("0..1.8", "1.8..3.6", "3.6..5.4", "5.4..7.2",
                                                                         "7.2..9")]
    assert report.timing == {"reset": (0.0, 0.0), "step": (0.0, 0.0)}


def test_an_import_path_environment_gets_a_worker_at_count_0_and_a_shipped_one_steps_inline():
    custom = plan_topology(load(None, ["env.name=tests.env_fixtures:FlakyBySeed", "runtime.roles.env.count=0"]))["env"]
    assert (custom.where, custom.count) == ("process", 1) and "the user's code" in custom.detail
    assert plan_topology(load(None, ["env.name=grid", "runtime.roles.env.count=0"]))["env"].where == "inline"
    assert plan_topology(load(None, ["env.name=grid", "runtime.roles.env.count=3"]))["env"].count == 3
