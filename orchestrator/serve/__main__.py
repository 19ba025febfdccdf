"""`python -m orchestrator.serve`: the orchestrator server (orchestrator/serve/cli.py `main`)."""
import sys

from orchestrator.serve.cli import main

sys.exit(main())
