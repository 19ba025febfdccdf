"""Handlers that misbehave, one way each (tests/orchestrator/tools/test_bad_tools.py)."""
import asyncio
import threading

NEVER = threading.Event()


def raises(x: int) -> int:
    """Raise whatever it is given."""
    raise ValueError(f"cannot handle {x}")


def huge(x: int) -> str:
    """Return 10 MB."""
    return "y" * 10_000_000


def not_json(x: int):
    """Return a set: not JSON."""
    return {x, x + 1}


def hangs(x: int) -> int:
    """Never return (until the test process ends)."""
    NEVER.wait(600)
    return x


async def hangs_async(x: int) -> int:
    """Never return, asynchronously."""
    await asyncio.sleep(600)
    return x


async def doubles_async(x: int) -> int:
    """Double x, asynchronously."""
    await asyncio.sleep(0)
    return 2 * x


def sandboxed_square(x: int) -> int:
    """Square x (run inside the sandbox)."""
    return x * x


def sandboxed_hang(x: int) -> int:
    """Spin for ever inside the sandbox."""
    while True:
        pass
