"""Moved to orchestrator/engines/batcher.py (one generation stack for training and the gateway's
transformers backend); this name stays so existing imports keep working: it is that module."""
import sys

from orchestrator.engines import batcher as _moved

sys.modules[__name__] = _moved
