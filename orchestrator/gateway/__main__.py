"""`python -m orchestrator.gateway [PATH]`: validate a model registry and list its models."""
from orchestrator.gateway.registry import main

raise SystemExit(main())
