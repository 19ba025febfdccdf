"""One gateway to every LLM: `get_llm_response(model, messages, ...) -> LLMResponse`.

    from LLM_CALL import get_llm_response
    r = get_llm_response("smollm2-135m", [{"role": "user", "content": "2+2?"}], temperature=0)
    r.text, r.tool_calls, r.usage, r.cost, r.latency, r.endpoint

Model names resolve through configs/models.yaml ($TOOLORCHESTRA_MODELS); vLLM replicas
through endpoints.json ($TOOLORCHESTRA_ENDPOINTS); keys through the environment
variables the registry names.  Swap a backend by editing the registry, not code.
See docs/gateway.md.
"""
from orchestrator.gateway import (GatewayConfigError, LLMCallError, ProviderRejected, UnknownModelError,
                                  get_llm_response, load_registry)
from orchestrator.records import LLMResponse, ToolCall, Usage

__all__ = ["get_llm_response", "LLMCallError", "ProviderRejected", "GatewayConfigError", "UnknownModelError",
           "load_registry", "LLMResponse", "ToolCall", "Usage"]
