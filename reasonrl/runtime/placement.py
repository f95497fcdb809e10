"""Where each role's actors run on a Ray cluster: ``runtime.roles``' resources, validated in pure Python.

    placement = parse_placement({"rollout": {"cpus": 2}, "reference": {"colocate": "policy"}})
    plan = placement.plan({"policy": 1, "reference": 1, "rollout": 1, "reward": 1})
    plan.bundles               # [{"CPU": 2.0}, {"CPU": 2.0}, {"CPU": 1.0}]: policy+reference, rollout, reward
    plan.index["reference"]    # [0]: the bundle each reference actor runs in
    plan.request("rollout")    # {"CPU": 2.0}: what one rollout actor asks for inside its bundle
    check_fits(plan, {"CPU": 2.0})   # LimitError: the roles ask for 5 CPUs, the cluster has 2

Each role (:data:`ROLES`) may name ``cpus`` (per actor, a number > 0), ``gpus`` (per actor,
>= 0; fractions share a device), ``count`` (how many actors of the role, overriding the run's
own number) and ``colocate`` (another role: each of this role's actors joins the bundle of
the host role's actor of the same rank, so the two share a node; the bundle holds both
actors' resources). A host role cannot itself be colocated, so there are no chains or
cycles. Roles the mapping does not name take one CPU per actor.

One bundle per actor of each role that is not colocated, in :data:`ROLES` order, is what
the Ray runtime reserves as a placement group (``reasonrl.runtime.ray.Reservation``). This
module never imports Ray: config validation and preflight use it on any machine.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Any

from reasonrl.errors import InputError, LimitError

ROLES = ("policy", "reference", "critic", "rollout", "reward", "env")
"""The roles a run's actors play, in the order their bundles are laid out."""

_KEYS = ("cpus", "gpus", "count", "colocate")
_PREFIX = "runtime.roles"
_KEY_OF = {"CPU": "cpus", "GPU": "gpus"}


@dataclass(frozen=True)
class RolePlacement:
    """One role's resources: ``cpus`` and ``gpus`` per actor, ``count`` actors (None: the
    run's own number) and the role whose bundles it joins (``colocate``, None: its own)."""

    cpus: float = 1.0
    gpus: float = 0.0
    count: int | None = None
    colocate: str | None = None


@dataclass(frozen=True)
class Plan:
    """The bundles of one run: ``bundles[i]`` is a Ray resource dict (``CPU``, ``GPU`` when
    asked for), ``members[i]`` the roles whose actors share bundle ``i``, ``index[role]``
    the bundle of each of that role's actors (rank order), ``requests[role]`` what one actor
    of the role asks for inside its bundle."""

    bundles: list[dict[str, float]]
    members: list[tuple[str, ...]]
    index: dict[str, list[int]]
    requests: dict[str, dict[str, float]]

    def request(self, role: str) -> dict[str, float]:
        """The resources one actor of ``role`` asks for (a copy)."""
        return dict(self.requests[role])


@dataclass(frozen=True)
class Placement:
    """Validated resources of ``runtime.roles``: a :class:`RolePlacement` for every role in :data:`ROLES`."""

    roles: dict[str, RolePlacement]

    def count(self, role: str, default: int) -> int:
        """How many actors ``role`` has: its ``count`` if the placement names one, else ``default``."""
        spec = self.roles[role]
        return default if spec.count is None else spec.count

    def plan(self, roles_in_use: dict[str, int]) -> Plan:
        """The bundles for a run whose roles and default actor counts are ``roles_in_use``
        (role -> actors the run would start; a placement ``count`` overrides it).

        Raises InputError when a colocated role's host is not in use, or when it has more
        actors than its host has bundles.
        """
        unknown = sorted(set(roles_in_use) - set(ROLES))
        if unknown:
            raise ValueError(f"Placement.plan: unknown roles {unknown}; expected some of {', '.join(ROLES)}")
        counts = {role: self.count(role, n) for role, n in roles_in_use.items()}
        bundles: list[dict[str, float]] = []
        members: list[list[str]] = []
        index: dict[str, list[int]] = {}
        for role in ROLES:
            if role in counts and self.roles[role].colocate is None:
                index[role] = list(range(len(bundles), len(bundles) + counts[role]))
                for _ in range(counts[role]):
                    bundles.append(_resources(self.roles[role]))
                    members.append([role])
        for role in ROLES:
            host = self.roles[role].colocate
            if role not in counts or host is None:
                continue
            key = f"{_PREFIX}.{role}.colocate"
            if host not in index:
                raise InputError(f"{key} = {host!r}: the run starts no {host} actors to share bundles with; "
                                 f"expected one of {', '.join(sorted(index))}")
            if counts[role] > len(index[host]):
                raise InputError(f"{key} = {host!r}: {counts[role]} {role} actors cannot share the "
                                 f"{len(index[host])} bundles of {host}; expected at most {len(index[host])} "
                                 f"({_PREFIX}.{role}.count)")
            index[role] = index[host][: counts[role]]
            for i in index[role]:
                bundles[i] = _add(bundles[i], _resources(self.roles[role]))
                members[i].append(role)
        requests = {role: _resources(self.roles[role]) for role in counts}
        return Plan(bundles, [tuple(m) for m in members], index, requests)


def parse_placement(mapping: dict[str, Any]) -> Placement:
    """Validate a mapping of role -> ``{cpus, gpus, count, colocate}`` (the Ray roles'
    ``runtime.roles`` entries); roles it does not name take one CPU per actor. Raises
    InputError naming ``runtime.roles.<role>.<key>``, the value and what is allowed."""
    if not isinstance(mapping, dict):
        raise InputError(f"{_PREFIX} = {mapping!r}: expected a mapping of roles ({', '.join(ROLES)}) to resources")
    roles = {role: RolePlacement() for role in ROLES}
    for role, spec in mapping.items():
        key = f"{_PREFIX}.{role}"
        if role not in ROLES:
            raise InputError(f"{key} = {spec!r}: unknown role{_did_you_mean(role, ROLES)}; expected one of {', '.join(ROLES)}")
        if not isinstance(spec, dict):
            raise InputError(f"{key} = {spec!r}: expected a mapping with some of {', '.join(_KEYS)}")
        for name in spec:
            if name not in _KEYS:
                raise InputError(f"{key}.{name} = {spec[name]!r}: unknown key{_did_you_mean(str(name), _KEYS)}; "
                                 f"expected some of {', '.join(_KEYS)}")
        roles[role] = RolePlacement(
            cpus=_number(spec, "cpus", key, 1.0, positive=True),
            gpus=_number(spec, "gpus", key, 0.0, positive=False),
            count=_count(spec, key),
            colocate=_colocate(spec, role, key),
        )
    for role, spec in roles.items():
        if spec.colocate is not None and roles[spec.colocate].colocate is not None:
            raise InputError(f"{_PREFIX}.{role}.colocate = {spec.colocate!r}: {spec.colocate} is itself colocated "
                             f"with {roles[spec.colocate].colocate}; expected a role that has bundles of its own")
    return Placement(roles)


def check_fits(plan: Plan, cluster_resources: dict[str, float]) -> None:
    """Raise LimitError when the cluster (``ray.cluster_resources()``, or this machine's
    cores and GPUs before any cluster starts) cannot hold ``plan``: for each resource, the
    sum over all bundles must fit what the cluster has in all (how it is spread over nodes
    is the placement group's to find out, within its timeout). The message names the
    roles, what they ask for and what the cluster has."""
    for resource in sorted({r for b in plan.bundles for r in b}):
        have = float(cluster_resources.get(resource, 0.0))
        total = sum(b.get(resource, 0.0) for b in plan.bundles)
        if total <= have + 1e-9:
            continue
        parts = []
        for role in dict.fromkeys(r for m in plan.members for r in m):
            per_actor = plan.requests[role].get(resource, 0.0)
            if per_actor:
                parts.append(f"{role}: {_actors(len(plan.index[role]))} x {_fmt(per_actor)} {resource} "
                             f"({_PREFIX}.{role}.{_KEY_OF[resource]})")
        raise LimitError(f"{_PREFIX}: the roles ask for {_fmt(total)} {resource} in all ({'; '.join(parts)}); "
                         f"the cluster has {_fmt(have)} {resource}")


def _resources(spec: RolePlacement) -> dict[str, float]:
    """One actor's Ray resource dict."""
    return {"CPU": spec.cpus, **({"GPU": spec.gpus} if spec.gpus else {})}


def _add(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: a.get(k, 0.0) + b.get(k, 0.0) for k in dict.fromkeys([*a, *b])}


def _number(spec: dict, name: str, key: str, default: float, *, positive: bool) -> float:
    if name not in spec:
        return default
    value = spec[name]
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (value <= 0 if positive else value < 0):
        raise InputError(f"{key}.{name} = {value!r}: expected a number {'> 0' if positive else '>= 0'}"
                         f" ({'CPUs' if name == 'cpus' else 'GPUs'} per actor, e.g. 1 or 0.5)")
    return float(value)


def _count(spec: dict, key: str) -> int | None:
    if "count" not in spec:
        return None
    value = spec["count"]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InputError(f"{key}.count = {value!r}: expected an integer >= 1 (actors of this role)")
    return value


def _colocate(spec: dict, role: str, key: str) -> str | None:
    if "colocate" not in spec:
        return None
    value = spec["colocate"]
    others = [r for r in ROLES if r != role]
    if not isinstance(value, str) or value not in others:
        hint = _did_you_mean(value, others) if isinstance(value, str) else ""
        raise InputError(f"{key}.colocate = {value!r}: expected another role{hint}: {', '.join(others)}")
    return value


def _did_you_mean(name: str, choices) -> str:
    match = difflib.get_close_matches(name, list(choices), n=1)
    return f" (did you mean {match[0]}?)" if match else ""


def _actors(n: int) -> str:
    return f"{n} actor" if n == 1 else f"{n} actors"


def _fmt(x: float) -> str:
    return f"{x:g}"
