"""Regional compilation of the static decoder's step: the decoder layer compiled once, its graph
serving every layer, instead of the whole model's forward compiled as one graph.

PyTorch's recipe "Reducing torch.compile cold start compilation time with regional compilation":
a decoder's layers share their code, so `torch.compile` of the layer traces and compiles one
layer (~1/28 of Qwen3-0.6B's forward) and every layer replays that graph (parameters are graph
inputs, `inline_inbuilt_nn_modules`); what is lost is fusion across layer boundaries (the last
residual add of one layer with the next layer's first RMSNorm).  Two things would make each layer
compile again, and are kept out of the compiled region here:

* the KV cache: a layer calls `past_key_values.update(k, v, self.layer_idx)`, and a cache indexed
  by the layer number guards on that number (one graph per layer, then dynamo's recompile limit).
  Each layer gets `LayerCache`, its own slot of the cache, which ignores the number;
* changing shapes: the region is compiled with `dynamic=True` (batch rows, cache length and
  attention span symbolic from the first call), so a new shape bucket reuses the graph instead of
  compiling it once static and again dynamic.

Only single-token steps (the decode) take the compiled region; a prefill (more than one token per
row) runs the layer eagerly, as the whole-model mode did.  The sampler is compiled apart
(`sample_rows`: one fused pass over the vocabulary); the final norm and the LM head run eagerly
between the two (one GEMM; inside a CUDA graph their launches cost no host time).
"""
from __future__ import annotations

import contextlib

import torch

COMPILE_MODES = ("regional", "whole", "none")


def check_compile_mode(mode, where: str) -> str:
    """`mode` if it is one of COMPILE_MODES, else a ValueError naming `where`."""
    if mode not in COMPILE_MODES:
        raise ValueError(f"{where}={mode!r}: choose from {', '.join(COMPILE_MODES)} (regional: the decoder layer "
                         f"compiled once for all layers; whole: the whole forward as one graph; none: eager)")
    return mode


class LayerCache:
    """One layer's slot of a transformers `Cache` (`cache.layers[i]`), passed to that layer as its
    `past_key_values`: `update` ignores the layer number, so the compiled region does not guard on it."""

    def __init__(self, layer):
        self.layer = layer

    def update(self, key_states, value_states, layer_idx=None, *args, **kwargs):
        return self.layer.update(key_states, value_states, *args, **kwargs)


def _layer_step(layer, hidden_states, args, kwargs):
    """The compiled region: one decoder layer's own forward (not the instance's patched one)."""
    return type(layer).forward(layer, hidden_states, *args, **kwargs)


def compile_dynamic(fn, backend: str = "inductor"):
    """`torch.compile(fn, dynamic=True)`, called without duck sizing: sizes are symbolic from the
    first call (no static first compile, then a dynamic one when a size first changes), and two
    sizes that happen to be equal in that call (an attention span and the cache length, a
    sequence length and the hidden size) are not tied into one symbol, whose later split would
    compile again.  Sizes of 1 are still specialized (a new graph where they change)."""
    from torch.fx.experimental import _config as shape_config  # lazy: heavy (torch)

    compiled = torch.compile(fn, dynamic=True, backend=backend)

    def call(*args, **kwargs):
        before = shape_config.use_duck_shape            # a plain set and restore: ~10 us a call, where
        shape_config.use_duck_shape = False             # config.patch() costs ~70 us (per layer, per pass)
        try:
            return compiled(*args, **kwargs)
        finally:
            shape_config.use_duck_shape = before
    return call


def compiled_layer_step(backend: str = "inductor"):
    """The region, compiled (one per decoder: every layer of it, every shape, replays its graph)."""
    return compile_dynamic(_layer_step, backend)


def decoder_layers(model) -> list:
    """The model's repeated decoder layers (`model.get_decoder().layers`); ValueError if none."""
    layers = getattr(model.get_decoder(), "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: no decoder `layers` to compile by region; "
                         f"use compile mode 'whole' or 'none'")
    return list(layers)


@contextlib.contextmanager
def regional_steps(model, step):
    """Inside the block each decoder layer of `model` runs single-token calls through `step`
    (`compiled_layer_step()`) with its own `LayerCache`, other calls eagerly; restored after."""
    layers = decoder_layers(model)
    patched = []
    try:
        for index, layer in enumerate(layers):
            if "forward" in vars(layer):            # already patched (e.g. training's compiled layers)
                continue
            layer.forward = _routed(layer, index, step)
            patched.append(layer)
        yield
    finally:
        for layer in patched:
            vars(layer).pop("forward", None)


def _routed(layer, index: int, step):
    plain = type(layer).forward.__get__(layer)

    def forward(hidden_states, *args, past_key_values=None, **kwargs):
        if past_key_values is None or hidden_states.shape[1] != 1:
            return plain(hidden_states, *args, past_key_values=past_key_values, **kwargs)
        return step(layer, hidden_states, args, dict(kwargs, past_key_values=LayerCache(past_key_values.layers[index])))
    return forward
