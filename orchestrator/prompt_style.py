"""The orchestrator's chat for one turn in the prompt set's style: ours (context.build_messages)
or upstream's (upstream_prompts.build_messages_upstream, selected by the paper profile)."""
from __future__ import annotations

from orchestrator.context import Budgets, EpisodeState, Prompts, TokenCounter, build_messages
from orchestrator.upstream_prompts import build_messages_upstream


def turn_messages(state: EpisodeState, prompts: Prompts, budgets: Budgets,
                  counter: TokenCounter) -> list[dict[str, str]]:
    """System + user message for this turn, built the way `prompts.style` says."""
    if prompts.style.startswith("upstream"):
        return build_messages_upstream(state, prompts, budgets, counter)
    return build_messages(state, prompts, budgets, counter)
