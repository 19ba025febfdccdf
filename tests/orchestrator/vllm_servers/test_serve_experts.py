"""The `open` profile's serving plan (orchestrator/vllm_servers/experts.py): every model open-weight and
vllm-served, each server's flags from its configs/models.yaml `serve:` block, GPUs that add up;
the endpoints file the launcher's servers write; the gateway fitting requests to a served window."""
from __future__ import annotations

import json
import shlex
import sys
import textwrap
import threading
import time

import pytest

from orchestrator.vllm_servers import experts as serve_experts
from orchestrator.gateway.errors import GatewayConfigError
from orchestrator.gateway.registry import load_registry, parse_registry

PARSERS = {"gpt-oss-120b": "openai", "gpt-oss-20b": "openai", "Llama-3.3-70B-Instruct": "llama3_json",
           "Qwen3-32B": "hermes", "Qwen2.5-Coder-32B-Instruct": "hermes", "Qwen2.5-Math-72B-Instruct": "hermes",
           "Qwen2.5-Math-7B-Instruct": "hermes", "Qwen3-8B": "hermes"}


def _dry_run(capsys, *args) -> dict[str, tuple[list[str], list[str]]]:
    """key -> (GPU ids, vLLM argv) from the printed commands."""
    assert serve_experts.main(["--profile", "open", "--dry-run", *args]) == 0
    out = {}
    for line in capsys.readouterr().out.splitlines():
        if line.startswith("CUDA_VISIBLE_DEVICES="):
            env, *argv = shlex.split(line)
            key = argv[argv.index("--register-as") + 1]
            out[key] = (env.split("=", 1)[1].split(","), argv[argv.index("--") + 1:])
    return out


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_open_profile_uses_only_open_weight_models_served_by_vllm():
    registry = load_registry()
    models = serve_experts.profile_models("open")
    assert set(models) == set(PARSERS)                       # every alias's model, the judge, the user, Qwen3-8B
    for name in models:
        assert registry.models[name].backend == "vllm" and registry.models[name].serve is not None, name
        assert registry.models[name].key_env() is None      # no proprietary key anywhere


def test_paper_profile_lists_its_api_models_as_not_served_here(capsys):
    assert serve_experts.main(["--profile", "paper", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "# not served here: gpt-5 (backend openai" in out and "--register-as gpt-oss-120b" not in out


def test_each_server_gets_its_declared_parser_window_and_template(capsys):
    registry = load_registry()
    plan = _dry_run(capsys)
    assert set(plan) == set(PARSERS)
    for key, (_, argv) in plan.items():
        entry = registry.models[key]
        assert _flag(argv, "--tool-call-parser") == PARSERS[key]
        assert "--enable-auto-tool-choice" in argv
        assert int(_flag(argv, "--max-model-len")) == entry.rules.context_window == entry.serve.max_model_len
        assert argv[argv.index("--served-model-name") + 1] == entry.model      # the id the gateway sends
    assert int(_flag(plan["Qwen3-32B"][1], "--max-model-len")) == 32768
    assert _flag(plan["Llama-3.3-70B-Instruct"][1], "--chat-template") == \
        "MISSING:examples/tool_chat_template_llama3.1_json.jinja"     # not in this repository: a vLLM file
    assert all("--chat-template" not in argv for k, (_, argv) in plan.items() if k != "Llama-3.3-70B-Instruct")


def test_gpus_add_up_to_eight_without_overcommitting_any(capsys):
    registry = load_registry()
    plan = _dry_run(capsys)
    share: dict[str, float] = {}
    owners: dict[str, list[str]] = {}
    for key, (gpus, argv) in plan.items():
        tp = int(_flag(argv, "--tensor-parallel-size"))
        assert len(gpus) == tp == registry.models[key].serve.tensor_parallel_size
        for g in gpus:
            share[g] = share.get(g, 0.0) + float(_flag(argv, "--gpu-memory-utilization"))
            owners.setdefault(g, []).append(key)
    assert set(share) <= {str(i) for i in range(8)}
    assert all(s <= 0.95 + 1e-9 for s in share.values()), share
    for key, (gpus, _) in plan.items():                      # tensor-parallel servers own their GPUs
        if len(gpus) > 1:
            assert all(owners[g] == [key] for g in gpus), owners
    assert len(share) == 8                                   # the set needs the whole node


def test_a_set_that_does_not_fit_fails_before_starting_anything(capsys):
    assert serve_experts.main(["--profile", "open", "--dry-run", "--gpus", "6"]) == 2
    err = capsys.readouterr().err
    assert "does not fit on 6 GPU(s)" in err and "configs/models.yaml" in err


def test_gpu_ids_from_slurm_are_used_as_given(capsys):
    plan = _dry_run(capsys, "--gpus", "4,5,6,7,0,1,2,3")
    assert plan["Llama-3.3-70B-Instruct"][0] == ["4", "5"]


def test_serve_block_is_the_one_declaration_of_the_window():
    def entry(**fields):
        return parse_registry({"models": {"m": {"backend": "vllm", "model": "org/m", **fields}}}, "models.yaml")

    served = {"max_model_len": 4096, "tool_call_parser": "hermes"}
    assert entry(serve=served).models["m"].rules.context_window == 4096
    with pytest.raises(GatewayConfigError, match=r"models\.yaml: models\.m\.serve: max_model_len 4096 differs "
                                                 r"from rules\.context_window 8192"):
        entry(serve=served, rules={"context_window": 8192})
    with pytest.raises(GatewayConfigError, match=r"models\.m\.serve: only backend 'vllm'"):
        parse_registry({"models": {"m": {"backend": "openai", "serve": served}}}, "models.yaml")
    with pytest.raises(GatewayConfigError, match="tensor-parallel server"):
        entry(serve={**served, "tensor_parallel_size": 2, "gpu_memory_utilization": 0.4})


FAKE_SERVER = textwrap.dedent("""
    # Stands in for `python -m orchestrator.vllm_servers.launch`: registers as it does, unregisters on TERM.
    import signal, sys, time
    from orchestrator.gateway.endpoints import register_endpoint, unregister_endpoint
    from orchestrator.vllm_servers.launch import max_model_len_arg
    a = sys.argv[1:]
    opt = lambda n: a[a.index(n) + 1]
    url = f"http://{opt('--host')}:{opt('--port')}/v1"
    time.sleep(0.2)
    register_endpoint(opt('--endpoints-file'), opt('--register-as'), url,
                      max_model_len=max_model_len_arg(a[a.index('--') + 1:]))
    signal.signal(signal.SIGTERM, lambda *_: (unregister_endpoint(opt('--endpoints-file'), opt('--register-as'), url),
                                              sys.exit(0)))
    while True:
        time.sleep(1)
""")


def test_launcher_writes_the_endpoints_file_the_gateway_reads_and_cleans_it(tmp_path):
    fake = tmp_path / "fake_server.py"
    fake.write_text(FAKE_SERVER)
    endpoints = tmp_path / "endpoints.json"
    plan = serve_experts.make_plan(serve_experts.profile_models("open"), [str(i) for i in range(8)], base_port=9100)
    commands = []
    for s in plan.servers:
        argv = serve_experts.server_command(s, endpoints_file=endpoints, host="node7", log_dir=tmp_path)
        commands.append([sys.executable, str(fake), *argv[3:]])      # same arguments, the fake in vLLM's place
    stop = threading.Event()
    result = {}
    thread = threading.Thread(target=lambda: result.update(rc=serve_experts.run_plan(
        plan, commands, endpoints, "node7", ready_timeout=120, stop=stop)))
    thread.start()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(json.loads(endpoints.read_text() if endpoints.exists() else "{}")) < 8:
            time.sleep(0.2)
        data = json.loads(endpoints.read_text())
        registry = load_registry()
        assert set(data) == set(PARSERS)
        ports = set()
        for key, replicas in data.items():
            (replica,) = replicas
            assert replica["base_url"].startswith("http://node7:91") and replica["base_url"].endswith("/v1")
            assert replica["max_model_len"] == registry.models[key].rules.context_window
            ports.add(replica["base_url"])
        assert len(ports) == 8
        # what the gateway resolves for a model is this file's entry
        entry = registry.models["gpt-oss-120b"].model_copy(update={"endpoints_file": str(endpoints)})
        from orchestrator.gateway.backends import make_backend
        assert make_backend("gpt-oss-120b", entry).pool.urls == [data["gpt-oss-120b"][0]["base_url"]]
    finally:
        stop.set()
        thread.join(120)
    assert result["rc"] == 143 and json.loads(endpoints.read_text()) == {}


def test_gateway_fits_requests_to_the_smaller_served_window(tmp_path):
    from orchestrator.gateway.backends import make_backend
    from orchestrator.gateway.call import served_rules

    endpoints = tmp_path / "endpoints.json"
    entry = parse_registry({"models": {"m": {"backend": "vllm", "model": "org/m", "endpoints_file": str(endpoints),
                                             "serve": {"max_model_len": 32768, "tool_call_parser": "hermes"}}}},
                           "models.yaml").models["m"]
    endpoints.write_text(json.dumps({"m": [{"base_url": "http://h:1/v1", "max_model_len": 8192}]}))
    assert served_rules(entry, make_backend("m", entry)).context_window == 8192     # a stand-in's window
    endpoints2 = tmp_path / "e2.json"
    endpoints2.write_text(json.dumps({"m": [{"base_url": "http://h:2/v1", "max_model_len": 65536},
                                            {"base_url": "http://h:3/v1"}]}))
    entry2 = entry.model_copy(update={"endpoints_file": str(endpoints2)})
    assert served_rules(entry2, make_backend("m", entry2)).context_window == 32768  # the declared one is smaller


def test_stand_in_serves_every_model_id_with_its_own_window(capsys):
    assert serve_experts.main(["--profile", "open", "--dry-run", "--stand-in", "embedded:smollm2-135m"]) == 0
    out = capsys.readouterr().out
    args = shlex.split(out.split("embedded:smollm2-135m ", 1)[1].split(";")[0])
    names = args[args.index("--served-model-name") + 1:args.index("--max-model-len")]
    registry = load_registry()
    assert {registry.models[k].model for k in PARSERS} <= set(names) and set(PARSERS) <= set(names)
    assert _flag(args, "--max-model-len") == "8192"        # SmolLM2's config.json max_position_embeddings


def test_dry_run_never_prints_a_chat_template_path_that_does_not_exist(tmp_path, capsys):
    """It printed <repo>/examples/tool_chat_template_llama3.1_json.jinja, a file the repository does
    not have.  Now a missing template shows as MISSING:<declared path> with a line saying a real start
    refuses and how to fix it; with --chat-template-dir holding the file, its real path."""
    assert serve_experts.main(["--profile", "open", "--dry-run"]) == 0
    out = capsys.readouterr().out
    commands = [shlex.split(line) for line in out.splitlines() if line.startswith("CUDA_VISIBLE_DEVICES=")]
    templates = [argv[argv.index("--chat-template") + 1] for argv in commands if "--chat-template" in argv]
    assert templates == ["MISSING:examples/tool_chat_template_llama3.1_json.jinja"]
    assert "# a real start refuses: no such chat template file (Llama-3.3-70B-Instruct: " in out
    assert "pass --chat-template-dir" in out
    assert serve_experts.main(["--profile", "open", "--endpoints-file", str(tmp_path / "e.json")]) == 2   # real start
    err = capsys.readouterr().err
    assert err.startswith("error: no such chat template file") and err.count("\n") == 1
    assert not (tmp_path / "logs").exists() and not (tmp_path / "e.json").exists()   # nothing started or written
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "tool_chat_template_llama3.1_json.jinja").write_text("{{ messages }}")
    plan = _dry_run(capsys, "--chat-template-dir", str(tmp_path))
    assert _flag(plan["Llama-3.3-70B-Instruct"][1], "--chat-template") == \
        str(tmp_path / "examples" / "tool_chat_template_llama3.1_json.jinja")


def test_a_misspelt_profile_is_one_line_with_the_closest_name():
    import subprocess
    from pathlib import Path

    proc = subprocess.run([sys.executable, "-m", "orchestrator.vllm_servers.experts", "--profile", "opne", "--dry-run"],
                          cwd=Path(__file__).resolve().parents[3], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("error: profile ") and "opne.yaml: no such file; did you mean 'open'?" in proc.stderr


def test_ports_past_65535_are_one_line_before_anything_starts(capsys):
    assert serve_experts.main(["--profile", "open", "--dry-run", "--base-port", "65530"]) == 2
    assert capsys.readouterr().err == ("error: --base-port 65530: not a TCP port (its servers would use "
                                       "65530-65537); give 1-65535\n")
