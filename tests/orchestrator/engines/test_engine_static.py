"""HFEngine's static-cache decoding (orchestrator/engines/hf_static.py), run eagerly on the CPU
(`decode="static"`; on CUDA the same steps are compiled and replayed as CUDA graphs:
bench/gpu_decode.py).  Checked against transformers' `generate` and forward passes, and
against the step-by-step loop, on the tiny model of tests/orchestrator/engines/test_engines.py."""
from __future__ import annotations

import pytest
import torch
from test_engines import folders, forward_logprobs, hf_greedy, prompts_of, reference  # noqa: F401 (fixtures)

from orchestrator.engines.interface import SamplingParams


@pytest.fixture
def static(folders):  # noqa: F811
    from orchestrator.engines import make_engine

    engine = make_engine("hf", folders["A"], device="cpu", seed=0, decode="static", max_batch=8)
    engine._static.check_every = 4          # exercise the periodic host check with short generations
    engine._static.len_multiple = 8         # and attention spans that grow every few steps
    return engine


def test_static_greedy_equals_transformers_generate_in_a_padded_batch(static, reference):  # noqa: F811
    prompts = prompts_of(static.tokenizer)                   # 3 rows -> 4 (a spare row), widths differ
    gens = static.generate(prompts, SamplingParams(temperature=0, max_tokens=13))
    assert static._static.shape(prompts, SamplingParams(max_tokens=13))[0] == 4
    for prompt, gen in zip(prompts, gens):
        assert gen.token_ids == hf_greedy(reference["A"], prompt, 13)
        assert gen.finish_reason == "length" and len(gen.logprobs) == 13
        assert gen.text == static.tokenizer.decode(gen.token_ids, skip_special_tokens=True)


def test_prefill_in_column_chunks_gives_the_same_tokens_and_logprobs(static, reference):  # noqa: F811
    """A prompt wider than prefill_tokens / rows is prefilled in chunks of len_multiple columns,
    each attending to the cache the earlier chunks wrote: the same greedy tokens as transformers'
    generate and the same log-probs as one whole-prompt prefill."""
    prompts = prompts_of(static.tokenizer)                   # 4 rows (one spare), widths differ
    params = SamplingParams(temperature=0.7, max_tokens=9, seed=5)
    static._static.len_multiple = 2
    whole = static.generate(prompts, params)
    static._static.prefill_tokens = 4 * 2                     # 2 columns a chunk at 4 rows
    rows, _ = static._static.shape(prompts, params)
    width = max(map(len, prompts))
    chunks = static._static.prefill_chunks(rows, width)
    assert len(chunks) > 1 and chunks[0] == (0, 2) and chunks[-1][1] == width
    chunked = static.generate(prompts, params)
    assert [g.token_ids for g in chunked] == [g.token_ids for g in whole]
    torch.testing.assert_close([g.logprobs for g in chunked], [g.logprobs for g in whole], atol=1e-5, rtol=0)
    for prompt, gen in zip(prompts, static.generate(prompts, SamplingParams(temperature=0, max_tokens=11))):
        assert gen.token_ids == hf_greedy(reference["A"], prompt, 11)


@pytest.mark.parametrize("temperature, top_p", [(0.7, 1.0), (1.0, 0.8)])
def test_static_logprobs_are_those_of_the_sampling_distribution(static, reference, temperature, top_p):  # noqa: F811
    prompts = prompts_of(static.tokenizer)
    gens = static.generate(prompts, SamplingParams(temperature=temperature, top_p=top_p, max_tokens=10, seed=3))
    for prompt, gen in zip(prompts, gens):
        ref = forward_logprobs(reference["A"], prompt, gen.token_ids, temperature)
        if top_p == 1.0:
            assert torch.allclose(torch.tensor(gen.logprobs), ref, atol=5e-4)
        else:   # renormalised over the nucleus: never below the full distribution's log-prob
            assert all(a >= b - 1e-4 for a, b in zip(gen.logprobs, ref.tolist()))


def test_static_seeded_rows_do_not_depend_on_the_batch_and_the_same_call_repeats(static):
    prompts = prompts_of(static.tokenizer)
    params = SamplingParams(temperature=1.0, max_tokens=10, seed=11)
    batched = static.generate(prompts, params)
    assert [g.token_ids for g in static.generate(prompts, params)] == [g.token_ids for g in batched]
    for i, prompt in enumerate(prompts):
        alone = static.generate([prompt], SamplingParams(temperature=1.0, max_tokens=10, seed=11 + i))[0]
        assert alone.token_ids == batched[i].token_ids
    assert len({tuple(g.token_ids) for g in static.generate([prompts[0]] * 4, params)}) > 1   # rows differ


def test_static_stop_string_and_eos_end_a_row_where_the_loop_would(static, folders):  # noqa: F811
    from orchestrator.engines import make_engine

    loop = make_engine("hf", folders["A"], device="cpu", seed=0, decode="eager")
    prompts = prompts_of(static.tokenizer)
    free = static.generate(prompts, SamplingParams(temperature=0, max_tokens=12))
    stop = static.tokenizer.decode(free[0].token_ids[4:6])          # the greedy text holds it: a stop hit
    params = SamplingParams(temperature=0, max_tokens=12, stop=[stop])
    got, want = static.generate(prompts, params), loop.generate(prompts, params)
    assert [(g.token_ids, g.finish_reason) for g in got] == [(g.token_ids, g.finish_reason) for g in want]
    assert got[0].finish_reason == "stop" and len(got[0].token_ids) < 12 and stop in got[0].text
    static.eos_ids = loop.eos_ids = [free[1].token_ids[3]]          # an EOS id the greedy row reaches
    got, want = static.generate(prompts, params), loop.generate(prompts, params)
    assert [(g.token_ids, g.finish_reason) for g in got] == [(g.token_ids, g.finish_reason) for g in want]


def test_constrained_requests_take_the_step_by_step_loop_and_say_so_once(static, caplog):
    static._static.unsupported.clear()
    with caplog.at_level("INFO", logger="orchestrator.engines.hf_static"):
        for _ in range(3):
            assert not static._static.supports([[1, 2]], SamplingParams(choices=["yes", "no"]))
    said = [r.getMessage() for r in caplog.records if "not used" in r.getMessage()]
    assert len(said) == 1 and "constrained decoding (choices)" in said[0]
    assert static._static.unsupported == {"constrained decoding (choices)": 3}
    assert static._static.supports([[1, 2]], SamplingParams())
    with pytest.raises(ValueError, match="decode='fast'"):
        from orchestrator.engines.hf import HFEngine
        HFEngine(static.model, static.tokenizer, device="cpu", decode="fast")


def _cache_bytes(decoder, rows: int, length: int) -> int:
    """K and V of every layer for rows x length slots, float32 (the CPU engine's dtype)."""
    return 2 * decoder.layers * rows * decoder.kv_heads * length * decoder.head_dim * 4


def test_a_shape_whose_cache_does_not_fit_takes_the_loop_with_one_warning_naming_the_setting(
        static, reference, monkeypatch, caplog):  # noqa: F811
    """On CUDA a shape's KV cache may take memory_fraction of the free GPU memory (0.25 by
    default); a larger one is served by the step-by-step loop, warned once per shape and counted."""
    decoder = static._static
    prompts, params = prompts_of(static.tokenizer), SamplingParams(temperature=0, max_tokens=13)
    rows, length = decoder.shape(prompts, params)
    need = _cache_bytes(decoder, rows, length)
    free = int(need / 0.4)                                   # 0.25 of it: too little; 0.6: enough
    monkeypatch.setattr(decoder, "_free_bytes", lambda: free)
    monkeypatch.setattr(decoder, "generate", lambda *a, **k: pytest.fail("the static path ran"))
    with caplog.at_level("WARNING", logger="orchestrator.engines.hf_static"):
        for _ in range(2):
            for prompt, gen in zip(prompts, static.generate(prompts, params)):
                assert gen.token_ids == hf_greedy(reference["A"], prompt, 13)
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and decoder.fallbacks == {(rows, length): 2}
    assert f"shape {rows} rows x {length} slots" in warned[0] and f"needs {need:,} bytes" in warned[0]
    assert f"of the {free:,} bytes free allows ({int(0.25 * free):,})" in warned[0]
    assert "engine.static_memory_fraction" in warned[0] and "at least 0.40" in warned[0]
    caplog.clear()
    with caplog.at_level("WARNING", logger="orchestrator.engines.hf_static"):
        static.generate(prompts, SamplingParams(temperature=0, max_tokens=40))   # a longer shape: warned too
    assert len(caplog.records) == 1 and len(decoder.fallbacks) == 2
    decoder.memory_fraction = 0.6
    assert decoder.supports(prompts, params)


def test_static_memory_fraction_reaches_the_decoder_and_is_checked(folders):  # noqa: F811
    from orchestrator.engines import make_engine

    engine = make_engine("hf", folders["A"], device="cpu", decode="static", static_memory_fraction=0.6)
    assert engine._static.memory_fraction == 0.6
    for bad in (0, 1.5, -0.1):
        with pytest.raises(ValueError, match=r"HFEngine\(static_memory_fraction\): must be a number in \(0, 1\]"):
            make_engine("hf", folders["A"], device="cpu", decode="eager", static_memory_fraction=bad)


def test_fused_projections_give_the_same_greedy_tokens_and_restore_the_model(folders, reference):  # noqa: F811
    from orchestrator.engines import make_engine
    from orchestrator.engines.hf_static import StaticDecoder

    engine = make_engine("hf", folders["A"], device="cpu", seed=0, decode="static", max_batch=8)
    engine._static = StaticDecoder(engine, fuse_projections=True, attention="matmul", steps_per_graph=3,
                                   check_every=6, len_multiple=8)
    layers = dict(engine.model.named_modules())
    prompts = prompts_of(engine.tokenizer)
    gens = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=13))
    assert len(engine._static._groups) == 2 * engine.model.config.num_hidden_layers   # attention + MLP per layer
    for prompt, gen in zip(prompts, gens):
        assert gen.token_ids == hf_greedy(reference["A"], prompt, 13)
    assert dict(engine.model.named_modules()).keys() == layers.keys()
    assert all(dict(engine.model.named_modules())[k] is m for k, m in layers.items())


def test_fused_projection_stand_ins_are_the_original_layers_when_gradients_are_on():
    from orchestrator.engines.decode_kernels import FusedGroup

    owner = torch.nn.Module()
    owner.a, owner.b = torch.nn.Linear(4, 3, bias=False), torch.nn.Linear(4, 5, bias=False)
    group, x = FusedGroup(owner, ("a", "b")), torch.randn(2, 4)
    with torch.no_grad():
        fused = [m(x) for m in group.members]
        torch.testing.assert_close(fused, [owner.a(x), owner.b(x)])
    out = group.members[1](x)                                     # a training forward: the layer itself
    out.sum().backward()
    assert owner.b.weight.grad is not None and group.parts is None


def _softmax_attention(q, k, v, keep, scale):
    """Plain grouped-query softmax attention of one query token over the first S = keep's slots."""
    b, heads, _, d = q.shape
    kv, span = k.shape[1], keep.shape[-1]
    scores = q.reshape(b, kv, heads // kv, d) @ k[:, :, :span].transpose(-1, -2) * scale
    scores = scores.masked_fill(~keep.reshape(b, 1, 1, span), float("-inf"))
    return (scores.softmax(-1) @ v[:, :, :span]).reshape(b, 1, heads, d)


@pytest.mark.parametrize("heads,kv,span,splits,block", [(4, 2, 130, 1, 64), (4, 2, 130, 3, 64), (16, 8, 256, 2, 64),
                                                        (6, 2, 70, 4, 16), (8, 8, 37, 5, 8), (4, 1, 200, None, 64)])
def test_split_kv_reference_equals_softmax_attention(heads, kv, span, splits, block):
    """The split-KV kernels' arithmetic (orchestrator/engines/split_kv_attention.py: blocks, online
    softmax per split, reduction across splits), written in torch, is softmax attention."""
    from orchestrator.engines.split_kv_attention import (
        split_decode_attention,
        split_decode_attention_reference,
    )

    torch.manual_seed(0)
    b, d, length = 3, 32, 260
    q, k, v = torch.randn(b, heads, 1, d), torch.randn(b, kv, length, d), torch.randn(b, kv, length, d)
    keep = torch.zeros(b, 1, 1, length, dtype=torch.bool)
    keep[..., 5:] = True
    keep[0, ..., :min(100, span - 1)] = False   # a row whose first split(s) are wholly masked
    keep[1, ..., span - 1] = True
    keep = keep[..., :span]
    want = _softmax_attention(q, k, v, keep, d ** -0.5)
    got = split_decode_attention_reference(q, k, v, keep, d ** -0.5, splits, block)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(split_decode_attention(q, k, v, keep), want, rtol=1e-5, atol=1e-5)   # CPU: reference


def test_split_kv_splits_cover_the_span():
    from orchestrator.engines.split_kv_attention import _chunk, num_splits

    assert num_splits(64, 8, 256) == 1 and num_splits(8, 8, 256) == 4 and num_splits(1, 8, 384) == 6 and num_splits(512, 8, 256) == 1
    for span in (1, 63, 64, 65, 256, 384, 1000):
        for splits in (1, 2, 3, 7):
            chunk = _chunk(span, splits, 64)
            assert chunk % 64 == 0 and chunk * splits >= span and chunk * (splits - 1) < span + 64 * splits


def test_split_kv_attention_gives_the_same_greedy_tokens(folders, reference):  # noqa: F811
    from orchestrator.engines import make_engine
    from orchestrator.engines.hf_static import StaticDecoder

    engine = make_engine("hf", folders["A"], device="cpu", seed=0, decode="static", max_batch=8)
    engine._static = StaticDecoder(engine, attention="triton", steps_per_graph=3, check_every=6, len_multiple=8)
    prompts = prompts_of(engine.tokenizer)
    for prompt, gen in zip(prompts, engine.generate(prompts, SamplingParams(temperature=0, max_tokens=13))):
        assert gen.token_ids == hf_greedy(reference["A"], prompt, 13)


def test_float32_master_weights_decode_through_a_compute_dtype_copy_that_follows_updates(reference):  # noqa: F811
    """The trainer's engine with model.dtype bfloat16: float32 weights, compute_dtype bfloat16.
    Decoding runs on a bfloat16 copy (autocast off), refreshed at each call: the same tokens as
    a bfloat16 model with the same weights, before and after the weights change in place."""
    import copy

    from orchestrator.engines.hf import HFEngine

    def bf16_static(model):     # its parameters in bfloat16; buffers (rotary frequencies) as they were
        model = copy.deepcopy(model)
        for p in model.parameters():
            p.data = p.data.to(torch.bfloat16)
        return HFEngine(model, static_tok, device="cpu", decode="static", max_batch=8)

    from transformers import AutoTokenizer
    static_tok = AutoTokenizer.from_pretrained(reference["A"].name_or_path)
    engine = HFEngine(copy.deepcopy(reference["A"]), static_tok, device="cpu", compute_dtype=torch.bfloat16,
                      decode="static", max_batch=8)
    prompts, params = prompts_of(static_tok), SamplingParams(temperature=0, max_tokens=12)
    before = [g.token_ids for g in engine.generate(prompts, params)]
    assert before == [g.token_ids for g in bf16_static(reference["A"]).generate(prompts, params)]
    with torch.no_grad():                                    # an optimizer step, in place
        engine.model.load_state_dict(reference["B"].state_dict())
    after = [g.token_ids for g in engine.generate(prompts, params)]
    assert after == [g.token_ids for g in bf16_static(reference["B"]).generate(prompts, params)]
    assert after != before
    assert all(p.dtype == torch.float32 for p in engine.model.parameters())          # the trained weights stay
    assert all(torch.equal(p, q) for p, q in zip(engine.model.parameters(), reference["B"].parameters()))
    assert all(p.dtype == torch.bfloat16 for p in engine._static.model.parameters())


def test_a_replaced_model_or_reallocated_parameters_are_decoded_not_the_old_ones(reference):  # noqa: F811
    """Everything the decoder builds from a model (its compute-dtype copy, compiled forward,
    caches) is rebuilt when the engine's model object or its parameter objects change."""
    import copy

    from transformers import AutoTokenizer

    from orchestrator.engines.hf import HFEngine

    tok = AutoTokenizer.from_pretrained(reference["A"].name_or_path)
    prompts, params = prompts_of(tok), SamplingParams(temperature=0, max_tokens=10)
    plain = HFEngine(copy.deepcopy(reference["A"]), tok, device="cpu", decode="static", max_batch=8)
    amp = HFEngine(copy.deepcopy(reference["A"]), tok, device="cpu", compute_dtype=torch.bfloat16,
                   decode="static", max_batch=8)
    a_plain, a_amp = ([g.token_ids for g in e.generate(prompts, params)] for e in (plain, amp))
    b_plain = [g.token_ids for g in HFEngine(copy.deepcopy(reference["B"]), tok, device="cpu", decode="static",
                                             max_batch=8).generate(prompts, params)]
    assert a_plain != b_plain
    plain.model = copy.deepcopy(reference["B"])                          # a new model object
    assert [g.token_ids for g in plain.generate(prompts, params)] == b_plain
    amp.model.load_state_dict(reference["B"].state_dict(), assign=True)   # new parameter objects
    b_amp = [g.token_ids for g in amp.generate(prompts, params)]
    assert b_amp != a_amp
    fresh = HFEngine(copy.deepcopy(reference["B"]), tok, device="cpu", compute_dtype=torch.bfloat16,
                     decode="static", max_batch=8)
    assert b_amp == [g.token_ids for g in fresh.generate(prompts, params)]


def test_rows_are_counted_per_decode_path_so_a_fallback_to_the_loop_shows(static):
    """HFEngine.decode_rows: the trainer logs these per step (engine/static_rows, engine/loop_rows)."""
    import time

    prompts = prompts_of(static.tokenizer)
    assert static.static_expected and not static.decode_rows
    static.generate(prompts, SamplingParams(temperature=0, max_tokens=3))
    assert static.decode_rows == {"static": 3}
    static.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=3),
                    deadlines=[time.monotonic() + 60, None])           # deadlines: the loop
    static.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=3, choices=["yes", "no"]))
    assert static.decode_rows == {"static": 3, "loop": 3}
