"""What the two tau2 episodes share: episodes/tau2_agent.py (tau2's user simulator) and
episodes/tau2_solo.py (no user).  Tool names, upstream's stand-in texts, the `call_expert` schema
in either text, the suffix a model's last message gets, and the ONE way a conversation is fitted
into the orchestrator's context.

Which variant runs is the profile's `tau2.<use>` section (orchestrator/settings.py `Tau2Settings`),
carried by the runtime (`runtime.section("tau2")`):

- `expert_text`: "ours" renders `call_expert` from the catalog (tools.json's text, an `enum` of the
  task's aliases, the price table of its prices) and rewrites the policy's human-transfer lines
  with a line filter; "upstream" renders upstream's literal schema and rewrites the policy by
  upstream's literal passage replacement (orchestrator/prompts/upstream/tau2/), with upstream's
  evaluation format line ("  You are dedicated to provide the best service. Wrap thinking ...").
  "upstream-train" is upstream's *training* copy of the same file
  (training/rollout/tau2/utils/llm_utils.py = `tt`; orchestrator/prompts/upstream/tau2/train/):
  its own `call_expert` wording (`tt`:230-250), the same policy passages (`tt`:103-182), the format
  line without "You are dedicated ..." (`tt`:389), and the orchestrator's reply read as training
  reads it (generation_quick3.py:2129-2144, 714-716; `delivered_train`): the <message> part, or
  upstream's wait message when the reply has no <message> or has a <tool_call>.
- `agent_chat_experts`: experts that read the agent's own chat, cut (`reads_agent_chat`; upstream's
  evaluation copy: Qwen3, `tu`:501-504).
- `rewrite_models`: which agent models get the call-expert policy and the format line at all
  (`rewrites`; upstream's evaluation and training copies: names containing qwen, train or
  huggingface; a GPT-5 or Claude agent keeps tau2's prompt as it is).
- `expert_suffix`: model -> text appended to the last message that model reads, as upstream does
  for every GPT-5 agent or expert call (llm_utils.py:388-389).
- `context`: "per_output" (ours) cuts each tool output to `budgets.doc_tokens` and replaces the
  oldest outputs by a marker until the chat fits `budgets.context_tokens`; "cut_middle_turns"
  keeps whole messages and drops the middle ones the way upstream's `cut_middle_turns` does, to
  upstream's 23000 tokens (`CUT_TOKENS`; or `context_tokens` when smaller) minus the tools' own
  tokens: evaluation llm_utils.py:248-277, 446-448; training generation_quick3.py:1196-1198, the
  same literal, where the prompt cap (`rollout.context_tokens`, 24000) is larger.
"""
from __future__ import annotations

import json
import random
import re
from functools import lru_cache
from pathlib import Path

from orchestrator.context import Budgets, TokenCounter

EXPERT_TOOL = "call_expert"
TRANSFER_TOOL = "transfer_to_human_agents"   # tau2's; call_expert replaces it (PAPER.md §1)
DONE_TOOL = "done"                           # the solo episode's end
WAIT = "Wait a minute, I will take it very soon"   # upstream's stand-in for an empty agent message
OMITTED = "[earlier output omitted]"
TOOL_RESPONSE = "<tool_response>"
EXPERT_POLICY = (   # upstream's EXPERT_POLICT (llm_utils.py:177), verbatim
    "You should transfer the user to an expert if you are not confident about how to reply or which tool to "
    "use. To transfer, first make a tool call to call_expert, and then choose an expert based on the task "
    "difficulty, i.e. strong expert on tricky task, and weaker expert on simpler task. Think carefully about "
    "whether you are confident to meet user expectation, or call an appropriate expert based on both expert "
    "cost and performance.")
AGENT_FORMAT = ("  You are dedicated to provide the best service. Wrap thinking process between <think> </think>, "
                "message between <message> </message> and the tool call between <tool_call> </tool_call> .")
UPSTREAM_DIR = Path(__file__).resolve().parents[1] / "prompts" / "upstream" / "tau2"
EXPERT_TEXTS = ("ours", "upstream", "upstream-train")
_UPSTREAM_VARIANTS = {"upstream": "", "upstream-train": "train/"}   # folder of each variant's own texts
CUT_TOKENS = 23000   # upstream's cut_middle_turns budget: llm_utils.py:448 and generation_quick3.py:1198
CONTEXTS = ("per_output", "cut_middle_turns")
_TRANSFER_LINE = re.compile(r"transfer_to_human_agents|\b(transfer|escalat)\w*\b[^.\n]*\bhuman agent", re.I)


# ---- the expert text --------------------------------------------------------------------------
@lru_cache(maxsize=None)
def _upstream(name: str):
    return json.loads((UPSTREAM_DIR / name).read_text(encoding="utf-8"))


def expert_schema(catalog, tool, text: str = "ours") -> dict:
    """`call_expert`'s function schema: the catalog's rendering of `tool` (ours) or upstream's
    literal `extra_tool` (evaluation llm_utils.py:226-246: its prose and price table, a free-string
    argument; upstream-train: the training copy's, `tt`:230-250, another `expert` description)."""
    if text in _UPSTREAM_VARIANTS:
        name = _UPSTREAM_VARIANTS[text] + "call_expert.json"
        return json.loads(json.dumps(_upstream(name)))                  # a copy: callers may not share it
    if text != "ours":
        raise ValueError(f"expert_text {text!r}: choose one of {EXPERT_TEXTS}")
    return catalog.openai_tools(tools=[tool])[0]


def expert_policy(domain_policy: str, text: str = "ours") -> str:
    """The domain policy with its human-transfer passages replaced by the call-expert policy.

    ours: every line that mentions the transfer is dropped and EXPERT_POLICY put once where the
    first one was (at the end when none does).  upstream: each of upstream's POLICY_STRINGS
    (llm_utils.py:98-175) replaced wherever it occurs (to_litellm_messages, 380-385); a policy
    none of them matches keeps its text, as upstream's does.  upstream-train: the same passages and
    text (the training copy's `tt`:103-182 are equal to the evaluation copy's)."""
    if text in _UPSTREAM_VARIANTS:
        for passage in _upstream("policy_strings.json"):
            domain_policy = domain_policy.replace(passage, EXPERT_POLICY)
        return domain_policy
    out, replaced = [], False
    for line in domain_policy.split("\n"):
        if _TRANSFER_LINE.search(line):
            if not replaced:
                out.append(EXPERT_POLICY)
                replaced = True
            continue
        out.append(line)
    if not replaced:
        out += ["", EXPERT_POLICY]
    return "\n".join(out)


def agent_format(text: str = "ours") -> str:
    """The line the orchestrator's system prompt ends with: upstream's evaluation line (llm_utils.py:385;
    ours and upstream) or its training line, without "You are dedicated ..." (`tt`:389)."""
    if text == "upstream-train":
        return _upstream("train/agent_format.json")
    if text not in EXPERT_TEXTS:
        raise ValueError(f"expert_text {text!r}: choose one of {EXPERT_TEXTS}")
    return AGENT_FORMAT


def delivered_train(text: str) -> str:
    """What upstream's training delivers of an orchestrator reply without a tool call (
    generation_quick3.py:2129-2144, then 714-716): a reply with `<tool_call>` yields only its calls
    (none parsed: nothing); else the text after the last `<message>` up to the next `</message>`
    (or the end), as written; no `<message>`: nothing.  Nothing becomes upstream's wait message
    (the caller's)."""
    if "<tool_call>" in text or "<message>" not in text:
        return ""
    return text.split("<message>")[-1].split("</message>")[0]


def rewrites(settings, model: str | None) -> bool:
    """Whether the agent `model` gets the call-expert policy and the format line in its system
    prompt: always, unless the settings' `rewrite_models` lists name substrings (upstream: qwen,
    train, huggingface, `tu`:380 and `tt`:384) and none is in the name (any case)."""
    subs = getattr(settings, "rewrite_models", None)
    return subs is None or any(s.lower() in (model or "").lower() for s in subs)


def reads_agent_chat(settings, model: str) -> bool:
    """Whether the expert `model` reads the agent's own chat (its system prompt as sent, cut by
    `cut_middle_turns`) instead of tau2's prompt and the plain conversation: a name in the settings'
    `agent_chat_experts` (upstream's evaluation copy: a Qwen3 expert, `tu`:501-504 sends it
    `litellm_messages`, the orchestrator's; its GPT-5 path reads the plain one, `tu`:496-498)."""
    return any(s.lower() in model.lower() for s in getattr(settings, "agent_chat_experts", None) or [])


def suffix_for(settings, *models: str | None) -> str:
    """The `expert_suffix` text of the first of `models` the settings name ("" when none)."""
    table = getattr(settings, "expert_suffix", None) or {}
    return next((table[m] for m in models if m and m in table), "")


def with_suffix(messages: list[dict], suffix: str) -> list[dict]:
    """`messages` with `suffix` appended to the last one's content (a copy; unchanged when empty)."""
    if not suffix or not messages:
        return messages
    last = dict(messages[-1])
    last["content"] = (last.get("content") or "") + suffix
    return [*messages[:-1], last]


def kept_calls(calls: list, cap: int) -> list:
    """The tool calls one agent message keeps: the first `cap` (upstream: 6, llm_utils.py:588-598)."""
    return list(calls or [])[:cap]


# ---- fitting the conversation into the context -----------------------------------------------
def tool_response(output: str, context: str, budgets: Budgets, counter: TokenCounter) -> str:
    """A tool result as the policy reads it (Qwen's rendering): `<tool_response>` in a user message;
    per_output cuts it to `budgets.doc_tokens`, cut_middle_turns keeps it whole (upstream does)."""
    if context == "per_output":
        output = counter.head(output, budgets.doc_tokens)
    elif context != "cut_middle_turns":
        raise ValueError(f"context {context!r}: choose one of {CONTEXTS}")
    return f"{TOOL_RESPONSE}\n{output}\n</tool_response>"


def omit_oldest_outputs(messages: list[dict], budget: int, counter: TokenCounter) -> list[dict]:
    """Ours: the oldest tool results (user messages that start with `<tool_response>`) replaced by
    OMITTED until the whole chat fits `budget` tokens; everything else always stays.  A copy."""
    messages = [dict(m) for m in messages]
    total = sum(counter.count(m["content"] or "") for m in messages)
    for m in messages:
        if total <= budget:
            break
        if m["role"] == "user" and (m["content"] or "").startswith(TOOL_RESPONSE):
            total -= counter.count(m["content"]) - counter.count(OMITTED)
            m["content"] = OMITTED
    return messages


_MARKER_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789~!@#$%^&*()-=_+[]"   # upstream's


def _markers(text: str) -> tuple[str, str]:
    """Two 15-character strings of upstream's alphabet that `text` does not contain (seeded: the
    same chat is cut the same way every time; upstream draws them at random)."""
    rng = random.Random(0)
    while True:
        start, end = ("".join(rng.choice(_MARKER_CHARS) for _ in range(15)) for _ in range(2))
        if start != end and start not in text and end not in text:
            return start, end


def cut_middle_turns(messages: list[dict], max_length: int, counter: TokenCounter) -> list[dict]:
    """Upstream's `cut_middle_turns` (llm_utils.py:248-277): the messages written one after the
    other (`str(message)`, each followed by a marker carrying its index) and counted in tokens;
    within `max_length` they are all kept.  Else the first max_length // 2 tokens and the last
    ceil(max_length / 2) are read: kept are the messages up to the last one whose marker starts in
    that head (its text is complete there) and from the first one whose marker ends in that tail.

    Upstream finds those messages by parsing the marker text cut out of the head and tail, so a
    boundary inside a marker raises (after 10 tries with new random markers) or, inside the index,
    gives a shortened index; here the markers are located by position, which gives the message
    upstream means.  As upstream's, a first message longer than half the budget is an error."""
    start, end = _markers("".join(str(m) for m in messages))
    joined, starts, ends, at = [], [], [], 0
    for i, m in enumerate(messages):
        piece = f"{m}{start}{i}{end}"
        starts.append(at + len(str(m)))            # where message i's marker begins ...
        ends.append(at + len(piece))               # ... and ends
        joined.append(piece)
        at += len(piece)
    joined = "".join(joined)
    if counter.count(joined) <= max_length:
        return messages
    head = len(counter.head(joined, max_length // 2))
    tail = len(joined) - len(counter.tail(joined, -(-max_length // 2)))
    first = max((i for i, s in enumerate(starts) if s + len(start) <= head), default=None)
    last = min(i for i, e in enumerate(ends) if e - len(end) >= tail)
    if first is None:
        raise ValueError(f"cut_middle_turns: the first message is longer than half of the {max_length}-token "
                         f"budget; upstream fails here too")
    return messages[:first + 1] + messages[last:]


def fit_context(messages: list[dict], context: str, budgets: Budgets, counter: TokenCounter,
                tools: list[dict]) -> list[dict]:
    """The chat the policy is sent: ours (`omit_oldest_outputs` to `context_tokens`) or upstream's
    (`cut_middle_turns` to upstream's 23000 tokens, or `context_tokens` when smaller, minus the
    tokens of `str(tools)`: evaluation llm_utils.py:447-448, training generation_quick3.py:1196-1198)."""
    if context == "cut_middle_turns":
        budget = min(budgets.context_tokens, CUT_TOKENS)
        return cut_middle_turns(messages, budget - counter.count(str(tools)), counter)
    if context != "per_output":
        raise ValueError(f"context {context!r}: choose one of {CONTEXTS}")
    return omit_oldest_outputs(messages, budgets.context_tokens, counter)
