"""Worker classes for the Ray runtime tests, importable by the actors' processes, and the
listening sockets of a process tree."""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time

import torch

from reasonrl.types import WeightsUpdate


class Refused(Exception):
    """An exception type of the test's own, to check it crosses the actor boundary unchanged."""


class Receiver:
    """A rollout-like worker: keeps the last weights update it was handed."""

    def __init__(self) -> None:
        self.update: WeightsUpdate | None = None

    def load_weights(self, update: WeightsUpdate) -> tuple[int, dict[str, torch.Tensor]]:
        self.update = update
        return update.version, {k: v.clone() for k, v in update.tensors.items()}

    def refuse(self, why: str) -> None:
        raise Refused(why)


def listening_sockets(pids: list[int]) -> list[tuple[int, str, str, int]]:
    """(pid, protocol, address, port) of every listening TCP socket and bound UDP socket of ``pids``."""
    by_inode = {}
    for proto in ("tcp", "tcp6", "udp", "udp6"):
        with open(f"/proc/net/{proto}") as f:
            next(f)
            for line in f:
                fields = line.split()
                local, state, inode = fields[1], fields[3], int(fields[9])
                if state == ("0A" if proto.startswith("tcp") else "07"):  # LISTEN; UDP: bound, unconnected
                    hexip, hexport = local.split(":")
                    raw = bytes.fromhex(hexip)
                    if len(raw) == 4:
                        ip = socket.inet_ntop(socket.AF_INET, raw[::-1])
                    else:
                        ip = socket.inet_ntop(socket.AF_INET6, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
                    by_inode[inode] = (proto, ip, int(hexport, 16))
    found = []
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:[") and int(link[8:-1]) in by_inode:
                found.append((pid, *by_inode[int(link[8:-1])]))
    return found


def process_tree(root: int) -> list[int]:
    """``root`` and every process descending from it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += children.get(pid, [])
    return tree


def is_loopback(ip: str) -> bool:
    """Whether ``ip`` (v4, v6 or v4-mapped v6) is a loopback address."""
    addr = ipaddress.ip_address(ip)
    return addr.is_loopback or bool(getattr(addr, "ipv4_mapped", None) and addr.ipv4_mapped.is_loopback)


class RayHead:
    """A head started with ``ray start --head`` on 127.0.0.1, as a user starts one, in a temp dir
    of its own: :meth:`stop` ends that head's processes only (``ray stop`` would end every Ray
    cluster on the machine)."""

    def __init__(self, temp_dir: str, cpus: int = 2) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.temp_dir = temp_dir
        env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}  # as docs/ray.md starts a loopback head
        command = [os.path.join(os.path.dirname(sys.executable), "ray"), "start", "--head", "--node-ip-address=127.0.0.1",
                   f"--port={self.port}", f"--num-cpus={cpus}", "--include-dashboard=false", "--disable-usage-stats",
                   f"--temp-dir={temp_dir}"]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            self.stop()
            raise RuntimeError(f"ray start failed ({done.returncode}): {done.stderr[-2000:]}")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def pids(self) -> list[int]:
        """The head's processes: every process whose command line names its temp dir, and their children."""
        own = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/cmdline", "rb") as f:
                        if self.temp_dir.encode() in f.read():
                            own.append(int(entry))
                except OSError:
                    continue
        return sorted({pid for root in own for pid in process_tree(root)})

    def stop(self, grace_s: float = 2.0, timeout_s: float = 20.0) -> None:
        """SIGTERM, then SIGKILL to what is left after ``grace_s``, as ``ray stop --grace-period``
        does: the head's raylet and GCS take 15 s and more to end on SIGTERM alone."""
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, timeout_s)):
            for pid in self.pids():
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait_s
            while self.pids() and time.monotonic() < deadline:
                time.sleep(0.2)
            if not self.pids():
                return
        raise RuntimeError(f"the Ray head in {self.temp_dir} did not stop: {self.pids()}")
