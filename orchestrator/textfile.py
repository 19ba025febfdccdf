"""Reading a configuration or data file as UTF-8 text, with a one-line error when it is not.

`Path.read_text()` on a file saved in Latin-1 or UTF-16 raises a bare `UnicodeDecodeError`
(a long traceback at start-up); `read_utf8` raises `NotUTF8` naming the file, the first bad
byte's line and column, and the fix.  Callers re-raise it as their own configuration error.
"""
from __future__ import annotations

from pathlib import Path


class NotUTF8(ValueError):
    """A file that is not UTF-8 text; the message is one line: file, place, fix."""


def utf8_problem(path: str | Path, exc: UnicodeDecodeError, line_offset: int = 0) -> str:
    """'PATH: line L column C: not UTF-8 text (byte 0xe9); save it as UTF-8 (...)'.

    `exc.object` is the bytes that failed to decode; `line_offset` is the number of lines
    before them (for a file decoded line by line)."""
    data, at = exc.object, exc.start
    line = line_offset + data.count(b"\n", 0, at) + 1
    column = at - (data.rfind(b"\n", 0, at) + 1) + 1
    return (f"{path}: line {line} column {column}: not UTF-8 text (byte 0x{data[at]:02x}); save it as UTF-8, "
            f"e.g. iconv -f latin1 -t utf-8 {path} > {Path(path).name}.utf8")


def read_utf8(path: str | Path) -> str:
    """The file's text; NotUTF8 when it is not UTF-8 (OSError as `Path.read_text` raises it)."""
    return decode_utf8(Path(path).read_bytes(), path)


def decode_utf8(data: bytes, path: str | Path) -> str:
    """`data` (read from `path`) as text; NotUTF8 naming `path` when it is not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NotUTF8(utf8_problem(path, exc)) from None
