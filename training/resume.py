"""Old name of the Slurm babysitter, kept so `python -m training.resume ...` still works:
the module is now `training.babysitter` (`python -m training.babysitter --config ...`)."""
from __future__ import annotations

import sys

from training.babysitter import main

if __name__ == "__main__":
    print("note: `python -m training.resume` is now `python -m training.babysitter` (same flags)", file=sys.stderr)
    sys.exit(main())
