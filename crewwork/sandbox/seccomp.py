"""A small seccomp filter for the bwrap backend, built as raw classic-BPF (no libseccomp needed).

Namespaces alone leave the whole kernel syscall surface open, including creating nested user namespaces,
in which the command would again hold every capability (mounts, netfilter, ...): the usual first step of
a kernel exploit. Docker's default profile closes these; this filter closes the same ones for bwrap.
Everything not listed is allowed, so ordinary programs (python, pytest, git, pip, compilers) run unchanged.
Only x86_64 and aarch64 are covered; on other architectures no filter is installed (and the result's
`enforcement` does not claim one).
"""

from __future__ import annotations

import errno
import os
import platform
import struct

# Classic BPF opcodes (linux/filter.h, linux/seccomp.h).
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_OFF_NR, _OFF_ARCH, _OFF_ARG0 = 0, 4, 16
_X32_SYSCALL_BIT = 0x40000000
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
_CLONE_NEW_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

_ARCHES: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (
        0xC000003E,
        {
            "clone": 56, "clone3": 435, "unshare": 272, "setns": 308, "mount": 165, "umount2": 166,
            "pivot_root": 155, "keyctl": 250, "add_key": 248, "request_key": 249, "bpf": 321,
            "perf_event_open": 298, "userfaultfd": 323, "kexec_load": 246, "kexec_file_load": 320,
            "init_module": 175, "finit_module": 313, "delete_module": 176, "open_by_handle_at": 304,
            "acct": 163, "swapon": 167, "swapoff": 168, "reboot": 169, "io_uring_setup": 425,
            "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428, "move_mount": 429,
            "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
        },
    ),
    "aarch64": (
        0xC00000B7,
        {
            "clone": 220, "clone3": 435, "unshare": 97, "setns": 268, "mount": 40, "umount2": 39,
            "pivot_root": 41, "keyctl": 219, "add_key": 217, "request_key": 218, "bpf": 280,
            "perf_event_open": 241, "userfaultfd": 282, "kexec_load": 104, "kexec_file_load": 294,
            "init_module": 105, "finit_module": 273, "delete_module": 106, "open_by_handle_at": 265,
            "acct": 89, "swapon": 224, "swapoff": 225, "reboot": 142, "io_uring_setup": 425,
            "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428, "move_mount": 429,
            "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
        },
    ),
}  # fmt: skip
DENIED = tuple(n for n in _ARCHES["x86_64"][1] if n not in ("clone", "clone3"))


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def build_filter(machine: str | None = None) -> bytes | None:
    """The filter program for this machine, or None where we have no syscall table."""
    arch = _ARCHES.get(machine or platform.machine())
    if arch is None:
        return None
    audit_arch, nrs = arch
    denied = [nrs[name] for name in DENIED]
    eperm = _RET_ERRNO | errno.EPERM
    # clone3 passes flags in a struct BPF cannot read; ENOSYS makes libc fall back to clone, checked below.
    enosys = _RET_ERRNO | errno.ENOSYS
    prog: list[bytes] = []
    # Layout: header, one jump per denied syscall, clone checks, then the shared return instructions.
    n_tail = 3  # allow, eperm, enosys
    body_len = 4 + len(denied) + 4

    def to(target: int, at: int) -> int:
        return target - at - 1

    allow_at, eperm_at, enosys_at = body_len, body_len + 1, body_len + 2
    prog.append(_insn(_LD_W_ABS, _OFF_ARCH))  # 0
    prog.append(_insn(_JEQ_K, audit_arch, 0, to(enosys_at, 1)))  # 1: foreign ABI (e.g. int 0x80)
    prog.append(_insn(_LD_W_ABS, _OFF_NR))  # 2
    prog.append(_insn(_JGE_K, _X32_SYSCALL_BIT, to(enosys_at, 3), 0))  # 3: x32 ABI
    for i, nr in enumerate(denied):
        at = 4 + i
        prog.append(_insn(_JEQ_K, nr, to(eperm_at, at), 0))
    at = 4 + len(denied)
    prog.append(_insn(_JEQ_K, nrs["clone3"], to(enosys_at, at), 0))
    prog.append(_insn(_JEQ_K, nrs["clone"], 0, to(allow_at, at + 1)))
    prog.append(_insn(_LD_W_ABS, _OFF_ARG0))  # flags (low 32 bits, little endian)
    prog.append(_insn(_JSET_K, _CLONE_NEW_NAMESPACES, to(eperm_at, at + 3), to(allow_at, at + 3)))
    assert len(prog) == body_len
    prog += [_insn(_RET_K, _RET_ALLOW), _insn(_RET_K, eperm), _insn(_RET_K, enosys)]
    assert len(prog) == body_len + n_tail
    return b"".join(prog)


def filter_fd() -> int | None:
    """A readable fd holding the filter, for `bwrap --seccomp FD` (the caller closes it)."""
    program = build_filter()
    if program is None:
        return None
    fd = os.memfd_create("crewwork-seccomp", 0)  # inheritable: no MFD_CLOEXEC
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
