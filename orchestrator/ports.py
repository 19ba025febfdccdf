"""A port (and host) given on a command line, checked before anything starts.

    check_port(args.port, "--port", host=args.host)    # PortError: one line naming the flag and the fix

`--port 99999` used to reach the server's start-up after minutes of loading and hang there (or
end in a traceback); a port already taken failed the same late way.  Every server CLI that takes a
port checks it first: retrieval.server, retrieval.shards route, orchestrator.vllm_servers.launch,
orchestrator.vllm_servers.experts (--base-port), evaluation.mock_backend.
"""
from __future__ import annotations

import errno
import socket

MAX_PORT = 65535


class PortError(ValueError):
    """A port or host that cannot be served on; the message is one line naming the flag and the fix."""


def check_port(port: int, flag: str = "--port", *, host: str | None = None, zero_ok: bool = True,
               last: int | None = None) -> None:
    """Raise PortError unless `port` is a TCP port (0: a free one, when `zero_ok`) and, with `host`,
    one this process can listen on there now (not taken, the host resolves to an address of this
    machine).  `last`: the highest port a range starting at `port` uses (serve_experts' servers)."""
    low = 0 if zero_ok else 1
    top = port if last is None else last
    if not low <= port <= MAX_PORT or top > MAX_PORT:
        span = f" (its servers would use {port}-{top})" if last is not None and last != port else ""
        raise PortError(f"{flag} {port}: not a TCP port{span}; give {low}-{MAX_PORT}"
                        + (" (0: a free one)" if zero_ok else ""))
    if host is None or port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise PortError(f"--host {host}: cannot be resolved ({exc.strerror}); give an address of this machine "
                        f"(127.0.0.1, 0.0.0.0)") from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as the servers bind (TIME_WAIT is fine)
        try:
            sock.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortError(f"{flag} {port}: {host}:{port} is already in use; stop what listens there or give "
                                f"another {flag}" + (" (0: a free one)" if zero_ok else "")) from None
            if exc.errno == errno.EACCES:
                raise PortError(f"{flag} {port}: not allowed to listen on it (ports below 1024 need root); give "
                                f"one above 1023") from None
            raise PortError(f"--host {host}: cannot listen there ({exc.strerror}); give an address of this "
                            f"machine (127.0.0.1, 0.0.0.0)") from None
