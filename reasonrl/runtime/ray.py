"""The Ray runtime (``runtime.engine=ray``): the same worker classes as Ray actors.

    cluster = connect(cfg.runtime)                      # join runtime.ray_address / RAY_ADDRESS, or start one
    plan = parse_placement({"rollout": {"cpus": 1}}).plan({"policy": 1, "rollout": 2})
    reservation = Reservation(plan, timeout_s=30)       # LimitError at once if the cluster cannot hold it
    rollout = RayGroup(build_rollout_worker, [(cfg, model_dir, None, 1)] * 2, "rollout", timeout_s=600,
                       concurrent=("offer_weights",), **reservation.options("rollout"))
    batch = rollout.submit_to(1, "generate", ...)        # concurrent.futures.Future, as LocalGroup's
    rollout.submit("offer_weights", update)              # one ray.put per version, one ref to every actor
    ...
    rollout.close(); reservation.close(); cluster.close()

Only this module imports Ray, and only from inside its functions, so importing it (or
``reasonrl.runtime``) never does; workers never import Ray: :class:`RayGroup` applies
``ray.remote`` at launch to a generic host that builds the worker with ``factory(*args)``.

**A local cluster listens on loopback only.** Ray binds its gRPC servers (GCS, raylet and
object manager, every worker's core worker), the runtime-env agent and, with ``ray[default]``,
the dashboard agent and the metrics exporter to loopback exactly when the node's IP address
is loopback. ``ray.init(_node_ip_address="127.0.0.1")`` is not enough on Linux: Ray
resolves a loopback address to the machine's routable one
(``ray._private.services.resolve_ip_for_localhost``) unless ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER``
is false, its switch for single-node clusters (the default on macOS and Windows). Ray reads
that variable once, when it is imported, and the processes it starts inherit it, so
:func:`connect` sets it before importing Ray. The dashboard is off, usage stats are off
(Ray's default for ``ray.init``), worker output stays in the session's log files
(``/tmp/ray/session_latest/logs``), and the object store is small (256 MiB; larger objects
spill to disk). Ray 2.60 turns token authentication on for a cluster it starts (the token is
kept in ``~/.ray/auth_token``).

**Nothing waits without a bound.** Starting or joining a cluster has ``timeout_s``; creating
actors, :meth:`RayGroup.call`, :meth:`RayGroup.restart`, :meth:`RayGroup.close` and a
placement group's creation have theirs; callers of :meth:`RayGroup.submit` pass their own to
:func:`~reasonrl.runtime.group.gather` or ``Future.result``. A dead actor fails its pending
and later calls with :class:`~reasonrl.runtime.group.WorkerDied`; an exception the worker
method raised arrives as its own type with the remote traceback as a note.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import os
import re
import sys
import threading
from concurrent.futures import Future
from typing import Any, Callable

from reasonrl.config import RuntimeConfig
from reasonrl.errors import InputError, LimitError, error_line
from reasonrl.runtime.group import WorkerDied, WorkerTimeout, gather
from reasonrl.runtime.placement import Plan, check_fits
from reasonrl.runtime.threads import available_cores

INSTALL = "pip install 'reasonrl[ray]'"
"""How to install Ray (the ray extra), as errors about a missing ray say."""

OBJECT_STORE_BYTES = 256 * 2**20
"""Object store of a cluster :func:`connect` starts: weights updates and batches pass
through it; an object larger than what is free spills to disk."""

_LOCAL_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
_CONCURRENT = "concurrent"  # concurrency group of the methods named in RayGroup(concurrent=...)
_CONTROL = "control"  # concurrency group of the host's own pings, answered beside any call
_PING_S = 5.0
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class RayCluster:
    """This process's connection to a Ray cluster (see :func:`connect`).

    ``address`` is the cluster's GCS address, ``started`` whether :func:`connect` started it
    (then it listens on loopback only). :meth:`close` shuts a started cluster down,
    disconnects from a joined one and leaves it running, and leaves alone a connection this
    process had before :func:`connect`.
    """

    def __init__(self, address: str, started: bool, keeper: threading.Event | None) -> None:
        self.address = address
        self.started = started
        self._keeper = keeper  # set to end the thread that connected (None: a connection made elsewhere)

    def resources(self) -> dict[str, float]:
        """The cluster's resources in all (``CPU``, ``GPU``, ``memory``, ...), for
        :func:`~reasonrl.runtime.placement.check_fits`."""
        import ray

        return dict(ray.cluster_resources())

    def close(self) -> None:
        """Shut down the cluster if this connection started it; otherwise only disconnect
        (or, for a connection that was there before, do nothing)."""
        if self._keeper is not None:
            import ray

            ray.shutdown()
            self._keeper.set()
            self._keeper = None

    def __enter__(self) -> RayCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(runtime_cfg: RuntimeConfig, cpus: int | None = None, *, object_store_bytes: int = OBJECT_STORE_BYTES,
            timeout_s: float = 120.0) -> RayCluster:
    """Connect this process to a Ray cluster, within ``timeout_s`` seconds.

    ``runtime_cfg.ray_address`` (or, when empty, the ``RAY_ADDRESS`` environment variable):
    join that cluster, the user's explicit choice (a GCS address ``host:port``, or ``auto``
    for one running on this machine). Neither set (or ``local``): start a cluster with
    ``cpus`` CPUs (default: the cores this process may run on), the GPUs Ray finds,
    ``object_store_bytes`` of object store, listening on loopback only (module docstring).
    ``cpus`` and ``object_store_bytes`` apply to a cluster started here only. A process
    already connected keeps its connection.

    A loopback address (``127.0.0.1:port``, ``localhost:port``) is joined on loopback only.

    Raises InputError for an address that no run can use or whose cluster does not answer
    within ``min(timeout_s, runtime.ray_join_timeout_s)`` (naming what was tried), WorkerTimeout when
    starting a local cluster takes longer than ``timeout_s``,
    and RuntimeError when Ray was imported before this call and would listen on a routable
    address.
    """
    address, key = runtime_cfg.ray_address.strip(), "runtime.ray_address"
    if not address and os.environ.get("RAY_ADDRESS", "").strip():
        address, key = os.environ["RAY_ADDRESS"].strip(), "RAY_ADDRESS"
    if address.startswith("ray://"):
        raise InputError(f"{key} = {address!r}: a Ray Client address; expected the cluster's GCS address "
                         f"host:port (run the trainer on a machine of the cluster), or empty to start a local one")
    local = address in ("", "local")
    if (local or _loopback_host(address)) and "ray" not in sys.modules:
        os.environ[_LOCAL_ONLY] = "0"
    try:
        import ray
    except ImportError as err:
        raise InputError(f"runtime.engine = 'ray' needs the ray package, which cannot be imported ({error_line(err)}); "
                         f"install it with {INSTALL}") from None

    if ray.is_initialized():
        return RayCluster(ray.get_runtime_context().gcs_address, started=False, keeper=None)
    quiet = {"log_to_driver": False, "logging_level": logging.ERROR}
    if local:
        node_ip = ray.util.get_node_ip_address()
        if not _loopback(node_ip):
            raise RuntimeError(f"ray was imported before reasonrl.runtime.ray.connect could set {_LOCAL_ONLY}=0, so a "
                               f"local cluster would listen on {node_ip}; set {_LOCAL_ONLY}=0 before importing ray, "
                               f"or join a cluster with runtime.ray_address")
        cpus = cpus or available_cores()
        keeper = _init_in_keeper(ray, dict(address="local", num_cpus=cpus, include_dashboard=False,
                                           object_store_memory=object_store_bytes, **quiet),
                                 f"ray.init: a local Ray cluster ({cpus} CPUs) did not start", timeout_s)
        return RayCluster(ray.get_runtime_context().gcs_address, started=True, keeper=keeper)
    join = dict(address=address, **quiet)
    if _loopback_host(address):
        join["_node_ip_address"] = "127.0.0.1"  # a loopback head is dialled on loopback, never the routable address
    token = _send_token_if_found()
    tried = f"ray.init({', '.join(f'{k}={v!r}' for k, v in join.items() if k in ('address', '_node_ip_address'))}"
    tried += ", with the auth token found here)" if token else ", with no auth token)"
    hint = f"check that the cluster's head runs and listens at that address, or leave {key} empty to start a local cluster"
    if not token:
        hint += ("; a head started by `ray start` asks for its auth token: copy the head's ~/.ray/auth_token to this "
                 "machine's, or set RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH")
    try:
        keeper = _init_in_keeper(ray, join, f"{key} = {address!r}: no Ray cluster answered",
                                 min(timeout_s, runtime_cfg.ray_join_timeout_s))
    except ValueError as err:
        raise InputError(f"{key} = {address!r}: {err}; expected the cluster's GCS address host:port or auto") from None
    except (ConnectionError, WorkerTimeout) as err:
        raise InputError(f"{key} = {address!r}: could not join a Ray cluster there ({error_line(err)}; tried "
                         f"{tried}); {hint}") from None
    return RayCluster(ray.get_runtime_context().gcs_address, started=False, keeper=keeper)


def _send_token_if_found() -> bool:
    """Whether this process sends an auth token when it joins a cluster, turning that on where
    a token is found (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``) and
    ``RAY_AUTH_MODE`` is unset, as ``ray start`` does for a node that joins.

    Ray 2.60's ``ray start --head`` turns token authentication on (writing the token to
    ``~/.ray/auth_token`` if there is none), but ``ray.init(address=...)`` sends the token only
    under ``RAY_AUTH_MODE=token``, so without this a head on the same machine refuses the driver
    (``InvalidAuthToken``, surfacing as "Failed to connect"). A head without authentication
    accepts a token it does not ask for. An explicit ``RAY_AUTH_MODE`` is left as it is."""
    from ray._private.authentication.authentication_token_setup import maybe_enable_token_auth_if_token_available

    return maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def _init_in_keeper(ray, kwargs: dict, what: str, timeout_s: float) -> threading.Event:
    """``ray.init(**kwargs)`` in a thread of its own, waited for at most ``timeout_s`` seconds;
    the thread then stays until the returned event is set.

    Ray starts the GCS, the raylet and its helpers with ``PR_SET_PDEATHSIG``, which Linux
    fires when the *thread* that started them ends, so the thread must outlive the cluster.
    Off the main thread, Ray installs no SIGTERM handler of its own, leaving the trainer's.
    After a timeout the event is set, so a start that completes later is torn down at once.
    """
    outcome: list[BaseException | None] = []
    started, release = threading.Event(), threading.Event()

    def keep() -> None:
        try:
            ray.init(**kwargs)
            outcome.append(None)
        except BaseException as err:  # noqa: BLE001 - raised in the caller's thread
            outcome.append(err)
        started.set()
        release.wait()

    threading.Thread(target=keep, name="reasonrl-ray-keeper", daemon=True).start()
    if not started.wait(timeout_s):
        release.set()
        raise WorkerTimeout(f"{what} within {timeout_s} s")
    if outcome[0] is not None:
        release.set()
        raise outcome[0]
    return release


def _loopback_host(address: str) -> bool:
    """Whether the host of ``host:port`` is a loopback address (``localhost`` counts)."""
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return _loopback(host)
    except ValueError:
        return False


def _loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip)
    mapped = getattr(addr, "ipv4_mapped", None)
    return addr.is_loopback or (mapped is not None and mapped.is_loopback)


def _connected():
    """The ray module, once this process is connected (never Ray's implicit ``ray.init``)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        raise RuntimeError("reasonrl.runtime.ray: not connected to a Ray cluster; call connect(cfg.runtime) first")
    return ray


class _Host:
    """The body of every actor: builds one worker with ``factory(*args)`` and calls its methods
    by name. A factory's exception is kept and raised by :meth:`ready`, so that it reaches
    the caller as its own type."""

    def __init__(self, factory: Callable[..., Any], args: tuple) -> None:
        self.worker: Any = None
        self.error: Exception | None = None
        try:
            self.worker = factory(*args)
        except Exception as err:  # noqa: BLE001 - raised by ready()
            self.error = err

    def ready(self) -> int:
        """This actor's process id, once its worker is built (or the factory's exception)."""
        if self.error is not None:
            raise self.error
        return os.getpid()

    def run(self, method: str, /, *args: Any, **kwargs: Any) -> Any:
        """``worker.method(*args, **kwargs)``; object refs among ``args`` arrive resolved."""
        return getattr(self.worker, method)(*args, **kwargs)

    def close(self) -> None:
        """The worker's own ``close``, where it has one."""
        close = getattr(self.worker, "close", None)
        if close is not None:
            close()


@functools.cache
def _host_class():
    """``_Host`` as a Ray actor class: the default concurrency group runs one call at a time
    in submission order; ``concurrent`` (one thread) runs the methods named concurrent beside
    it; ``control`` (one thread) answers pings."""
    import ray

    return ray.remote(concurrency_groups={_CONCURRENT: 1, _CONTROL: 1})(_Host)


class RayGroup:
    """One Ray actor per entry of ``args_per_worker``, each building its worker with
    ``factory(*args)``: the WorkerGroup protocol (``size``, ``submit``, ``call``, ``close``),
    plus :meth:`submit_to`, :meth:`restart`, :meth:`alive`, :meth:`kill` and ``pids``.

    ``name`` names the actors in messages (``name[i]``); ``timeout_s`` bounds :meth:`call`,
    ``start_timeout_s`` building the workers (at start and in :meth:`restart`).
    ``resources`` (per actor, Ray resource names: ``{"CPU": 1, "GPU": 0.5}``; None: Ray's
    default of one CPU to be placed, none held) and ``placement`` (per actor, a Ray scheduling strategy) come from
    :meth:`Reservation.options`. Calls run one at a time in the order submitted, except the
    methods named in ``concurrent``, which run beside a running call, one at a time (they
    must be thread-safe). ``max_restarts``: how often Ray itself re-creates an actor whose
    process died (its worker built again from the same arguments); the calls it had in
    flight still fail with WorkerDied. Raises the factory's exception if a worker cannot be
    built, WorkerTimeout if an actor does not start within ``start_timeout_s``.
    """

    def __init__(
        self,
        factory: Callable[..., Any],
        args_per_worker: list[tuple],
        name: str,
        *,
        timeout_s: float,
        resources: list[dict[str, float]] | None = None,
        placement: list[Any] | None = None,
        start_timeout_s: float = 300.0,
        concurrent: tuple[str, ...] = (),
        max_restarts: int = 0,
    ) -> None:
        self._ray = _connected()
        size = len(args_per_worker)
        if size < 1:
            raise ValueError(f"RayGroup {name}: expected at least one worker")
        for label, per_actor in (("resources", resources), ("placement", placement)):
            if per_actor is not None and len(per_actor) != size:
                raise ValueError(f"RayGroup {name}: {len(per_actor)} {label} for {size} workers")
        self.name, self.size, self.timeout_s, self.start_timeout_s = name, size, timeout_s, start_timeout_s
        self.concurrent = frozenset(concurrent)
        self._factory, self._args = factory, [tuple(a) for a in args_per_worker]
        self._options = [self._actor_options(i, resources, placement, max_restarts) for i in range(size)]
        self._actors: list[Any] = [None] * size
        self._pids = [0] * size
        try:
            for i in range(size):
                self._actors[i] = _host_class().options(**self._options[i]).remote(self._factory, self._args[i])
            self._await_ready(range(size))
        except BaseException:
            self.kill()
            raise

    @staticmethod
    def _actor_options(i: int, resources, placement, max_restarts: int) -> dict[str, Any]:
        options: dict[str, Any] = {"max_restarts": max_restarts, "max_task_retries": 0}
        if resources is not None:
            custom = dict(resources[i])
            if "CPU" in custom:
                options["num_cpus"] = custom.pop("CPU")
            if "GPU" in custom:
                options["num_gpus"] = custom.pop("GPU")
            if custom:
                options["resources"] = custom
        if placement is not None:
            options["scheduling_strategy"] = placement[i]
        return options

    def _label(self, index: int) -> str:
        return self.name if self.size == 1 else f"{self.name}[{index}]"

    def _await_ready(self, indices) -> None:
        """Wait for the actors' workers to be built, all within ``start_timeout_s``."""
        indices = list(indices)
        futures = [self._future(i, self._actors[i].ready.options(concurrency_group=_CONTROL).remote()) for i in indices]
        try:
            pids = gather(futures, self.start_timeout_s, f"{self.name}: starting the actors")
        except WorkerTimeout:
            asks = {k: v for k, v in self._options[indices[0]].items() if k in ("num_cpus", "num_gpus", "resources")}
            raise WorkerTimeout(f"{self.name}: the actors did not start within {self.start_timeout_s} s (each asks for "
                                f"{asks or 'Ray defaults'}; the cluster has {self._ray.available_resources()} free)") from None
        for i, pid in zip(indices, pids, strict=True):
            self._pids[i] = pid

    def _future(self, index: int, ref) -> Future:
        """A Future for ``ref`` whose exception is the worker's own, or WorkerDied."""
        out: Future = Future()
        label, pid = self._label(index), self._pids[index]

        def done(result: Future, ref=ref) -> None:  # ref: kept alive until its result is in
            try:
                value = result.result()
            except BaseException as err:  # noqa: BLE001 - delivered through the future
                out.set_exception(self._translate(err, label, pid))
            else:
                out.set_result(value)

        ref.future().add_done_callback(done)
        return out

    def _translate(self, err: BaseException, label: str, pid: int) -> BaseException:
        """What a caller sees for Ray's ``err``: the worker method's own exception (the
        remote traceback as a note) for a RayTaskError, WorkerDied for any other Ray error
        (a dead, killed or unreachable actor), anything else unchanged."""
        exceptions = self._ray.exceptions
        if isinstance(err, exceptions.RayTaskError):
            cause = err.cause
            if isinstance(cause, exceptions.RayError):  # Ray's stand-in for a cause it could not pickle
                cause = RuntimeError(str(cause))
            cause.add_note(f"in {label}: " + _ANSI.sub("", str(err)).strip())
            return cause
        if isinstance(err, exceptions.RayError):
            died = WorkerDied(f"{label}: the actor (pid {pid or 'not started'}) died or was killed; "
                              f"{_ANSI.sub('', error_line(err))[:300]}")
            died.__cause__ = err
            return died
        return err

    @property
    def pids(self) -> list[int]:
        """Each actor's process id, as of its start, its :meth:`restart` or its last :meth:`alive`."""
        return list(self._pids)

    def submit(self, method: str, *args: Any, **kwargs: Any) -> list[Future]:
        """Call ``method`` on every worker with the same arguments; one Future per worker, in
        order. With several workers each argument is put in the cluster once (:func:`put`) and
        handed to every worker by reference: a version of the weights crosses once."""
        if self.size > 1:
            args = tuple(put(a) for a in args)
            kwargs = {k: put(v) for k, v in kwargs.items()}
        return [self.submit_to(i, method, *args, **kwargs) for i in range(self.size)]

    def submit_to(self, index: int, method: str, *args: Any, **kwargs: Any) -> Future:
        """Call ``method`` on worker ``index`` only. Object refs (:func:`put`) passed as
        arguments arrive as their objects; other arguments travel pickled with the call."""
        run = self._actors[index].run
        if method in self.concurrent:
            run = run.options(concurrency_group=_CONCURRENT)
        return self._future(index, run.remote(method, *args, **kwargs))

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """:meth:`submit` and wait, at most ``timeout_s`` (WorkerTimeout names ``name.method``)."""
        return gather(self.submit(method, *args, **kwargs), self.timeout_s, f"{self.name}.{method}")

    def alive(self, index: int) -> bool:
        """Whether actor ``index`` answers a ping (beside any running call) within a few seconds."""
        ref = self._actors[index].ready.options(concurrency_group=_CONTROL).remote()
        try:
            self._pids[index] = self._ray.get(ref, timeout=min(_PING_S, self.timeout_s))
        except self._ray.exceptions.RayError:
            return False
        return True

    def restart(self, index: int) -> None:
        """Kill actor ``index`` and start a new one from the same arguments (and resources),
        within ``start_timeout_s``; its calls in flight fail with WorkerDied, for the caller to
        submit again."""
        self._ray.kill(self._actors[index], no_restart=True)
        self._actors[index] = _host_class().options(**self._options[index]).remote(self._factory, self._args[index])
        self._await_ready([index])

    def grow(self, args: tuple) -> None:
        """Start one more actor, ``factory(*args)``, as index ``size``, with the resources of
        actor 0 but outside the run's reservation (Ray places it where they are free), within
        ``start_timeout_s``."""
        index = self.size
        options = {k: v for k, v in self._options[0].items() if k != "scheduling_strategy"}
        self._options.append(options)
        self._args.append(tuple(args))
        self._actors.append(_host_class().options(**options).remote(self._factory, self._args[index]))
        self._pids.append(0)
        self.size += 1
        try:
            self._await_ready([index])
        except BaseException:
            self._ray.kill(self._actors[index], no_restart=True)
            for kept in (self._options, self._args, self._actors, self._pids):
                kept.pop()
            self.size -= 1
            raise

    def shrink(self, timeout_s: float = 10.0) -> None:
        """Close the last actor (it finishes the calls sent before; killed after ``timeout_s``)
        and drop it."""
        if self.size <= 1:
            raise ValueError(f"RayGroup {self.name}: cannot shrink below one worker")
        index = self.size - 1
        actor = self._actors[index]
        closing = self._future(index, actor.close.remote())
        for kept in (self._options, self._args, self._actors, self._pids):
            kept.pop()
        self.size -= 1
        try:
            gather([closing], timeout_s, f"{self.name}[{index}].close")
        except (WorkerTimeout, WorkerDied):
            pass
        finally:
            self._ray.kill(actor, no_restart=True)

    def kill(self) -> None:
        """Kill every actor at once (a hung one included); pending calls fail with WorkerDied."""
        for actor in self._actors:
            if actor is not None:
                self._ray.kill(actor, no_restart=True)

    def close(self, timeout_s: float = 10.0) -> None:
        """Let each actor finish the calls submitted before this one and close its worker,
        then end it (killed after ``timeout_s`` in all)."""
        closing = [self._future(i, a.close.remote()) for i, a in enumerate(self._actors) if a is not None]
        try:
            gather(closing, timeout_s, f"{self.name}.close")
        except (WorkerTimeout, WorkerDied):
            pass  # killed below either way
        finally:
            self.kill()


class Reservation:
    """A Ray placement group holding ``plan``'s bundles (PACK: on as few nodes as fit).

    Raises LimitError before anything is reserved when the cluster has too few resources in
    all (:func:`~reasonrl.runtime.placement.check_fits`), and when the bundles are not placed
    within ``timeout_s`` (too little free, or no node big enough): never a silent wait.
    """

    def __init__(self, plan: Plan, *, timeout_s: float) -> None:
        ray = _connected()
        check_fits(plan, ray.cluster_resources())
        self.plan = plan
        self.group = ray.util.placement_group(plan.bundles, strategy="PACK")
        if not self.group.wait(timeout_s):
            ray.util.remove_placement_group(self.group)
            raise LimitError(f"runtime.roles: the cluster did not place the bundles {plan.bundles} "
                             f"(roles {plan.members}) within {timeout_s} s; it has {ray.available_resources()} free")

    def options(self, role: str) -> dict[str, list]:
        """``resources`` and ``placement`` for a :class:`RayGroup` of ``role``'s actors, one
        per actor of the plan, each in its bundle."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundles = self.plan.index[role]
        return {"resources": [self.plan.request(role) for _ in bundles],
                "placement": [PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=i) for i in bundles]}

    def close(self) -> None:
        """Release the bundles (close the groups in them first)."""
        _connected().util.remove_placement_group(self.group)


def put(obj: Any):
    """Store ``obj`` in the cluster once and return its ObjectRef: passed to any number of
    calls, it is transferred once (a WeightsUpdate pickles as one flat buffer per dtype plus
    names and shapes, reasonrl/types.py, so a version is one object, never one per parameter)."""
    return _connected().put(obj)

