"""The sandbox's system-call filter: a classic-BPF seccomp program, built here with no library.

    program = filter_program()        # bytes: struct sock_filter[], built once per process
    bwrap --seccomp FD ...            # the bwrap level hands it to bubblewrap on a file descriptor
    install(program)                  # the rlimits level: PR_SET_NO_NEW_PRIVS, then PR_SET_SECCOMP

It closes the way around the sandbox's caps through namespaces of the program's own (a nested
user namespace gives it a mount namespace it may mount a tmpfs in, whose pages no rlimit counts)
and the other kinds of memory that no rlimit counts, and it keeps the program off kernel
interfaces a Python program does not need. Each call in :data:`BLOCKED` fails with its errno; the
program goes on:

- namespaces and mounts: ``unshare``, ``setns``, ``clone`` with any ``CLONE_NEW*`` flag, ``mount``,
  ``umount2``, ``pivot_root``, ``chroot`` and the mount API (``open_tree``, ``move_mount``,
  ``fsopen``, ``fsconfig``, ``fsmount``, ``fspick``, ``mount_setattr``): EPERM. ``clone3`` gets
  ENOSYS (its flags are in memory a filter cannot read), on which the C library falls back to
  ``clone`` (glibc >= 2.34 does so for threads and ``posix_spawn``);
- memory outside RLIMIT_AS and the file caps: ``memfd_create``, ``memfd_secret``, System V shared
  memory (``shmget``: a segment keeps its pages after it is detached) and message queues
  (``msgget``): EPERM;
- the rest: keys (``keyctl``, ``add_key``, ``request_key``), ``ptrace``, ``process_vm_readv`` /
  ``writev``, ``bpf``, ``perf_event_open``, ``userfaultfd``, io_uring, ``open_by_handle_at``,
  kernel modules and kexec: EPERM.

Architectures: x86_64 and aarch64, each with its own numbers (from the kernel's
``asm/unistd_64.h`` and ``asm-generic/unistd.h``; tests/unit/test_seccomp.py checks them against
the headers where they are installed). A call made under another ABI (i386 through ``int 0x80``,
arm32) kills the process; an x32 call (x86_64 numbers with bit 30 set) gets ENOSYS.
"""

from __future__ import annotations

import errno
import functools
import struct

AUDIT_ARCH_X86_64 = 0xC000003E
"""EM_X86_64 (62) | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE."""
AUDIT_ARCH_AARCH64 = 0xC00000B7
"""EM_AARCH64 (183) | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE."""
X32_SYSCALL_BIT = 0x40000000

RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000
RET_ALLOW = 0x7FFF0000

CLONE_NEW_FLAGS = 0x7E020000
"""CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID |
CLONE_NEWNET (CLONE_NEWTIME, 0x80, is part of the exit signal in ``clone``'s flags)."""

BLOCKED: dict[str, int] = {
    **dict.fromkeys(["unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount",
                     "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr"], errno.EPERM),
    "clone3": errno.ENOSYS,
    **dict.fromkeys(["memfd_create", "memfd_secret", "shmget", "msgget"], errno.EPERM),
    **dict.fromkeys(["keyctl", "add_key", "request_key", "ptrace", "process_vm_readv", "process_vm_writev", "bpf",
                     "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
                     "open_by_handle_at", "init_module", "finit_module", "delete_module", "kexec_load",
                     "kexec_file_load"], errno.EPERM),
}
"""Each blocked call and the errno it fails with (``clone`` is checked by its flags instead)."""

SYSCALLS: dict[int, dict[str, int]] = {
    AUDIT_ARCH_X86_64: {
        "clone": 56, "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161,
        "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
        "mount_setattr": 442, "clone3": 435, "memfd_create": 319, "memfd_secret": 447, "shmget": 29, "msgget": 68,
        "keyctl": 250, "add_key": 248, "request_key": 249, "ptrace": 101, "process_vm_readv": 310,
        "process_vm_writev": 311, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "open_by_handle_at": 304, "init_module": 175,
        "finit_module": 313, "delete_module": 176, "kexec_load": 246, "kexec_file_load": 320,
    },
    AUDIT_ARCH_AARCH64: {
        "clone": 220, "unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51,
        "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
        "mount_setattr": 442, "clone3": 435, "memfd_create": 279, "memfd_secret": 447, "shmget": 194, "msgget": 186,
        "keyctl": 219, "add_key": 217, "request_key": 218, "ptrace": 117, "process_vm_readv": 270,
        "process_vm_writev": 271, "bpf": 280, "perf_event_open": 241, "userfaultfd": 282, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "open_by_handle_at": 265, "init_module": 105,
        "finit_module": 273, "delete_module": 106, "kexec_load": 104, "kexec_file_load": 294,
    },
}
"""Each architecture's numbers for the calls the filter looks at."""

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6] (little-endian:
# the low half of args[0], which holds all of clone's flags the kernel reads, is at offset 16)
_NR, _ARCH, _ARG0_LOW = 0, 4, 16
_LD_W_ABS, _JA, _JEQ, _JGE, _JSET, _RET = 0x20, 0x05, 0x15, 0x35, 0x45, 0x06


def _insn(code: int, k: int = 0, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def _arch_block(numbers: dict[str, int], x32: bool) -> list[bytes]:
    """The checks of one architecture, from loading the call number to allowing it."""
    block = [_insn(_LD_W_ABS, _NR)]
    if x32:
        block += [_insn(_JGE, X32_SYSCALL_BIT, 0, 1), _insn(_RET, RET_ERRNO | errno.ENOSYS)]
    for name, code in BLOCKED.items():
        block += [_insn(_JEQ, numbers[name], 0, 1), _insn(_RET, RET_ERRNO | code)]
    block += [_insn(_JEQ, numbers["clone"], 0, 3), _insn(_LD_W_ABS, _ARG0_LOW), _insn(_JSET, CLONE_NEW_FLAGS, 0, 1),
              _insn(_RET, RET_ERRNO | errno.EPERM), _insn(_RET, RET_ALLOW)]
    return block


@functools.cache
def filter_program() -> bytes:
    """The filter as ``struct sock_filter`` records (what ``bwrap --seccomp`` reads and
    ``PR_SET_SECCOMP`` takes), built once per process."""
    x86 = _arch_block(SYSCALLS[AUDIT_ARCH_X86_64], x32=True)
    arm = _arch_block(SYSCALLS[AUDIT_ARCH_AARCH64], x32=False)
    # 0: load arch; 1-2: x86_64 jumps to its block; 3-4: aarch64 to its; 5: any other ABI is killed
    head = [_insn(_LD_W_ABS, _ARCH),
            _insn(_JEQ, AUDIT_ARCH_X86_64, 0, 1), _insn(_JA, 3),
            _insn(_JEQ, AUDIT_ARCH_AARCH64, 0, 1), _insn(_JA, 1 + len(x86)),
            _insn(_RET, RET_KILL_PROCESS)]
    return b"".join(head + x86 + arm)
