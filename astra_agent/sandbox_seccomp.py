"""A seccomp filter for the sandbox: the few system calls whose effects outlive the processes
that make them, or that would lift the sandbox's bounds.

Killing an episode's processes and emptying ``/tmp`` frees everything a process holds, but not
what the kernel keeps for the *uid* or the IPC namespace: keys in the user keyring (kept for the
uid even after its last process ends, so the next episode, or the next sandbox that leases the
uid, would read them), SysV shared memory, message queues and semaphores, POSIX message queues.
A new user namespace would let tool code mount a tmpfs of its own, unbounded by ``tmp_bytes``.
Those calls fail with EPERM; everything else is allowed (the rest of the isolation is
bubblewrap's and the uid's). A few calls that are kernel attack surface and that no tool needs
are refused too, as container runtimes do.

bubblewrap installs the filter (``--seccomp FD``) before it starts the worker, for every process
of the sandbox; the filter is a classic BPF program, built here with ``struct``.
"""

from __future__ import annotations

import errno
import os
import struct

_LD_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JSET = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET = 0x06  # BPF_RET | BPF_K
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
_NR, _ARCH, _ARG0 = 0, 4, 16  # offsets in struct seccomp_data (arg 0's low word: little endian)
_X32 = 0x40000000
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
_NEW_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000
_NEW_NAMESPACES |= 0x20000000 | 0x40000000

# name: (x86_64, aarch64)
_REFUSED = {
    # kept by the kernel beyond the processes: keyrings, SysV and POSIX IPC
    "add_key": (248, 217),
    "request_key": (249, 218),
    "keyctl": (250, 219),
    "shmget": (29, 194),
    "msgget": (68, 186),
    "semget": (64, 190),
    "mq_open": (240, 180),
    # memory outside the address-space limit (a memfd's pages are not mapped): 1 GiB for each
    # process without this (open files × file size)
    "memfd_create": (319, 279),
    # namespaces (a user namespace mounts an unbounded tmpfs)
    "unshare": (272, 97),
    "setns": (308, 268),
    # attack surface no tool needs
    "bpf": (321, 280),
    "perf_event_open": (298, 241),
    "userfaultfd": (323, 282),
    "io_uring_setup": (425, 425),
}
_CLONE = (56, 220)
_CLONE3 = (435, 435)  # its flags are in memory, out of BPF's reach: ENOSYS, so libc uses clone
_ARCHES = {"x86_64": (0, 0xC000003E), "aarch64": (1, 0xC00000B7)}


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def seccomp_filter(machine: str | None = None) -> bytes | None:
    """The filter for this machine's architecture, or None where its numbers are not known."""
    arch = _ARCHES.get(machine or os.uname().machine)
    if arch is None:
        return None
    col, audit_arch = arch
    tests = [(_JEQ, nr) for nr in sorted(nrs[col] for nrs in _REFUSED.values())]
    if col == 0:  # x86_64: the x32 numbering is another way in
        tests.insert(0, (_JGE, _X32))
    n = len(tests)
    # 0-3: a foreign architecture (i386 on x86_64) is refused everything; then the number.
    out = [_insn(_LD_ABS, _ARCH), _insn(_JEQ, audit_arch, 1, 0), _insn(_RET, _ERRNO | errno.EPERM)]
    out.append(_insn(_LD_ABS, _NR))
    out += [_insn(code, k, jt=n - i + 2) for i, (code, k) in enumerate(tests)]  # → refuse
    out.append(_insn(_JEQ, _CLONE3[col], jt=3))  # → ENOSYS
    out.append(_insn(_JEQ, _CLONE[col], jt=3))  # → its flags
    out.append(_insn(_RET, _ALLOW))
    out.append(_insn(_RET, _ERRNO | errno.EPERM))  # refuse
    out.append(_insn(_RET, _ERRNO | errno.ENOSYS))
    out.append(_insn(_LD_ABS, _ARG0))  # clone: no new namespaces
    out.append(_insn(_JSET, _NEW_NAMESPACES, jt=0, jf=1))
    out.append(_insn(_RET, _ERRNO | errno.EPERM))
    out.append(_insn(_RET, _ALLOW))
    return b"".join(out)
