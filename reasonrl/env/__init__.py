"""Environments for multi-turn agentic RL: the text Env protocol (Gymnasium's 5-tuple), adapters,
tools, the shipped environments (``grid``, ``tool_arith``), a pool of worker processes that
steps them with timeouts, and ``env_check``.

Gymnasium is optional: it is never imported here (a ``gymnasium.Env`` is recognised once the
module that defines it has imported gymnasium).
"""

from reasonrl.env.arith import ToolArithEnv
from reasonrl.env.base import Env, EnvProtocolError, GymTextAdapter, check_reset, check_step
from reasonrl.env.check import EnvCheckReport, env_check
from reasonrl.env.grid import GridEnv
from reasonrl.env.pool import EnvFailure, EnvPool
from reasonrl.env.registry import ENVS, env_attribute, make_env
from reasonrl.env.tools import TOOLS, Tool, ToolCall, ToolCallError, ToolEnv, parse_tool_calls

__all__ = [
    "ENVS",
    "TOOLS",
    "Env",
    "EnvCheckReport",
    "EnvFailure",
    "EnvPool",
    "EnvProtocolError",
    "GridEnv",
    "GymTextAdapter",
    "Tool",
    "ToolArithEnv",
    "ToolCall",
    "ToolCallError",
    "ToolEnv",
    "check_reset",
    "check_step",
    "env_attribute",
    "env_check",
    "make_env",
    "parse_tool_calls",
]
