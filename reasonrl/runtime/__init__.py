"""Runtimes: how workers are placed and called (in this process, or each in a process of its own)."""

from reasonrl.runtime.group import LocalGroup, WorkerDied, WorkerGroup, WorkerTimeout, gather
from reasonrl.runtime.process import ProcessGroup
from reasonrl.runtime.threads import available_cores, setup_torch

__all__ = ["LocalGroup", "ProcessGroup", "WorkerDied", "WorkerGroup", "WorkerTimeout", "available_cores", "gather", "setup_torch"]
