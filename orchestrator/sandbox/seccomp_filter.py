"""The seccomp filter bubblewrap installs before the sandboxed program starts.

Built with libseccomp (through `pyseccomp`, a ctypes binding of the Debian package
`libseccomp2`) and handed to `bwrap --seccomp FD` as compiled BPF. Default allow, with a
deny list modelled on Docker's default profile (moby/profiles `seccomp/default.json`: the
calls it allows only with CAP_SYS_ADMIN and friends) plus the ones that let a run escape
its memory or keyring limits:

- `memfd_create`, `memfd_secret`: anonymous files hold memory outside RLIMIT_AS and
  outside the capped /tmp, /dev/shm (3 GiB held by one run before this filter).
- `keyctl`, `add_key`, `request_key`: kernel keyrings outlive the run (per uid) and the
  caller's session keyring is inherited; with these denied no keyring is reachable.
- `unshare`, `setns`, and `clone` with any CLONE_NEW* flag: no nested namespaces (a nested
  user namespace could mount an uncapped tmpfs). `clone3` answers ENOSYS so that glibc
  falls back to `clone`, whose flags the filter can read (Docker does the same).
- mount family, `pivot_root`, `chroot`; `ptrace`, `process_vm_*`; `bpf`, `perf_event_open`,
  `userfaultfd`, `io_uring_*`, module/kexec/reboot/swap/quota/acct/syslog, handle-based opens.

Denied calls fail with EPERM (ENOSYS for clone3); the program sees an OSError, not a kill.
Other architectures (i386 `int 0x80`, x32) are killed by libseccomp's bad-arch action.
"""
from __future__ import annotations

import errno
import functools
import os
import tempfile

DENIED = (
    "memfd_create", "memfd_secret",
    "keyctl", "add_key", "request_key",
    "unshare", "setns",
    "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsconfig",
    "fsmount", "fspick", "mount_setattr",
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp",
    "bpf", "perf_event_open", "userfaultfd", "fanotify_init",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot",
    "swapon", "swapoff", "acct", "quotactl", "quotactl_fd", "syslog", "lookup_dcookie",
    "open_by_handle_at", "name_to_handle_at", "uselib", "vhangup", "nfsservctl",
)
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME (linux/sched.h)
CLONE_NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000,
                         0x40000000, 0x00000080)


class SeccompUnavailable(RuntimeError):
    """libseccomp or its Python binding is missing (the message says how to install them)."""


@functools.lru_cache(maxsize=1)
def filter_bpf() -> bytes:
    """The compiled filter for this machine's architecture (cached per process)."""
    try:
        import pyseccomp as seccomp
    except (ImportError, OSError, RuntimeError) as exc:   # OSError/RuntimeError: libseccomp.so missing
        raise SeccompUnavailable("no seccomp filter: the Python package 'pyseccomp' or the library "
                                 f"libseccomp2 is missing ({exc}); pip install pyseccomp and "
                                 "apt-get install libseccomp2") from exc
    filt = seccomp.SyscallFilter(seccomp.ALLOW)
    deny = seccomp.ERRNO(errno.EPERM)
    for name in DENIED:
        try:
            filt.add_rule(deny, name)
        except (OSError, ValueError):   # a call this architecture or libseccomp does not know
            continue
    for flag in CLONE_NAMESPACE_FLAGS:
        filt.add_rule(deny, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    try:
        filt.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    except (OSError, ValueError):
        pass
    with tempfile.TemporaryFile() as out:
        filt.export_bpf(out)
        out.seek(0)
        return out.read()


def bpf_fd() -> int:
    """A pipe's read end holding the filter, for `bwrap --seccomp FD` (the caller closes it)."""
    data = filter_bpf()
    if len(data) >= 65536:
        raise SeccompUnavailable(f"seccomp filter of {len(data)} bytes does not fit a pipe")
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, data)   # a few hundred bytes: well under the pipe's buffer
    finally:
        os.close(write_fd)
    return read_fd
