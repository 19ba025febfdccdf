"""Moved: `make quickstart-loop` now runs `python -m evaluation.quickstart_loop` (same flags).

The loop demo imports evaluation and training code, which the core package must not."""
import sys

if __name__ == "__main__":
    print("error: `python -m orchestrator.quickstart` is now `python -m evaluation.quickstart_loop` "
          "(same flags; `make quickstart-loop` runs it)", file=sys.stderr)
    sys.exit(2)
raise ImportError("orchestrator.quickstart moved to evaluation.quickstart_loop")
