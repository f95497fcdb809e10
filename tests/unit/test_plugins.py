"""reasonrl.plugins: ``module:Name`` and ``path/to/file.py:Name`` specs for env.name and
reward.fn, loaded with the working directory importable and nothing on PYTHONPATH."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from reasonrl.env import make_env
from reasonrl.errors import InputError
from reasonrl.plugins import is_plugin_spec, load_object
from reasonrl.reward import load_reward_fn

ROOT = Path(__file__).resolve().parents[2]

ENV_SOURCE = textwrap.dedent('''
    class Echo:
        def reset(self, seed):
            return f"seed {seed}", {}

        def step(self, action):
            return action, 1.0, True, False, {}

    class Outer:
        class Inner(Echo):
            pass

    def reward(response, ground_truth):
        return {"score": float(response == ground_truth)}
''')


def test_a_file_spec_loads_once_per_process(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "echo_plugin.py").write_text(ENV_SOURCE)
    spec = f"{tmp_path}/sub/echo_plugin.py:Echo"
    cls = load_object(spec, "env.name")
    assert cls is load_object(spec, "env.name")  # the same module object, not a second run
    assert load_object(f"{tmp_path}/sub/echo_plugin.py:Outer.Inner", "env.name").__mro__[1] is cls
    assert make_env(spec).reset(3) == ("seed 3", {})
    assert load_reward_fn(f"{tmp_path}/sub/echo_plugin.py:reward")("a", "a") == {"score": 1.0}


def test_a_relative_file_spec_is_read_from_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "rel_echo.py").write_text(ENV_SOURCE)
    monkeypatch.chdir(tmp_path)
    assert make_env("plugins/rel_echo.py:Echo").step("x") == ("x", 1.0, True, False, {})


@pytest.mark.parametrize("spec, message", [
    ("nowhere/missing.py:Env", r"env.name = 'nowhere/missing.py:Env': file 'nowhere/missing.py' does not exist"),
    ("{dir}/echo_p.py:Nope", r"file '.*echo_p.py' has no attribute 'Nope'"),
    ("{dir}/broken_p.py:Env", r"running file '.*broken_p.py' failed: .*ZeroDivisionError"),
    ("no_such_module_q:Env", r"cannot import module 'no_such_module_q': no such module on sys.path or in the "
                             r"working directory"),
    ("{dir}/echo_p.py:", r"unknown environment"),
])
def test_errors_name_the_key_the_module_or_file_and_the_name(tmp_path, spec, message):
    (tmp_path / "echo_p.py").write_text(ENV_SOURCE)
    (tmp_path / "broken_p.py").write_text("1 / 0\n")
    with pytest.raises(InputError, match=message):
        make_env(spec.format(dir=tmp_path))


def test_a_module_that_fails_inside_its_own_imports_says_so(tmp_path, monkeypatch):
    (tmp_path / "imports_missing_q.py").write_text("import not_installed_dependency_q\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match=r"reward function = 'imports_missing_q:f': importing module "
                                         r"'imports_missing_q' failed: .*not_installed_dependency_q"):
        load_reward_fn("imports_missing_q:f")


def test_plugin_spec_form():
    assert is_plugin_spec("a.b:C") and is_plugin_spec("x/y.py:C") and is_plugin_spec("C:/x/y.py:C")
    assert not is_plugin_spec("grid") and not is_plugin_spec(":C") and not is_plugin_spec("m:")


def test_plugins_by_file_and_by_module_without_pythonpath(tmp_path):
    """A user's directory with guess.py and rewards/score.py, not on PYTHONPATH: env-check and
    the reward loader find ``guess.py:Guess``, ``guess:Guess`` and ``rewards/score.py:exact``
    from a script started elsewhere (so sys.path[0] is not the working directory)."""
    work, runner = tmp_path / "work", tmp_path / "runner"
    (work / "rewards").mkdir(parents=True)
    runner.mkdir()
    (work / "guess.py").write_text(textwrap.dedent('''
        class Guess:
            """Guess a number of 0..3 that the seed picks; the first observation is the same."""
            def reset(self, seed):
                self.secret, self.turn = seed % 4, 0
                return "guess 0..3", {}

            def step(self, action):
                self.turn += 1
                won = action.strip() == str(self.secret)
                return ("right" if won else "wrong"), float(won), won, False, {"success": won}

            def demonstration(self, seed):
                return [str(seed % 4)]
    '''))
    (work / "rewards" / "score.py").write_text("def exact(response, ground_truth):\n"
                                               "    return {'score': float(response == ground_truth)}\n")
    (runner / "run.py").write_text(textwrap.dedent('''
        import sys
        from reasonrl.env import make_env
        from reasonrl.reward import load_reward_fn
        assert make_env("guess:Guess").reset(5)[0] == "guess 0..3"
        assert load_reward_fn("rewards/score.py:exact")("7", "7") == {"score": 1.0}
        from reasonrl.cli import main
        if __name__ == "__main__":
            sys.exit(main(["env-check", "guess.py:Guess", "--policy", "scripted", "--episodes", "4"]))
    '''))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(ROOT)  # reasonrl itself; the plugins' directory is not on it
    proc = subprocess.run([sys.executable, str(runner / "run.py")], cwd=work, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.rstrip().endswith("PASS") and "warning" not in proc.stdout, proc.stdout
