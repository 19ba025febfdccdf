import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.catalog import CatalogError, load_catalog, parse_catalog
from orchestrator.records import Usage

REPO = Path(__file__).resolve().parents[2]


def shipped():
    return json.loads((REPO / "tools.json").read_text())


def test_shipped_catalog_matches_paper_table():
    cat = load_catalog()
    assert {t.name for t in cat.tools_for("qa")} == {"search", "enhance_reasoning", "answer"}
    assert cat.tool("search").aliases["search-3"].model == "Qwen3-32B"
    assert cat.tool("answer").aliases["answer-1"].latency_s == 96
    assert cat.price("gpt-5").input == 1.25 and cat.price("gpt-5").output == 10.0
    assert cat.price("Qwen2.5-Math-7B-Instruct").output == 0.2
    assert len(cat.aliases) == 15
    # every alias in the local profile is served by a model that runs here
    assert {cat.served_model(s.model, "local") for t in cat.tools for s in t.aliases.values()} == {"smollm2-135m"}


def test_llm_cost_by_hand():
    cat = load_catalog()
    # gpt-5: 1.25 $/1M in, 10 $/1M out -> 2000*1.25e-6 + 500*10e-6 = 0.0025 + 0.005
    assert cat.llm_cost("gpt-5", Usage(2000, 500)) == pytest.approx(0.0075, abs=1e-12)
    # Qwen3-8B orchestrator: 0.2/0.2 -> (10_000 + 1_000) * 0.2e-6 = 0.0022
    assert cat.llm_cost("Qwen3-8B", Usage(10_000, 1_000)) == pytest.approx(0.0022, abs=1e-12)
    assert cat.code_cost(10) == pytest.approx(0.000083)
    assert cat.search_cost(web_searches=2, pages=3) == pytest.approx(0.026)


@pytest.mark.parametrize("mutate, expected", [
    (lambda d: d["tools"][0]["aliases"]["search-1"].pop("model"), "$.tools[0].aliases.search-1.model: Field required"),
    (lambda d: d["tools"][1]["aliases"]["reasoner-2"].update(model="nope"), "tools[1].aliases.reasoner-2.model: 'nope' has no entry in 'prices'"),
    (lambda d: d["prices"]["gpt-5"].update(input=-1), "$.prices.gpt-5.input"),
    (lambda d: d["tools"][2].update(kind="magic"), "$.tools[2].kind"),
    (lambda d: d["tools"][2]["aliases"].update({"search-1": {"model": "gpt-5", "latency_s": 1}}), "alias also used by tool 'search'"),
    (lambda d: d["profiles"]["local"].update({"gpt-6": "x"}), "profiles.local.gpt-6: unknown model"),
    (lambda d: d["tools"][0].update(colour="red"), "$.tools[0].colour: unknown key 'colour'"),
])
def test_broken_catalog_one_line_error(mutate, expected):
    data = shipped()
    mutate(data)
    with pytest.raises(CatalogError) as err:
        parse_catalog(data, "my_tools.json")
    msg = str(err.value)
    assert msg.startswith("my_tools.json: ") and expected in msg and "\n" not in msg
    assert err.value.problems == [msg]


def test_openai_tools_show_prices_and_enum():
    schema = load_catalog().openai_tools("qa")
    search = next(t for t in schema if t["function"]["name"] == "search")["function"]
    model = search["parameters"]["properties"]["model"]
    assert model["enum"] == ["search-1", "search-2", "search-3"]
    assert "search-2 | $0.25 | $2 | 16s" in model["description"]


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "orchestrator.catalog", *args], capture_output=True, text=True, cwd=REPO)


def test_cli_ok_and_bad(tmp_path):
    ok = run_cli("tools.json")
    assert ok.returncode == 0 and "4 tools" in ok.stdout and "15 aliases" in ok.stdout
    bad = tmp_path / "tools.json"
    bad.write_text('{"tools": [], ')
    res = run_cli(str(bad))
    assert res.returncode == 1
    assert res.stderr.strip().count("\n") == 0 and "invalid JSON" in res.stderr and str(bad) in res.stderr


@pytest.mark.parametrize("mutate, expected", [
    # a misspelled key names the misspelling and the key meant, not the "missing" right key
    (lambda d: d["tools"][0]["aliases"]["search-1"].update(
        latancy_s=d["tools"][0]["aliases"]["search-1"].pop("latency_s")),
     "$.tools[0].aliases.search-1.latancy_s: unknown key 'latancy_s' (did you mean 'latency_s'?)"),
    (lambda d: d.update(profils=d.pop("profiles")), "$.profils: unknown key 'profils' (did you mean 'profiles'?)"),
    (lambda d: d["prices"].update({"gpt5": d["prices"].pop("gpt-5")}), "(did you mean 'gpt5'?)"),
    # a price written as a string is refused, not coerced
    (lambda d: d["prices"]["gpt-5"].update(input="1.25"),
     "$.prices.gpt-5.input: '1.25' is a string; write the number without quotes"),
    (lambda d: d["fees"].update(web_search="0.01"), "$.fees.web_search: '0.01' is a string"),
])
def test_catalog_mistakes_named(mutate, expected):
    data = shipped()
    mutate(data)
    with pytest.raises(CatalogError) as err:
        parse_catalog(data, "my_tools.json")
    lines = str(err.value).split("\n")
    assert lines == err.value.problems and all(line.startswith("my_tools.json: $") for line in lines)
    assert any(expected in line for line in lines)
    # a renamed model is named wherever it is used (every alias, every profile), all in one report
    if "gpt5" in expected:
        assert len(lines) == 4 + 3, lines       # 4 aliases + the local, local-vllm and open profiles
    else:
        assert len(lines) == 1, lines


def test_integer_prices_still_accepted():
    data = shipped()
    data["prices"]["gpt-5"]["input"] = 1
    assert parse_catalog(data).price("gpt-5").input == 1.0


def test_profile_targets_must_be_registry_models():
    from orchestrator.gateway.registry import load_registry

    known = load_registry().models
    load_catalog().check_served(known)                 # the shipped catalog: every profile resolves
    data = shipped()
    data["profiles"]["local"]["gpt-5"] = "smollm-135m"
    cat = parse_catalog(data)
    with pytest.raises(CatalogError, match=r"profiles\.local\.gpt-5: 'smollm-135m' is not a model in the model "
                                           r"registry.*did you mean 'smollm2-135m'"):
        cat.check_served(known)
    # a new model behind an alias that the local profile does not map
    data = shipped()
    data["prices"]["new-model"] = {"input": 1, "output": 1}
    data["tools"][0]["aliases"]["search-4"] = {"model": "new-model", "latency_s": 1}
    for profile in (None, "local"):
        with pytest.raises(CatalogError, match=r"\$\.profiles\.local: no mapping for \['new-model'\], used by tool aliases"):
            parse_catalog(data).check_served(known, profile)
    # a profile in use must serve every alias: an empty profile serves each model as itself
    data = shipped()
    data["prices"]["my-api-model"] = {"input": 1, "output": 1}
    data["tools"][0]["aliases"]["search-4"] = {"model": "my-api-model", "latency_s": 1}
    data["profiles"]["local"]["my-api-model"] = "smollm2-135m"
    data["profiles"]["local-vllm"]["my-api-model"] = "smollm2-135m-vllm"
    cat = parse_catalog(data)
    cat.check_served(known, "local")
    with pytest.raises(CatalogError, match=r"profile 'paper' cannot serve alias search-4 \(model 'my-api-model'\)"):
        cat.check_served(known, "paper")


def test_cli_checks_profiles_against_registry(tmp_path):
    data = shipped()
    data["profiles"]["local"]["gpt-5"] = "no-such-model"
    bad = tmp_path / "tools.json"
    bad.write_text(json.dumps(data))
    res = run_cli(str(bad))
    assert res.returncode == 1 and "$.profiles.local.gpt-5: 'no-such-model' is not a model" in res.stderr


def test_a_catalog_that_is_not_utf8_is_one_line_naming_file_place_and_fix(tmp_path):
    bad = tmp_path / "tools.json"
    bad.write_bytes('{"tools": [], "note": "caf\xe9"}'.encode("latin-1"))
    res = run_cli(str(bad))
    assert res.returncode == 1 and res.stderr.strip().count("\n") == 0, res.stderr
    assert f"{bad}: line 1 column 27: not UTF-8 text (byte 0xe9); save it as UTF-8" in res.stderr


def _extending(tmp_path, **fields) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    base = json.loads((REPO / "tools.json").read_text())
    (tmp_path / "base.json").write_text(json.dumps(base))
    own = {"version": 1, "tools": base["tools"][:1], **fields}
    path = tmp_path / "sub" / "child.json"
    path.parent.mkdir()
    path.write_text(json.dumps({**own, "extends": "../base.json"}))
    return path


def test_a_catalog_that_extends_another_takes_its_prices_and_fees_and_may_only_add(tmp_path):
    base = load_catalog()
    child = load_catalog(_extending(tmp_path, prices={"new-model": {"input": 1.0, "output": 2.0}}))
    assert child.prices["new-model"].input == 1.0
    assert {m: (p.input, p.output) for m, p in child.prices.items() if m != "new-model"} == \
        {m: (p.input, p.output) for m, p in base.prices.items()}
    assert child.fees == base.fees and child.orchestrator_price_model == base.orchestrator_price_model
    with pytest.raises(CatalogError, match=r"\$\.prices: \['gpt-5'\] priced in \.\./base\.json already"):
        load_catalog(_extending(tmp_path / "r", prices={"gpt-5": {"input": 9.0, "output": 9.0}}))


@pytest.mark.parametrize("extends, expected", [("missing.json", "is not a file"), ("child.json", "a cycle"),
                                               (3, "expected the path of a catalog")])
def test_a_bad_extends_is_one_error_naming_the_file(tmp_path, extends, expected):
    path = tmp_path / "child.json"
    path.write_text(json.dumps({"version": 1, "extends": extends, "tools": []}))
    with pytest.raises(CatalogError, match=rf"child\.json: \$\.extends: .*{expected}"):
        load_catalog(path)


def test_the_unseen_example_catalog_repeats_no_price_of_tools_json():
    raw = json.loads((REPO / "configs" / "catalogs" / "unseen_example.json").read_text())
    assert raw["extends"] == "../../tools.json" and "prices" not in raw
    unseen = load_catalog(REPO / "configs" / "catalogs" / "unseen_example.json")
    assert unseen.prices.keys() == load_catalog().prices.keys()
