"""The RL math of reasonrl: pure functions on torch tensors, with their formulas in the docstrings.

Imports only torch (and the standard library); no config objects.
"""

from reasonrl.algo.advantages import (
    ESTIMATORS,
    GROUP_ESTIMATORS,
    AdvantageInputs,
    batch_normalised,
    dr_grpo,
    gae,
    grpo,
    lite_ppo,
    outcome_to_token_rewards,
    reinforce_pp,
    rloo,
)
from reasonrl.algo.aggregate import AGG_MODES, agg_normaliser, aggregate, masked_mean, masked_var, masked_whiten
from reasonrl.algo.evaluation import pass_at_k
from reasonrl.algo.filters import group_outcomes, keep_groups
from reasonrl.algo.losses import KL_KINDS, entropy_from_logits, kl_penalty, ppo_clip, token_logprobs, value_loss
from reasonrl.algo.off_policy import (
    IS_WEIGHTS,
    behaviour_metrics,
    importance_ratio,
    logprob_mismatch,
    masked_is_weights,
    truncated_is_weights,
)
from reasonrl.algo.shaping import overlong_filter_mask, overlong_penalty

__all__ = [
    "AGG_MODES",
    "AdvantageInputs",
    "ESTIMATORS",
    "GROUP_ESTIMATORS",
    "IS_WEIGHTS",
    "KL_KINDS",
    "agg_normaliser",
    "aggregate",
    "batch_normalised",
    "behaviour_metrics",
    "dr_grpo",
    "entropy_from_logits",
    "gae",
    "group_outcomes",
    "grpo",
    "importance_ratio",
    "keep_groups",
    "kl_penalty",
    "lite_ppo",
    "logprob_mismatch",
    "masked_is_weights",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "outcome_to_token_rewards",
    "overlong_filter_mask",
    "overlong_penalty",
    "pass_at_k",
    "ppo_clip",
    "reinforce_pp",
    "rloo",
    "token_logprobs",
    "truncated_is_weights",
    "value_loss",
]
