"""Moved to orchestrator/vllm_servers/experts.py (issue 46); this name goes in the next release."""
from orchestrator.moved import forward

forward(__name__, "orchestrator.vllm_servers.experts")
