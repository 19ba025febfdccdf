"""Kind `expert` (tau2's call_expert): the alias's expert reads the conversation and proposes the
next action.  Function-calling episodes call it through `ToolRuntime.propose` (orchestrator/
episodes/tau2_agent.py, tau2_solo.py); the QA episode does not offer it."""
from __future__ import annotations

from typing import Literal

from orchestrator.tools.registry import AliasKind, register
from orchestrator.tools.spec import AliasToolSpec


class Spec(AliasToolSpec):
    kind: Literal["expert"]


@register
class Expert(AliasKind):
    name = "expert"
    spec = Spec
