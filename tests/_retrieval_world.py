"""The retrieval tests' tiny corpus and a JSONL writer (the one-thread fixture is in conftest.py)."""
from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from pathlib import Path

TINY = [
    {"id": "paris", "contents": "Paris is the capital and largest city of France, on the river Seine."},
    {"id": "tokyo", "contents": "Tokyo is the capital of Japan and the most populous metropolitan area in the world."},
    {"id": "python", "contents": "Python is a high-level programming language created by Guido van Rossum in 1991."},
    {"id": "photosynthesis", "contents": "Photosynthesis converts light energy into chemical energy stored in glucose in plants."},
    {"id": "everest", "contents": "Mount Everest is Earth's highest mountain above sea level, in the Himalayas."},
    {"id": "jazz", "contents": "Jazz is a music genre that originated in New Orleans in the late 19th century."},
    {"id": "volcano", "contents": "Volcano."},
]


def write_jsonl(path: Path, rows: list) -> Path:
    """One line per row: dicts as JSON, strings as they are (to write malformed lines)."""
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


@contextmanager
def live(app, config=None):
    """Run `app` under a real uvicorn on a free localhost port (or under `config`, a uvicorn.Config
    for port 0); yields the base URL."""
    import uvicorn
    server = uvicorn.Server(config or uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)


def dead_url() -> str:
    """A URL nothing listens on: a port that was free a moment ago (connection refused)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"
