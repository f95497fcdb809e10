"""One frozen dataclass tree for a run, loaded from a YAML recipe plus dotted overrides.

    cfg = load("recipes/dapo.yaml", ["train.total_steps=50", "algo.eps_high=0.28"])
    cfg = Config.load("dapo", ["train.total_steps=50"])   # a file or a packaged recipe name (load_recipe)
    dump(cfg, "runs/demo/config.yaml")          # load() reads it back to an equal Config
    config_hash(cfg)                            # refuses resuming with an incompatible config

Every field is documented where it is declared. ``load`` rejects unknown keys (with the
nearest valid key), wrong types and impossible values, naming the source, the dotted key,
the bad value and what is allowed. The loader walks ``dataclasses.fields`` and the type
hints, so a new field needs no loader change; field types may be ``bool``, ``int``,
``float``, ``str``, ``Literal[...]``, ``X | None``, ``tuple[X, ...]``, ``dict[str, Any]`` (a
mapping of YAML data, whose keys a dotted override sets one by one) and nested dataclasses.

Values, in recipes and overrides alike, are YAML with YAML 1.2 scalars: only
``true``/``false`` are booleans (``yes`` is a string, hence an error for a bool field) and
``3e-4`` is a float (PyYAML's YAML 1.1 rules would read it as a string).

The package: ``schema`` (the dataclasses), ``loader`` (YAML, overrides, dump, hashing, key help)
and ``rules`` (``validate``). The names below are re-exported here, so callers import them from
``reasonrl.config``.
"""

from reasonrl.config.loader import (
    LOGGING_KEYS,
    RECIPES,
    RESUME_MAY_CHANGE,
    KeyHelp,
    config_hash,
    dump,
    dump_text,
    field_docs,
    flatten,
    keys_help,
    load,
    load_recipe,
    recipe_path,
    to_dict,
)
from reasonrl.config.rules import validate
from reasonrl.config.schema import (
    AlgoConfig,
    CheckpointConfig,
    Config,
    ConfigError,
    DataConfig,
    EnvConfig,
    EvalConfig,
    LoraConfig,
    ModelConfig,
    ResilienceConfig,
    ResumeConfig,
    RewardConfig,
    RolloutConfig,
    RunConfig,
    RuntimeConfig,
    SFTConfig,
    TrainConfig,
)

__all__ = [
    "AlgoConfig", "CheckpointConfig", "Config", "ConfigError", "DataConfig", "EnvConfig", "EvalConfig", "KeyHelp",
    "LOGGING_KEYS", "LoraConfig", "ModelConfig", "RECIPES", "RESUME_MAY_CHANGE", "ResilienceConfig", "ResumeConfig", "RewardConfig",
    "RolloutConfig", "RunConfig",
    "RuntimeConfig", "SFTConfig", "TrainConfig", "config_hash", "dump", "dump_text", "field_docs", "flatten",
    "keys_help", "load", "load_recipe", "recipe_path", "to_dict", "validate",
]
