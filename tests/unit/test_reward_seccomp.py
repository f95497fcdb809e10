"""The sandbox's seccomp filter, run through a classic-BPF interpreter for each architecture (the
in-kernel behaviour on this machine's is in tests/integration/test_sandbox.py), and its call
numbers checked against the kernel headers where they are installed."""

from __future__ import annotations

import errno
import re
import struct
from pathlib import Path

import pytest

from reasonrl.reward.seccomp import (
    AUDIT_ARCH_AARCH64,
    AUDIT_ARCH_X86_64,
    BLOCKED,
    RET_ALLOW,
    RET_ERRNO,
    RET_KILL_PROCESS,
    SYSCALLS,
    filter_program,
)

AUDIT_ARCH_I386 = 0x40000003
CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000, 0x20000000, 0x40000000
SIGCHLD, CLONE_VM, CLONE_THREAD = 17, 0x100, 0x10000


def run_filter(program: bytes, nr: int, arch: int, args: tuple[int, ...] = ()) -> int:
    """What the kernel's classic-BPF interpreter returns for this call (the instructions the filter
    uses: load word, ja, jeq, jge, jset, ret)."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *(list(args) + [0] * (6 - len(args))))
    insns = [struct.unpack_from("<HBBI", program, i) for i in range(0, len(program), 8)]
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == 0x20:
            acc, pc = struct.unpack_from("<I", data, k)[0], pc + 1
        elif code == 0x05:
            pc += 1 + k
        elif code in (0x15, 0x35, 0x45):
            hit = acc == k if code == 0x15 else acc >= k if code == 0x35 else bool(acc & k)
            pc += 1 + (jt if hit else jf)
        elif code == 0x06:
            return k
        else:
            raise AssertionError(f"instruction {code:#x} at {pc}")


@pytest.mark.parametrize("arch", [AUDIT_ARCH_X86_64, AUDIT_ARCH_AARCH64], ids=["x86_64", "aarch64"])
def test_each_blocked_call_fails_with_its_errno_and_the_rest_are_allowed(arch):
    program, numbers = filter_program(), SYSCALLS[arch]
    for name, code in BLOCKED.items():
        assert run_filter(program, numbers[name], arch) == RET_ERRNO | code, name
    assert run_filter(program, numbers["clone3"], arch) == RET_ERRNO | errno.ENOSYS
    blocked = set(numbers.values())
    for nr in range(0, 460):  # read, write, openat, execve, ...: every call not named is allowed
        if nr not in blocked:
            assert run_filter(program, nr, arch, (CLONE_NEWUSER,)) == RET_ALLOW, nr
    clone = numbers["clone"]
    for flags in (SIGCHLD, CLONE_VM | CLONE_THREAD | 0x3D0F00, 0x80 | SIGCHLD):  # fork, a thread, exit signal 0x80+
        assert run_filter(program, clone, arch, (flags,)) == RET_ALLOW, hex(flags)
    for flag in (CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWNET, 0x02000000, 0x04000000, 0x08000000):
        assert run_filter(program, clone, arch, (flag | SIGCHLD,)) == RET_ERRNO | errno.EPERM, hex(flag)


def test_another_abi_is_killed_and_x32_calls_get_enosys():
    program = filter_program()
    assert run_filter(program, 310, AUDIT_ARCH_I386) == RET_KILL_PROCESS  # i386's unshare, through int 0x80
    assert run_filter(program, 0, 0x40000028) == RET_KILL_PROCESS  # arm32
    assert run_filter(program, 0x40000000 | 272, AUDIT_ARCH_X86_64) == RET_ERRNO | errno.ENOSYS  # x32 unshare
    assert run_filter(program, 0x40000000, AUDIT_ARCH_X86_64) == RET_ERRNO | errno.ENOSYS


def test_the_filter_is_built_once():
    assert filter_program() is filter_program() and len(filter_program()) % 8 == 0


HEADERS = {AUDIT_ARCH_X86_64: Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
           AUDIT_ARCH_AARCH64: Path("/usr/include/asm-generic/unistd.h")}


@pytest.mark.parametrize("arch", sorted(HEADERS), ids=["x86_64", "aarch64"])
def test_call_numbers_match_the_kernel_headers(arch):
    header = HEADERS[arch]
    if not header.exists():
        pytest.skip(f"{header} is not installed (linux-libc-dev)")
    defined = {m[1]: int(m[2]) for m in re.finditer(r"^#define __NR_(\w+)\s+(\d+)\s*$", header.read_text(), re.M)}
    assert {name: defined.get(name) for name in SYSCALLS[arch]} == SYSCALLS[arch]
