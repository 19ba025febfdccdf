"""Moved to orchestrator/engines/ (one generation stack for training, evaluation and the gateway's
transformers backend).  `training.engines` and every `training.engines.<module>` stay importable and
are the very same objects (each submodule here aliases its orchestrator/engines/ module)."""
from orchestrator.engines import ENGINES, make_engine

__all__ = ["ENGINES", "make_engine"]
