"""Every call the seccomp filter denies, probed the way Flatpak's test-seccomp does.

Each probe passes a bad pointer (or an invalid argument) where it can, so a
call that slipped through the filter would answer EFAULT or EINVAL instead of
acting; the filter's answer is EPERM (ENOSYS for clone3, EAFNOSUPPORT for
refused socket families). The same probe run without sandboxd's seccomp
program (seccomp = false) answers differently, which shows each case is the
filter's doing and not an accident of the environment.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sandboxd.server import create_app
from tests.conftest import form_with_file, make_settings

# syscall numbers on x86_64; BAD is an address nothing is mapped at.
PROBE = r"""
import ctypes, errno, json, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
BAD = ctypes.c_void_p(0x10)
def sys_(nr, *args):
    ctypes.set_errno(0)
    args = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    r = libc.syscall(ctypes.c_long(nr), *args)
    return "ok" if r != -1 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
results = {
    "keyctl": sys_(250, 0, 0, 0, 0, 0),
    "add_key": sys_(248, BAD, BAD, BAD, 0, 0),
    "request_key": sys_(249, BAD, BAD, BAD, 0),
    "mount": sys_(165, BAD, BAD, BAD, 0, BAD),
    "umount2": sys_(166, BAD, 0),
    "pivot_root": sys_(155, BAD, BAD),
    "chroot": sys_(161, BAD),
    "open_tree": sys_(428, -1, BAD, 0),
    "move_mount": sys_(429, -1, BAD, -1, BAD, 0),
    "fsopen": sys_(430, BAD, 0),
    "fsconfig": sys_(431, -1, 0, BAD, BAD, 0),
    "fsmount": sys_(432, -1, 0, 0),
    "fspick": sys_(433, -1, BAD, 0),
    "mount_setattr": sys_(442, -1, BAD, 0, BAD, 0),
    "unshare": sys_(272, 0x10000000),
    "setns": sys_(308, -1, 0),
    "clone_newuser": sys_(56, 0x10000000 | 17, 0, 0, 0, 0),
    "clone3": sys_(435, BAD, 88),
    "ptrace": sys_(101, 2, 1, BAD, 0),  # PEEKDATA on an untraced pid: ESRCH if allowed
    "process_vm_readv": sys_(310, 1, BAD, 1, BAD, 1, 0),
    "process_vm_writev": sys_(311, 1, BAD, 1, BAD, 1, 0),
    "perf_event_open": sys_(298, BAD, 0, -1, -1, 0),
    "bpf": sys_(321, 0, BAD, 0),
    "userfaultfd": sys_(323, 0),
    "io_uring_setup": sys_(425, 1, BAD),
    "io_uring_enter": sys_(426, -1, 0, 0, 0, BAD),
    "io_uring_register": sys_(427, -1, 0, BAD, 0),
    "kexec_load": sys_(246, 0, 0, BAD, 0),
    "kexec_file_load": sys_(320, -1, -1, 0, BAD, 0),
    "init_module": sys_(175, BAD, 0, BAD),
    "finit_module": sys_(313, -1, BAD, 0),
    "delete_module": sys_(176, BAD, 0),
    "acct": sys_(163, BAD),
    "quotactl": sys_(179, 0, BAD, 0, BAD),
    "syslog": sys_(103, 3, BAD, 10),
    "ioctl_tiocsti": sys_(16, 0, 0x5412, BAD),
    "ioctl_tiocsti_high_bits": sys_(16, 0, 0x1_0000_5412, BAD),
    "ioctl_tioclinux": sys_(16, 0, 0x541C, BAD),
}
for name, family in (("socket_netlink", socket.AF_NETLINK), ("socket_packet", socket.AF_PACKET),
                     ("socket_vsock", 40), ("socket_unspec", 0), ("socket_high", 60)):
    try:
        socket.socket(family, socket.SOCK_DGRAM).close()
        results[name] = "ok"
    except OSError as exc:
        results[name] = errno.errorcode.get(exc.errno, str(exc.errno))
for name, family in (("socket_unix", socket.AF_UNIX), ("socket_inet", socket.AF_INET),
                     ("socket_inet6", socket.AF_INET6)):
    try:
        socket.socket(family, socket.SOCK_STREAM).close()
        results[name] = "ok"
    except OSError as exc:
        results[name] = errno.errorcode.get(exc.errno, str(exc.errno))
print(json.dumps(results))
"""

DENIED = [
    "keyctl", "add_key", "request_key", "mount", "umount2", "pivot_root", "chroot",
    "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    "unshare", "setns", "clone_newuser", "ptrace", "process_vm_readv", "process_vm_writev",
    "perf_event_open", "bpf", "userfaultfd", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "kexec_load", "kexec_file_load", "init_module", "finit_module",
    "delete_module", "acct", "quotactl", "syslog", "ioctl_tiocsti", "ioctl_tiocsti_high_bits",
    "ioctl_tioclinux",
]  # fmt: skip
REFUSED_FAMILIES = [
    "socket_netlink",
    "socket_packet",
    "socket_vsock",
    "socket_unspec",
    "socket_high",
]


async def _probe(client: Any) -> dict[str, str]:
    r = await client.post("/v1/sandboxes", json={})
    sid = (await r.json())["id"]
    r = await client.post(
        f"/v1/sandboxes/{sid}/files", data=form_with_file(PROBE.encode(), "probe.py")
    )
    assert r.status == 201
    r = await client.post(f"/v1/sandboxes/{sid}/exec", json={"command": "python3 probe.py"})
    body = await r.json()
    assert body["exit_code"] == 0, body["output"]
    return json.loads(body["stdout"])


@pytest.fixture
async def filtered(client: Any) -> dict[str, str]:
    return await _probe(client)


@pytest.fixture
async def unfiltered(aiohttp_client: Any, short_tmp: Path) -> dict[str, str]:
    settings = make_settings(short_tmp).model_copy(update={"seccomp": False})
    return await _probe(await aiohttp_client(create_app(settings)))


@pytest.mark.parametrize("name", DENIED)
async def test_denied_call_answers_eperm(filtered, unfiltered, name):
    assert filtered[name] == "EPERM"
    # Without the filter the same probe gets another answer (EFAULT, EINVAL, EBADF,
    # ENOTTY...): the EPERM above is the filter's, not the environment's.
    assert unfiltered[name] != "EPERM" or name in _EPERM_ANYWAY


# Calls that answer EPERM even unfiltered, because the sandbox has no
# capabilities: for these the filter is a second wall, not the only one.
_EPERM_ANYWAY = {
    "pivot_root", "move_mount", "fsopen", "fsmount", "fspick", "userfaultfd", "acct", "syslog",
}  # fmt: skip


async def test_clone3_answers_enosys_so_libc_falls_back(filtered, unfiltered):
    assert filtered["clone3"] == "ENOSYS"
    assert unfiltered["clone3"] != "ENOSYS"


@pytest.mark.parametrize("name", REFUSED_FAMILIES)
async def test_refused_socket_families(filtered, name):
    assert filtered[name] == "EAFNOSUPPORT"


async def test_netlink_refused_only_by_the_filter(filtered, unfiltered):
    assert filtered["socket_netlink"] == "EAFNOSUPPORT"
    assert unfiltered["socket_netlink"] == "ok"


@pytest.mark.parametrize("name", ["socket_unix", "socket_inet", "socket_inet6"])
async def test_allowed_socket_families(filtered, name):
    assert filtered[name] == "ok"
