"""Loading, type checking, validation, dump round trip and hashing of the config tree."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from reasonrl.config import Config, ConfigError, config_hash, dump, load, to_dict, validate


def write(tmp_path, text: str):
    path = tmp_path / "recipe.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def error(*args) -> str:
    with pytest.raises(ConfigError) as info:
        load(*args)
    return str(info.value)


def test_defaults_load_and_validate():
    assert load(None) == Config()
    validate(Config())


def test_recipe_and_overrides(tmp_path):
    path = write(
        tmp_path,
        "algo:\n  eps_high: 1\n  dual_clip: 3.0\n  adv_estimator: dr_grpo\n"
        "data:\n  families: [add, mul]\n"
        "train.lr: 3e-4\n"
        "run:\n  progress: false\n",
    )
    cfg = load(path, ["algo.dual_clip=null", "algo={eps_low: 0.1}", "run.seed=7", "train.lr=2e-5"])
    assert cfg.algo.eps_high == 1.0 and isinstance(cfg.algo.eps_high, float)
    assert cfg.algo.dual_clip is None and cfg.algo.eps_low == 0.1
    assert cfg.algo.adv_estimator == "dr_grpo"
    assert cfg.data.families == ("add", "mul")
    assert cfg.run.progress is False and cfg.run.seed == 7
    assert cfg.train.lr == 2e-5  # the command line wins over the recipe
    assert cfg.model == Config().model  # untouched sections keep their defaults


def test_tuple_from_comma_separated_override():
    assert load(None, ["data.families=add, max"]).data.families == ("add", "max")
    assert load(None, ["data.families=sort"]).data.families == ("sort",)


def test_empty_recipe_is_defaults(tmp_path):
    assert load(write(tmp_path, "# nothing\n")) == Config()


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["train.lr"], ["'train.lr'", "dotted.key=value"]),
        (["=3"], ["'=3'", "dotted.key=value"]),
        (["algo.eps_hgih=0.3"], ["command line", "algo.eps_hgih", "did you mean algo.eps_high?"]),
        (["algoo.eps_high=0.3"], ["algoo.eps_high", "did you mean algo.eps_high?"]),
        (["run.dir.name=x"], ["run.dir.name", "did you mean run.dir?"]),
        (["zzz=1"], ["unknown key zzz", "valid keys: run, model, data"]),
        (["algo=3"], ["algo = 3", "section", "mapping", "eps_high"]),
        (["train.total_steps=true"], ["train.total_steps = True", "an integer"]),
        (["train.total_steps=3.0"], ["train.total_steps = 3.0", "an integer"]),
        (["train.total_steps=abc"], ["train.total_steps = 'abc'", "an integer"]),
        (["train.lr=abc"], ["train.lr = 'abc'", "a number"]),
        (["train.lr=true"], ["train.lr = True", "a number"]),
        (["run.progress=yes"], ["run.progress = 'yes'", "true or false"]),
        (["run.progress=1"], ["run.progress = 1", "true or false"]),
        (["run.dir=42"], ["run.dir = 42", "a string"]),
        (["algo.dual_clip=abc"], ["algo.dual_clip = 'abc'", "a number or null"]),
        (["algo.adv_estimator=ppo"], ["algo.adv_estimator = 'ppo'", "one of 'grpo', 'dr_grpo'", "'gae'"]),
        (["model.dtype=fp32"], ["model.dtype = 'fp32'", "'float32', 'bfloat16', 'float16'"]),
        (["data.families=3"], ["data.families = 3", "a list", "each a string"]),
        (["data.families=[add, 3]"], ["data.families = ['add', 3]", "each a string"]),
        (["data.families=[add"], ["command line", "data.families = '[add'", "not a YAML value"]),
    ],
)
def test_override_errors(overrides, expected):
    message = error(None, overrides)
    for part in expected:
        assert part in message, (part, message)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("algo:\n  eps_hgih: 0.3\n", ["line 2", "algo.eps_hgih", "did you mean algo.eps_high?"]),
        ("run: {}\nalgoo:\n  eps_high: 0.3\n", ["line 2", "unknown key algoo", "did you mean algo?"]),
        ("algo: 3\n", ["line 1", "algo = 3", "mapping"]),
        ("algo:\n", ["algo = None", "mapping"]),
        ("train:\n  lr: fast\n", ["line 2", "train.lr = 'fast'", "a number"]),
        ("- run\n- algo\n", ["a recipe is a mapping of sections", "run, model"]),
        ("algo:\n  eps_high: [0.3\n", ["line 3", "invalid YAML"]),
        ("algo:\n  eps_low: 0.1\n  eps_low: 0.2\n", ["line 3", "algo.eps_low is given twice", "first on line 2"]),
        ("algo:\n  eps_low: 0.1\nalgo.eps_low: 0.2\n", ["line 3", "algo.eps_low is given twice"]),
        ("rollout:\n  top_p: 1.5\n", ["line 2", "rollout.top_p = 1.5", "in (0, 1]"]),
    ],
)
def test_recipe_errors_name_file_and_line(tmp_path, text, expected):
    path = write(tmp_path, text)
    message = error(path)
    for part in [str(path), *expected]:
        assert part in message, (part, message)


def test_missing_recipe(tmp_path):
    assert "cannot read the recipe" in error(tmp_path / "absent.yaml")


def test_a_recipe_that_is_not_utf8_is_a_config_error_naming_its_line(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("algo:\n  eps_high: 0.3\n# caf\u00e9\n".encode("latin-1"))
    assert error(path) == f"{path}, line 3: not UTF-8 text (byte 0xe9 at offset 27); a recipe is a UTF-8 YAML file"


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["rollout.top_p=0"], "rollout.top_p = 0.0: must be in (0, 1]"),
        (["rollout.top_p=1.01"], "rollout.top_p = 1.01: must be in (0, 1]"),
        (["rollout.temperature=0"], "rollout.temperature = 0.0: must be > 0"),
        (["train.lr=0"], "train.lr = 0.0: must be > 0"),
        (["algo.eps_low=1"], "algo.eps_low = 1.0: must be in [0, 1)"),
        (["algo.eps_low=0", "algo.eps_high=-0.1"], "algo.eps_high = -0.1: must be >= 0"),
        (["algo.eps_high=0.1"], "algo.eps_high = 0.1: clip-higher needs eps_high >= eps_low (algo.eps_low = 0.2)"),
        (["algo.dual_clip=1"], "algo.dual_clip = 1.0: must be null or > 1"),
        (["algo.gamma=1.5"], "algo.gamma = 1.5: must be in [0, 1]"),
        (["algo.lam=-0.1"], "algo.lam = -0.1: must be in [0, 1]"),
        (["algo.kl_loss_coef=-1"], "algo.kl_loss_coef = -1.0: must be >= 0"),
        (["algo.entropy_coef=-1"], "algo.entropy_coef = -1.0: must be >= 0"),
        (["rollout.n=0"], "rollout.n = 0: must be >= 1"),
        (["rollout.max_new_tokens=0"], "rollout.max_new_tokens = 0: must be >= 1"),
        (["train.total_steps=0"], "train.total_steps = 0: must be >= 1"),
        (["train.prompts_per_step=0"], "train.prompts_per_step = 0: must be >= 1"),
        (["train.ppo_epochs=0"], "train.ppo_epochs = 0: must be >= 1"),
        (["train.mini_batch_size=0"], "train.mini_batch_size = 0: must be >= 1"),
        (["train.micro_batch_size=0"], "train.micro_batch_size = 0: must be >= 1"),
        (["eval.k=0"], "eval.k = 0: must be in [1, 64]"),
        (["eval.k=65"], "eval.k = 65: must be in [1, 64]"),
        (["checkpoint.keep=0"], "checkpoint.keep = 0: must be >= 1"),
        (["checkpoint.every_steps=-1"], "checkpoint.every_steps = -1: must be >= 0"),
        (["eval.every_steps=-1"], "eval.every_steps = -1: must be >= 0"),
        (
            ["train.mini_batch_size=48"],
            "train.mini_batch_size = 48: must divide the train batch "
            "train.prompts_per_step * rollout.n = 16 * 8 = 128",
        ),
        (["train.micro_batch_size=24"], "train.micro_batch_size = 24: must divide train.mini_batch_size = 64"),
        (["train.micro_batch_tokens=-1"], "train.micro_batch_tokens = -1: must be >= 0"),
        (["data.mix=static"], "data.mix = 'static': draws with the fixed weights of data.mix_weights, which names none"),
        (["data.mix=static", "data.mix_weights={embedded/add: 0.5, embedded/mul: 0.3}"],
         "data.mix_weights = {'embedded/add': 0.5, 'embedded/mul': 0.3}: the weights must sum to 1 (they sum to 0.8)"),
        (["data.mix=static", "data.mix_weights={embedded/add: 0.5, embedded/mul: 0.5}"],
         "must name exactly the data sources of data.families: embedded/add, embedded/mul, embedded/sum"),
        (["data.mix_weights={embedded/add: 1.0}"], "fixed weights are read with data.mix=static (data.mix = 'uniform')"),
        (["reward.range=[1, 0]"], "reward.range = (1.0, 0.0): must be [wrong, right], two finite numbers with wrong < right"),
        (["reward.range=[0, 1, 2]"], "reward.range = (0.0, 1.0, 2.0): must be [wrong, right]"),
        (["reward.range=[0, 1]", "reward.fn=tests.reward_fixtures:coin"],
         "reward.range = [0.0, 1.0]: rescales the built-in functions' -1..+1 scores; the function "
         "'tests.reward_fixtures:coin' returns its own scores"),
        (["reward.range=[0, 1]", "env.name=grid"], "reward.range = [0.0, 1.0]: an environment's episodes are scored by their return"),
        (["train.skip_zero_advantage=maybe"], "train.skip_zero_advantage"),
        (["rollout.cuda_graph=maybe"], "rollout.cuda_graph = 'maybe': expected true or false"),
        (["rollout.backend=sglang"], "rollout.backend = 'sglang': expected one of 'hf', 'fast', 'vllm'"),
        (["rollout.vllm_gpu_memory_utilization=0"], "rollout.vllm_gpu_memory_utilization = 0.0: must be in (0, 1]"),
        (
            ["algo.overlong_buffer=32"],
            "algo.overlong_buffer = 32: the overlong buffer must be shorter than the max response "
            "(rollout.max_new_tokens = 32)",
        ),
        (
            ["rollout.n=1", "train.mini_batch_size=16"],
            "rollout.n = 1: group-relative estimators need at least 2 samples per prompt "
            "(algo.adv_estimator = 'grpo')",
        ),
        (["rollout.max_staleness=2"], "rollout.max_staleness = 2: synchronous rollouts are never stale"),
        (
            ["rollout.mode=async", "rollout.max_staleness=2"],
            "rollout.max_staleness = 2: training on samples from older weights without a correction collapses",
        ),
        (["rollout.interrupt=true"], "rollout.interrupt = True: partial rollouts need rollout.mode=async (rollout.mode = 'sync')"),
        (["runtime.roles.rollout.count=0"], "runtime.roles.rollout.count = 0: must be >= 1"),
        (["runtime.roles.reference.count=2"], "runtime.roles.reference.count = 2: must be 1 (a run has one reference)"),
        (["runtime.roles.policy.count=2"], "runtime.roles.policy.count = 2: must be 1 (the policy's ranks are runtime.trainer_ranks)"),
        (["runtime.roles.rollout.colocate=critic"], "runtime.roles.rollout.colocate = 'critic': must be one of 'auto', 'policy', 'none'"),
        (["runtime.roles.env.timeout_s=0"], "runtime.roles.env.timeout_s = 0.0: must be > 0"),
        (["algo.off_policy=bypass", "train.old_logprobs=recompute"], "train.old_logprobs = 'recompute': algo.off_policy=bypass takes"),
        (["algo.off_policy=tis", "train.old_logprobs=rollout"], "train.old_logprobs = 'rollout': algo.off_policy=tis recomputes"),
        (["algo.tis_cap=0.5"], "algo.tis_cap = 0.5: must be >= 1"),
        (["train.precision=bf16-mixed", "model.dtype=bfloat16"],
         "model.dtype = 'bfloat16': train.precision=bf16-mixed keeps the parameters in float32"),
        (["train.precision=bf16"], "train.precision = 'bf16': expected one of 'fp32', 'bf16-mixed'"),
        (["rollout.mode=fast"], "rollout.mode = 'fast': expected one of 'sync', 'async', 'lockstep'"),
        (
            ["train.gen_prompts_per_step=8"],
            "train.gen_prompts_per_step = 8: must be 0 or >= train.prompts_per_step = 16",
        ),
        (["sft.target_acc=0"], "sft.target_acc = 0.0: must be in (0, 1]"),
        (["data.families=[]"], "data.families = (): must be a non-empty list"),
        (["run.device=gpu"], "run.device = 'gpu': must be cpu, cuda, cuda:N or mps"),
        (["sft.heads=5"], "sft.heads = 5: must divide sft.hidden_size = 192"),
        (["sft.kv_heads=4"], "sft.kv_heads = 4: must divide sft.heads = 6"),
        (["data.mix=mixed"], "data.mix = 'mixed': expected one of 'uniform', 'adaptive'"),
        (["data.mix_by=loss"], "data.mix_by = 'loss': expected one of 'gap', 'signal'"),
        (["data.mix_floor=-0.1"], "data.mix_floor = -0.1: must be in [0, 1/S] for S data sources"),
        (["data.mix=adaptive", "data.mix_floor=0.4"],
         "data.mix_floor = 0.4: must be in [0, 1/3] for the 3 families of data.families"),
        (["data.mix=adaptive", "data.families=[add]"], "data.mix = 'adaptive': mixes data sources, and data.families ['add'] is one"),
        (["data.mix_target=0"], "data.mix_target = 0.0: must be in (0, 1]"),
        (["data.mix_rate=0"], "data.mix_rate = 0.0: must be in (0, 1]"),
        (["data.mix_ema=1"], "data.mix_ema = 1.0: must be in [0, 1)"),
        (["data.curriculum_window=-1"], "data.curriculum_window = -1: must be >= 0"),
        (["data.curriculum_revisit=0"], "data.curriculum_revisit = 0: must be >= 1"),
        (["data.difficulty.mul=tricky"], "data.difficulty.mul = 'tricky': must be one of easy, full, hard"),
        (["data.difficulty.chain=hard"], "data.difficulty.chain = 'hard': 'chain' is not one of data.families ['add', 'mul', 'sum']"),
        (["data.source=rows.jsonl", "data.difficulty.add=easy"],
         "data.difficulty.add = 'easy': difficulty levels are the embedded task's (data.source=embedded)"),
        (["model.lora.rank=-1"], "model.lora.rank = -1: must be >= 0"),
        (["model.lora.alpha=0"], "model.lora.alpha = 0.0: must be > 0"),
        (["model.lora.dropout=1"], "model.lora.dropout = 1.0: must be in [0, 1)"),
        (["model.lora.target_modules=[]"], "model.lora.target_modules = (): must be a non-empty list of module names"),
        (["model.lora.target_modules=[q_proj, ' ']"], "model.lora.target_modules = ('q_proj', ' '): must be a non-empty list"),
        (["model.lora.rank=8", "train.strategy=fsdp", "run.device=cuda"],
         "model.lora.rank = 8: LoRA adapters train with train.strategy=ddp (or one rank)"),
    ],
)
def test_validation_errors(overrides, expected):
    message = error(None, overrides)
    assert expected in message, message
    assert message.startswith("command line: ")


def test_validation_error_names_the_recipe_line(tmp_path):
    path = write(tmp_path, "algo:\n  eps_low: 0.1\n  eps_high: 0.05\n")
    assert error(path).startswith(f"{path}, line 3: algo.eps_high = 0.05: clip-higher")


def test_validate_on_a_built_config():
    cfg = Config()
    with pytest.raises(ConfigError, match=r"^train\.lr = 0\.0: must be > 0") as info:
        validate(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, lr=0.0)))
    assert info.value.key == "train.lr"


@pytest.mark.parametrize(
    "overrides",
    [
        ["train.mini_batch_size=4", "train.micro_batch_size=4"],  # not a multiple of rollout.n: allowed
        ["run.device=cuda:1"],
        ["run.device=mps"],
        ["algo.eps_high=0.28", "algo.dual_clip=3", "algo.overlong_buffer=8", "train.gen_prompts_per_step=32"],
        ["rollout.n=1", "train.mini_batch_size=16", "algo.adv_estimator=reinforce_pp"],
        ["rollout.n=1", "train.mini_batch_size=16", "algo.adv_estimator=gae", "algo.dynamic_sampling=true"],
        ["rollout.mode=async", "rollout.max_staleness=2", "algo.off_policy=decoupled"],
        ["data.mix=adaptive", "data.mix_by=signal", "data.mix_floor=0.3333333333333333", "data.curriculum_window=2",
         "data.difficulty.add=hard", "data.difficulty.sum=easy"],
        ["data.source=rows.jsonl", "data.mix=adaptive", "data.mix_floor=0.5"],  # its sources are counted once it is read
    ],
)
def test_valid_configs(overrides):
    load(None, overrides)


def test_dump_round_trip(tmp_path):
    cfg = load(
        None,
        [
            "run.dir='3e-4'",  # strings that look like other scalars stay strings
            "reward.fn='yes'",
            "data.test_source='null'",
            "data.families=[max, sort]",
            "algo.dual_clip=3",
            "algo.eps_high=0.28",
            "train.lr=1e-10",
            "sft.lr=1e300",
            "run.progress=false",
        ],
    )
    path = tmp_path / "run" / "config.yaml"
    dump(cfg, path)
    assert load(path) == cfg
    assert yaml.safe_load(path.read_text(encoding="utf-8")) == to_dict(cfg)
    assert to_dict(cfg)["data"]["families"] == ["max", "sort"]
    assert list(tmp_path.joinpath("run").iterdir()) == [path]


def test_config_hash_ignores_resumable_keys():
    base = config_hash(Config())
    assert len(base) == 64 and base == config_hash(load(None))
    resumable = load(
        None,
        [
            "run.dir=runs/other",
            "run.progress=false",
            "run.threads=2",
            "train.total_steps=500",
            "eval.every_steps=3",
            "checkpoint.every_steps=5",
            "checkpoint.keep=4",
        ],
    )
    assert config_hash(resumable) == base
    for override in ["algo.eps_high=0.28", "run.seed=1", "data.families=[add]", "algo.dual_clip=3"]:
        assert config_hash(load(None, [override])) != base, override
    assert config_hash(load(None, ["algo.eps_high=0.28"]), ignore=("algo.eps_high",)) == config_hash(
        Config(), ignore=("algo.eps_high",)
    )


def test_every_config_field_is_documented_where_it_is_declared():
    from reasonrl.config import keys_help

    undocumented = [k.key for k in keys_help() if not k.help.strip()]
    assert not undocumented, f"config fields without a docstring under them: {undocumented}"


def test_keys_help_gives_type_default_and_the_value_of_a_config():
    from reasonrl.config import field_docs, keys_help

    keys = {k.key: k for k in keys_help(load(None, ["algo.dual_clip=3", "data.families=add"]))}
    assert keys["algo.dual_clip"].type == "float | null" and keys["algo.dual_clip"].default is None
    assert keys["algo.dual_clip"].value == 3.0
    assert keys["data.families"].type == "list[str]" and keys["data.families"].value == ["add"]
    assert keys["algo.kl_kind"].type == "k1 | k2 | k3 | abs"
    assert keys["train.grad_clip"].help.startswith("Gradients are scaled down to this global L2 norm")
    # A multi-line docstring comes back dedented, and a field's help is its own, not the next one's.
    assert field_docs(type(load(None).sft))["target_acc"].startswith("Stop once greedy held-out accuracy")


@pytest.mark.parametrize("old, new", [
    ("resilience.rollout_workers=2", "runtime.roles.rollout.count"),
    ("resilience.reward_workers=1", "runtime.roles.reward.count"),
    ("resilience.rollout_timeout_s=60", "runtime.roles.rollout.timeout_s"),
    ("resilience.reward_timeout_s=2", "runtime.roles.reward.timeout_s"),
    ("env.workers=1", "runtime.roles.env.count"),
    ("env.step_timeout_s=2", "runtime.roles.env.timeout_s"),
    ("rollout.threads=1", "runtime.roles.rollout.threads"),
    ("runtime.placement.rollout.cpus=2", "runtime.roles.rollout.cpus"),
    ("runtime.placement={rollout: {cpus: 2}}", "runtime.roles.<role>.cpus, .gpus, .count and .colocate"),
])
def test_a_key_that_moved_under_runtime_roles_names_its_new_key(old, new):
    message = error(None, [old])
    assert f"is now {new}" in message, message


def test_a_recipe_section_with_a_moved_key_names_its_new_key(tmp_path):
    path = write(tmp_path, "resilience:\n  rollout_workers: 2\n")
    assert error(path) == f"{path}, line 2: resilience.rollout_workers is now runtime.roles.rollout.count"


def test_every_refusal_left_in_the_rules_is_about_a_value_or_a_backend():
    """No rule refuses a role count or a runtime: those combinations all run (and any set of
    fault kinds: below). The cross-key refusals left are listed here; each is a value range,
    an algorithm's contradiction, or what a backend cannot do."""
    import ast
    import inspect
    import re

    from reasonrl.config import rules

    from reasonrl.runtime import topology

    source = "\n".join(inspect.getsource(f) for f in (rules.validate, rules._check_data, rules._check_faults,
                                                      rules._check_roles))
    calls = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "_require"]
    refused = sorted({c.args[1].value for c in calls if isinstance(c.args[1], ast.Constant)})
    assert refused == sorted([
        "algo.eps_high", "algo.overlong_buffer", "data.mix", "data.mix_floor", "data.mix_weights", "env.tool_call_pattern",
        "env.tool_response_format", "faults", "model.dtype", "model.lora.rank", "reward.range", "rollout.backend",
        "rollout.interrupt", "rollout.max_staleness", "rollout.n", "sft.heads", "sft.kv_heads",
        "train.gen_prompts_per_step", "train.micro_batch_size", "train.mini_batch_size", "train.old_logprobs",
        "train.strategy",
    ]), refused
    # _check_roles' keys are each role's own ranges (count, threads, cpus, gpus, timeout_s, min, max, colocate)
    role_keys = {c.args[1].values[-1].value for c in calls if isinstance(c.args[1], ast.JoinedStr)}
    assert role_keys == {".count", ".threads", ".cpus", ".gpus", ".timeout_s", ".min", ".max", ".colocate"}, role_keys
    assert not re.search(r"rollout_workers|reward_workers|runtime\.engine", source)
    # where roles run refuses one placement only: rollout workers sharing the policy's module, beside
    # a policy that trains while they generate, or one FSDP shards
    plan_refusals = re.findall(r'raise InputError\(f?"([^:"]*)', inspect.getsource(topology.plan))
    assert plan_refusals == ["runtime.roles.rollout.colocate = policy", "runtime.roles.rollout.colocate = policy"]


def test_every_fault_kind_in_one_run_is_valid():
    # several on the checkpoint writer (ckpt_kill, disk_full), several restarts, the rank faults
    faults = ("crash@1,sigkill@2:stage=update_actor,sigkill@3:stage=gen,hang@4,nan@5,slow@1,ckpt_kill@6,disk_full@6,"
              "disk_full@7:count=2,reward_timeout@7,reward_error@8,slow_rank@2:rank=1,hang_rank@8:rank=1")
    cfg = load(None, [f"faults=[{faults}]", "train.total_steps=8", "runtime.trainer_ranks=2"])
    assert len(cfg.faults) == 13


@pytest.mark.parametrize("overrides, expected", [
    (["faults=[crash@2,crash@9]", "train.total_steps=8"],
     "command line: faults = 'crash@9': scheduled at step 9, past the last step (train.total_steps = 8): it would never fire"),
    (["faults=[hang_rank@2]"], "command line: faults = 'hang_rank@2:rank=1': names trainer rank 1; "
                               "runtime.trainer_ranks = 1 has ranks 0..0"),
    (["faults=[hang@2:stage=adv]", "resilience.hang_timeout_s=0"],
     "command line: faults = 'hang@2:stage=adv': an injected hang sleeps until the hang watchdog ends it"),
    (["faults=[crsh@2]"], "command line: faults: fault spec 'crsh@2': unknown kind 'crsh'; did you mean 'crash'?"),
    (["faults=[crash@2:stage=update]"], "command line: faults = 'crash@2:stage=update': 'update' is not a stage of a "
                                        "step; the stages: gen, old_log_prob, ref, values, adv, update_critic, "
                                        "update_actor, publish, testing"),
    (["faults=[slow@2:stage=adv]"], "command line: faults = 'slow@2:factor=3.0:worker=0:stage=adv:steps=8': a slow "
                                    "fault slows a rollout worker's generation: stage=gen"),
    (["faults=[nan@3,nan@3]"], "command line: faults: fault spec 'nan@3': the same fault as 'nan@3'"),
])
def test_a_fault_the_run_could_not_fire_is_refused_by_key(overrides, expected):
    assert error(None, overrides).startswith(expected)


@pytest.mark.parametrize("overrides, expected", [
    (
        ["rollout.mode=async", "rollout.interrupt=true", "rollout.backend=hf"],
        "rollout.backend = 'hf': cannot be interrupted by new weights and go on with them "
        "(rollout.interrupt = True needs a backend that can: fast)",
    ),
    (
        ["rollout.mode=async", "rollout.interrupt=true", "rollout.backend=vllm"],
        "rollout.backend = 'vllm': cannot be interrupted by new weights and go on with them "
        "(rollout.interrupt = True needs a backend that can: fast)",
    ),
    (
        ["env.name=grid", "rollout.backend=vllm"],
        "rollout.backend = 'vllm': cannot continue a sequence with an environment's tokens "
        "(env.name = 'grid' needs a backend that can: fast, hf)",
    ),
])
def test_a_backend_is_refused_what_its_row_of_the_capability_table_lacks(overrides, expected):
    assert error(None, overrides) == f"command line: {expected}"


@pytest.mark.parametrize("overrides", [
    ["rollout.mode=async", "rollout.interrupt=true", "rollout.backend=fast"],
    ["env.name=grid", "rollout.backend=fast"],
    ["env.name=grid", "rollout.backend=hf"],
])
def test_a_backend_with_the_capability_is_accepted(overrides):
    validate(load(None, overrides))


def test_the_backend_refusals_follow_the_table(monkeypatch):
    """The rules hold no backend fact of their own: give vllm a row that continues and
    interrupts, and the rules accept it; take them from fast, and they refuse it."""
    from reasonrl.config import capabilities as C

    monkeypatch.setitem(C.BACKENDS, "vllm", C.Capabilities(continues=True, interrupts=True, streams=False, trainer_numerics=False,
                                                                   adapters=False))
    monkeypatch.setitem(C.BACKENDS, "fast", C.Capabilities(continues=False, interrupts=False, streams=True, trainer_numerics=True,
                                                                   adapters=True))
    validate(load(None, ["env.name=grid", "rollout.backend=vllm"]))
    validate(load(None, ["rollout.mode=async", "rollout.interrupt=true", "rollout.backend=vllm"]))
    assert "(env.name = 'grid' needs a backend that can: hf, vllm)" in error(None, ["env.name=grid"])
    assert "rollout.backend = 'fast': cannot be interrupted" in error(None, ["rollout.mode=async", "rollout.interrupt=true"])


def test_the_capability_table_covers_every_backend_choice_and_capability():
    import typing

    from reasonrl.config import RolloutConfig
    from reasonrl.config.capabilities import BACKENDS, CAPABILITIES, Capabilities

    assert set(BACKENDS) == set(typing.get_args(typing.get_type_hints(RolloutConfig)["backend"]))
    assert set(CAPABILITIES) == {f.name for f in dataclasses.fields(Capabilities)}


def test_the_config_package_imports_neither_torch_nor_the_rollout_package():
    import subprocess
    import sys

    code = ("import sys, reasonrl.config, reasonrl.config.capabilities; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('reasonrl.rollout')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
