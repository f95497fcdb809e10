"""Worker classes for the Ray runtime tests, importable by the actors' processes, and the
listening sockets of a process tree."""

from __future__ import annotations

import ipaddress
import os
import socket

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
