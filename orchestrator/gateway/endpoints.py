"""The gateway's pool of OpenAI-compatible replicas: the endpoint registry in retrieval/endpoints.py
(the bottom layer, because the retrieval server registers itself in the same file), re-exported
under the gateway's name."""
from retrieval.endpoints import (EndpointPool, Replica, pool_for, read_endpoints, register_endpoint,
                                 unregister_endpoint)

__all__ = ["EndpointPool", "Replica", "pool_for", "read_endpoints", "register_endpoint", "unregister_endpoint"]
