"""The LLM gateway: one call (`get_llm_response`) to any model named in configs/models.yaml.

Public entry for users: the top-level module `LLM_CALL`.  Layout:
  registry.py   configs/models.yaml -> validated ModelEntry per model name
  endpoints.py  pools of OpenAI-compatible replicas from an endpoints JSON file
  rules.py      what each provider accepts (registry `rules:`), applied before sending
  retry.py      deadlines per attempt and per call, bounded retries honouring Retry-After (tenacity)
  backends/     openai_compat (vLLM / OpenAI / Azure), anthropic, transformers (in-process)
  replies.py    the shape a 2xx reply must have (pydantic) and the usage it may report
  call.py       get_llm_response: ties them together, adds cost and latency

Importing the gateway installs log redaction (orchestrator/redaction.py): every log record of
the process is masked of keys, whoever writes it.
"""
from orchestrator.gateway.call import get_llm_response
from orchestrator.gateway.errors import GatewayConfigError, LLMCallError, ProviderRejected, UnknownModelError
from orchestrator.gateway.registry import ModelEntry, load_registry
from orchestrator.redaction import install_log_redaction

install_log_redaction()

__all__ = ["get_llm_response", "LLMCallError", "ProviderRejected", "GatewayConfigError", "UnknownModelError",
           "ModelEntry", "load_registry"]
