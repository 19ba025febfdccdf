"""The static decoder's compile modes (orchestrator/engines/compile_regions.py): regional (the
decoder layer compiled once), whole (the forward as one graph, the mode before) and none give the
same tokens and log-probs, and regional compiles a bounded number of graphs however the shape
buckets change.  torch.compile runs with the "eager" backend: dynamo traces, guards and counts
graphs exactly as with Inductor, without Inductor's minutes of C++ compiling on the CPU (the
Inductor numbers and outputs: bench/compile_cold.py, docs/benchmarks.md "cold compile")."""
from __future__ import annotations

import pytest
import torch
from test_engines import folders, prompts_of  # noqa: F401 (fixtures)

from orchestrator.engines.interface import SamplingParams

# (rows, prompt width, max_tokens) calls crossing shape buckets: rows 1 -> 2, 2, 3 -> 4, 5 -> 8;
# cache lengths 16 .. 48 (len_multiple 8); attention spans growing every 8 steps
CALLS = [(3, 5, 9), (2, 9, 14), (1, 4, 6), (5, 7, 20), (4, 12, 30)]


def _decoder(folder, mode: str, **kw):
    from orchestrator.engines import make_engine
    from orchestrator.engines.hf_static import StaticDecoder

    engine = make_engine("hf", folder, device="cpu", seed=0, decode="static", max_batch=8)
    engine._static = StaticDecoder(engine, compile=mode, check_every=4, len_multiple=8, **kw)
    engine._static.backend = "eager"
    return engine


def _run(engine, temperature: float = 1.0):
    out = []
    for k, (rows, width, tokens) in enumerate(CALLS):
        prompts = [[(7 * k + 3 * i + j) % 900 + 10 for j in range(max(1, width - i))] for i in range(rows)]
        out.append(engine.generate(prompts, SamplingParams(temperature=temperature, max_tokens=tokens, seed=k)))
    return out


@pytest.fixture
def fresh_dynamo():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    yield counters
    torch._dynamo.reset()


@pytest.mark.slow
@pytest.mark.parametrize("fuse", [False, True])
def test_regional_and_whole_compiles_give_the_eager_tokens_and_logprobs(folders, fresh_dynamo, fuse):  # noqa: F811
    """Same sampled tokens (seeded rows) and log-probs within float32 rounding in every mode, with
    and without the fused q/k/v and gate/up projections inside the compiled layer."""
    results = {mode: _run(_decoder(folders["A"], mode, fuse_projections=fuse)) for mode in ("none", "regional", "whole")}
    for mode in ("regional", "whole"):
        for call, base in zip(results[mode], results["none"]):
            assert [g.token_ids for g in call] == [g.token_ids for g in base], mode
            for g, b in zip(call, base):
                assert torch.allclose(torch.tensor(g.logprobs), torch.tensor(b.logprobs), atol=1e-5), mode


def test_regional_compiles_two_graphs_for_every_shape_bucket_and_restores_the_layers(folders, fresh_dynamo):  # noqa: F811
    """Stated bound: one graph for the decoder layer (every layer, every rows / cache length /
    span bucket) and one for the sampler per (temperature, top_p); all in the first call."""
    engine = _decoder(folders["A"], "regional")
    graphs = []
    for k, (rows, width, tokens) in enumerate(CALLS):
        prompts = [[(3 * i + j) % 900 + 10 for j in range(max(1, width - i))] for i in range(rows)]
        engine.generate(prompts, SamplingParams(temperature=1.0, max_tokens=tokens, seed=k))
        graphs.append(fresh_dynamo["stats"]["unique_graphs"])
    assert graphs == [2] * len(CALLS)
    assert not any("forward" in vars(layer) for layer in engine.model.model.layers)    # the model is as it was
    engine.generate(prompts_of(engine.tokenizer), SamplingParams(temperature=0, max_tokens=5))
    assert fresh_dynamo["stats"]["unique_graphs"] == 3                                 # greedy: its own sampler


def test_the_whole_forward_compiles_again_when_shapes_change(folders, fresh_dynamo):  # noqa: F811
    """The counter sees recompiles: over the same calls the mode before regional compiles its
    (whole-model) graph again after the first call, when a size first changes."""
    engine, graphs = _decoder(folders["A"], "whole"), []
    for k, (rows, width, tokens) in enumerate(CALLS):
        prompts = [[(3 * i + j) % 900 + 10 for j in range(max(1, width - i))] for i in range(rows)]
        engine.generate(prompts, SamplingParams(temperature=1.0, max_tokens=tokens, seed=k))
        graphs.append(fresh_dynamo["stats"]["unique_graphs"])
    assert graphs[0] == 1 and graphs[-1] > graphs[0]


def test_compile_mode_is_checked_and_reaches_the_decoder(folders):  # noqa: F811
    from orchestrator.engines import make_engine
    from orchestrator.engines.hf_static import StaticDecoder

    engine = make_engine("hf", folders["A"], device="cpu", decode="static")
    assert engine._static.compile == "none"                                            # CPU default: eager
    assert StaticDecoder(engine, compile=True).compile == "regional"
    assert StaticDecoder(engine, compile="whole").compile == "whole"
    with pytest.raises(ValueError, match=r"HFEngine\(static_compile\)='fast': choose from regional, whole, none"):
        make_engine("hf", folders["A"], device="cpu", decode="static", static_compile="fast")
    with pytest.raises(ValueError, match=r"StaticDecoder\(compile\)='all'"):
        StaticDecoder(engine, compile="all")
