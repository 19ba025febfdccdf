"""A ToolOrchestra checkout layout over the shared ToolScale files, and a tiny domain of the test's own.

The shared copy keeps upstream's domain code at ../shared/benchmarks/toolscale/upstream_code/
training/rollout/tau2/domains/<domain>/ (a checkout's path) but the data at
../shared/benchmarks/toolscale/domains/<domain>/{db.json, policy.md}, where a checkout has
data/tau2/domains/<domain>/: `shared_checkout` links both into one checkout folder.
`add_lighthouse` writes a domain no upstream code has (a tools.py, a data_model.py and a db.json
written here), as a user's checkout has domains the shared copy lacks.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "benchmarks" / "toolscale"
SHARED_CODE = SHARED / "upstream_code" / "training" / "rollout" / "tau2" / "domains"
SHARED_DATA = SHARED / "domains"


def shared_domains() -> list[str]:
    return sorted(p.name for p in SHARED_CODE.iterdir() if (p / "tools.py").is_file())


def shared_checkout(root: Path) -> Path:
    """`root` laid out as a checkout: training/rollout/tau2/domains/<d> and data/tau2/domains/<d>
    linked to the shared copy (skips the test where ../shared is absent)."""
    if not SHARED_CODE.is_dir() or not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED} absent (upstream's ToolScale code and databases, ../shared/benchmarks/toolscale)")
    code, data = root / "training" / "rollout" / "tau2" / "domains", root / "data" / "tau2" / "domains"
    code.mkdir(parents=True)
    data.mkdir(parents=True)
    for name in shared_domains():
        (code / name).symlink_to(SHARED_CODE / name, target_is_directory=True)
        (data / name).symlink_to(SHARED_DATA / name, target_is_directory=True)
    return root


LIGHTHOUSE_MODEL = '''
from pydantic import BaseModel
from tau2.environment.db import DB


class Lamp(BaseModel):
    lamp_id: str
    status: str


class LighthouseDB(DB):
    lamps: dict[str, Lamp]
'''

LIGHTHOUSE_TOOLS = '''
from tau2.domains.NAME.data_model import LighthouseDB
from tau2.environment.toolkit import ToolKitBase, ToolType, is_tool


class Helper:
    """Not a toolkit: the loader must pick the ToolKitBase subclass."""


class LighthouseTools(ToolKitBase):
    db: LighthouseDB

    def __init__(self, db: LighthouseDB) -> None:
        super().__init__(db)

    @is_tool(ToolType.READ)
    def get_lamp(self, lamp_id: str) -> dict:
        """Get a lamp.

        Args:
            lamp_id: The lamp's id.
        """
        if lamp_id not in self.db.lamps:
            raise ValueError("Lamp not found")
        return self.db.lamps[lamp_id].model_dump()

    @is_tool(ToolType.WRITE)
    def switch_lamp(self, lamp_id: str, status: str) -> dict:
        """Switch a lamp on or off.

        Args:
            lamp_id: The lamp's id.
            status: on or off.
        """
        from tau2.domains.NAME.data_model import Lamp   # imported at call time, as upstream's tools do
        lamp = self.db.lamps[lamp_id]
        self.db.lamps[lamp_id] = Lamp(lamp_id=lamp.lamp_id, status=status)
        return self.db.lamps[lamp_id].model_dump()
'''


def add_lighthouse(root: Path, name: str = "lighthouse") -> Path:
    """Add a lighthouse domain called `name` (code and data) to the checkout at `root`; returns `root`.
    A module has one source per process: each test file gives its own name."""
    code = root / "training" / "rollout" / "tau2" / "domains" / name
    data = root / "data" / "tau2" / "domains" / name
    code.mkdir(parents=True)
    data.mkdir(parents=True)
    (code / "data_model.py").write_text(LIGHTHOUSE_MODEL)
    (code / "tools.py").write_text(LIGHTHOUSE_TOOLS.replace("NAME", name))
    (data / "db.json").write_text(json.dumps({"lamps": {"L1": {"lamp_id": "L1", "status": "off"},
                                                        "L2": {"lamp_id": "L2", "status": "on"}}}))
    (data / "policy.md").write_text("# Lighthouse policy\nSwitch lamps only when the keeper asks.\n")
    return root


def bank_case(checkout: Path) -> dict:
    """Values of the shared bank database a ToolScale-style record needs: a client with a unique
    email and one of its active cards, and another client's active card."""
    from collections import Counter

    db = json.loads((checkout / "data" / "tau2" / "domains" / "bank" / "db.json").read_text())
    emails = Counter(c["contact"]["email"].lower() for c in db["clients"].values())
    client = next(c for c in db["clients"].values()
                  if emails[c["contact"]["email"].lower()] == 1 and any(k["status"] == "active" for k in c["cards"].values()))
    card = next(cid for cid, k in client["cards"].items() if k["status"] == "active")
    other = next(cid for c in db["clients"].values() if c is not client
                 for cid, k in c["cards"].items() if k["status"] == "active")
    return {"client_id": client["client_id"], "email": client["contact"]["email"], "card_id": card,
            "other_card_id": other}


def toolscale_record(rid: str, domain: str, reason: str, actions: list[tuple[str, dict]]) -> dict:
    """One task in the released ToolScale schema (the hub card's fields)."""
    return {"id": rid, "description": {"purpose": "", "relevant_policies": None, "notes": None},
            "user_scenario": {"persona": None, "instructions": {
                "task_instructions": "Answer only what the agent asks.", "reason_for_call": reason,
                "known_info": "You are the account holder.", "unknown_info": None, "domain": domain}},
            "initial_state": None,
            "evaluation_criteria": {"actions": [{"action_id": f"{rid}_{i}", "name": n, "arguments": a}
                                                for i, (n, a) in enumerate(actions)],
                                    "communicate_info": [], "nl_assertions": None}}


class Script:
    """Every model of a tau2 conversation, scripted: the user simulator (no tools) asks once and
    stops at the agent's next message; the orchestrator (tools) makes `calls` one per turn, each
    after the previous one's result, then says it is done."""

    def __init__(self, calls: list[tuple[str, dict]]):
        self.calls = calls

    def __call__(self, model, messages, tools=None, **kw):
        from orchestrator.records import LLMResponse, ToolCall, Usage

        usage = Usage(100, 10)
        if not tools:
            said = sum(m["role"] == "assistant" for m in messages)      # the user's own, roles flipped
            return LLMResponse(model, "I need help with my bank card." if said == 0 else "Thanks. ###STOP###", [],
                               usage)
        done = sum((m.get("content") or "").startswith("<tool_response>") for m in messages)
        if done < len(self.calls):
            return LLMResponse(model, "", [ToolCall(*self.calls[done])], usage)
        return LLMResponse(model, "<think>ok</think><message>Done, anything else?</message>", [], usage)
