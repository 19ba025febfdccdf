"""Grammar-constrained decoding over one tokenizer (xgrammar): `SamplingParams.grammar`.

    tg = token_grammar(tokenizer, vocab_size, stop_ids)   # one per tokenizer (cached)
    matcher = tg.matcher(ebnf)                            # one per generated row
    allowed = tg.allowed(matcher)                         # bool [vocab_size]: tokens the grammar admits next
    matcher.accept_token(token)
    mask = tg.decision_mask(ebnf, response_ids)           # 1 where the grammar left a choice

The grammar text is xgrammar's EBNF (what `orchestrator.toolcall.call_grammar` writes and
vLLM's structured outputs read).  Once the grammar is complete only the stop ids are
admitted, so a constrained response is one sentence of the grammar followed by EOS.
Compiled grammars are cached per grammar text (the tool set of a task decides it).
"""
from __future__ import annotations

import threading
from collections import OrderedDict

import torch

_BITS = torch.arange(32, dtype=torch.int32)


def _xgrammar():
    try:
        import xgrammar
    except ImportError as exc:   # pragma: no cover - xgrammar is a dependency
        raise ImportError("grammar-constrained decoding needs xgrammar: pip install xgrammar") from exc
    return xgrammar


class TokenGrammar:
    """xgrammar's tokenizer info, compiler and a cache of compiled grammars for one tokenizer."""

    def __init__(self, tokenizer, vocab_size: int, stop_ids: list[int], cache_size: int = 64):
        xgr = _xgrammar()
        self.vocab_size = vocab_size
        self._info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                        stop_token_ids=list(stop_ids))
        self._compiler = xgr.GrammarCompiler(self._info)
        self._compiled: OrderedDict[str, object] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    def compiled(self, grammar: str):
        with self._lock:
            hit = self._compiled.get(grammar)
            if hit is not None:
                self._compiled.move_to_end(grammar)
                return hit
        try:
            compiled = self._compiler.compile_grammar(grammar)
        except Exception as exc:  # noqa: BLE001 - xgrammar raises its own error types
            raise ValueError(f"SamplingParams.grammar does not compile: {exc}") from None
        with self._lock:
            self._compiled[grammar] = compiled
            while len(self._compiled) > self._cache_size:
                self._compiled.popitem(last=False)
        return compiled

    def matcher(self, grammar: str):
        return _xgrammar().GrammarMatcher(self.compiled(grammar))

    def _bitmask(self, matcher) -> torch.Tensor:
        bitmask = _xgrammar().allocate_token_bitmask(1, self.vocab_size)       # int32 [1, ceil(V/32)]
        matcher.fill_next_token_bitmask(bitmask)
        return bitmask[0]

    def allowed(self, matcher) -> torch.Tensor:
        """Tokens `matcher` admits next, as a bool mask. [vocab_size]"""
        return ((self._bitmask(matcher)[:, None] >> _BITS) & 1).flatten()[:self.vocab_size].bool()

    def _choice(self, matcher) -> bool:
        """More than one token admitted next (no unpacking: one set bit = one nonzero power-of-2 word)."""
        words = self._bitmask(matcher)
        if self.vocab_size % 32:                                  # bits past the vocabulary do not count
            words[-1] &= (1 << self.vocab_size % 32) - 1
        nonzero = words[words != 0]
        word = int(nonzero[0]) & 0xFFFFFFFF if len(nonzero) == 1 else 0   # as unsigned 32 bits
        return len(nonzero) > 1 or word & (word - 1) != 0

    def decision_mask(self, grammar: str, response_ids: list[int]) -> list[int]:
        """1 where the grammar admitted more than one token, 0 where it forced the token.

        The grammar counterpart of `training.rollouts.decision_mask` (choices): a forced token
        has probability 1 under the constrained sampler, so it carries no policy gradient.
        Tokens after the grammar rejects one (an unconstrained response) count as choices.
        """
        matcher = self.matcher(grammar)
        mask = []
        for i, token in enumerate(response_ids):
            mask.append(int(self._choice(matcher)))
            if not matcher.accept_token(token):
                return mask + [1] * (len(response_ids) - i - 1)
        return mask


_BY_TOKENIZER: dict[tuple[int, int, tuple[int, ...]], tuple[object, TokenGrammar]] = {}
_BY_TOKENIZER_LOCK = threading.Lock()


def token_grammar(tokenizer, vocab_size: int, stop_ids: list[int]) -> TokenGrammar:
    """The `TokenGrammar` of this tokenizer (built once: xgrammar reads the whole vocabulary)."""
    key = (id(tokenizer), vocab_size, tuple(stop_ids))
    with _BY_TOKENIZER_LOCK:   # the entry keeps the tokenizer alive, so its id is not reused
        if key not in _BY_TOKENIZER:
            _BY_TOKENIZER[key] = (tokenizer, TokenGrammar(tokenizer, vocab_size, stop_ids))
        return _BY_TOKENIZER[key][1]
