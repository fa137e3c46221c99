"""The seccomp filter every sandboxed process runs under.

Modelled on Flatpak's: the default is to allow, and the calls that let a
process reach outside its namespaces, the kernel's attack surface, or the
user's terminal are refused with an errno (not killed, so programs that probe
for them carry on). Built once with libseccomp (through pyseccomp) and handed
to bwrap as raw BPF on a descriptor; bwrap loads it just before it runs the
command, after its own setup (which needs mount and friends).

Only the native architecture is listed, so libseccomp kills any call made
through another ABI (the 32-bit int 0x80 door on x86_64).
"""

from __future__ import annotations

import errno
import os
import socket

import pyseccomp as sc

CLONE_NEWUSER = 0x10000000
TIOCSTI = 0x5412
TIOCLINUX = 0x541C

# Refused with EPERM outright.
DENIED = (
    # The kernel keyring is not namespaced.
    "keyctl", "add_key", "request_key",
    # Mounting, old and new API: the sandbox's view of files is fixed.
    "mount", "umount", "umount2", "pivot_root", "chroot",
    "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    # New namespaces (user namespaces are also disabled in bwrap).
    "unshare", "setns",
    # Reading or steering other processes.
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp",
    # Large kernel attack surface with no use for sandboxed programs.
    "perf_event_open", "bpf", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    # Machine administration.
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "acct", "quotactl", "syslog", "swapon", "swapoff", "reboot",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
    "lookup_dcookie", "nfsservctl", "vhangup",
)  # fmt: skip

ALLOWED_SOCKET_FAMILIES = (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6)
AF_MAX_PROBED = 64


def _build() -> sc.SyscallFilter:
    f = sc.SyscallFilter(sc.ALLOW)
    eperm = sc.ERRNO(errno.EPERM)
    for name in DENIED:
        try:
            f.add_rule(eperm, name)
        except OSError:
            pass  # not a syscall on this architecture or libseccomp version
    # clone3 takes its flags in a struct seccomp cannot look into: say it does
    # not exist, and libc falls back to clone, whose flags it can check.
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    f.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER))
    # ioctl's request is an int; userspace may pass garbage in the high bits.
    for request in (TIOCSTI, TIOCLINUX):
        f.add_rule(eperm, "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, request))
    # Socket families: only Unix, IPv4 and IPv6 (netlink, packet, vsock... refused).
    no_family = sc.ERRNO(errno.EAFNOSUPPORT)
    allowed = sorted(ALLOWED_SOCKET_FAMILIES)
    previous = -1
    for family in allowed:
        for refused in range(previous + 1, family):
            f.add_rule(no_family, "socket", sc.Arg(0, sc.EQ, refused))
        previous = family
    f.add_rule(no_family, "socket", sc.Arg(0, sc.GE, previous + 1))
    return f


def compile_bpf() -> bytes:
    """The filter as raw BPF, the format bwrap's --seccomp reads."""
    fd = os.memfd_create("sandboxd-seccomp", os.MFD_CLOEXEC)
    try:
        with os.fdopen(os.dup(fd), "wb") as out:
            _build().export_bpf(out)
        os.lseek(fd, 0, os.SEEK_SET)
        size = os.fstat(fd).st_size
        return os.pread(fd, size, 0)
    finally:
        os.close(fd)
