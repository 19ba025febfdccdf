"""The retrieval tests' tiny corpus and a JSONL writer (the one-thread fixture is in conftest.py)."""
from __future__ import annotations

import json
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
