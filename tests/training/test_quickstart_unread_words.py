"""training/quickstart/warmup.py UnreadWords: words the warm-up never reads, put into its preference lines."""
from __future__ import annotations

import random

import pytest

from orchestrator.embedded import smollm2_path
from training.quickstart.warmup import Demonstration, UnreadWords

SYSTEM = "<|im_start|>system\nTools: search, answer.<|im_end|>\n<|im_start|>user\n"
LINE = "Preference: accuracy, please use answer-4 to answer."


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path())


def _demo(tok, text: str) -> Demonstration:
    ids = tok(text, add_special_tokens=False)["input_ids"]
    return Demonstration(ids, [5, 6, 0], {1: {6: 1.0}}, "answer")


def test_the_pool_holds_only_words_no_demonstration_and_no_kept_out_line_holds(tok):
    demo = _demo(tok, f"{SYSTEM}Where was Ada born?\n{LINE}<|im_end|>\n<|im_start|>assistant\n")
    unread = UnreadWords.build(tok, [demo], "Preference:", ["be right; the bill does not matter."], k=2)
    pool = {tok.convert_ids_to_tokens(i) for i in unread.pool}
    assert {"Ġbill", "Ġmatter"}.isdisjoint(pool)                     # the kept-out line's words
    assert {"Ġplease", "Ġaccuracy", "Ġborn"}.isdisjoint(pool)          # the demonstration's words
    assert {"Ġbicycle", "Ġgarden"} <= pool                             # words nothing here holds
    assert all(p.startswith("Ġ") and p[1:].isalpha() and p[1:].islower() and len(p) > 3 for p in pool)
    assert unread.marker == tuple(tok("Preference:", add_special_tokens=False)["input_ids"])


def test_insert_puts_k_pool_words_at_word_boundaries_of_the_last_preference_line_only(tok):
    text = f"{SYSTEM}What is 3+4?\n{LINE}<|im_end|>\n<|im_start|>assistant\n"
    demo = _demo(tok, text)
    unread = UnreadWords.build(tok, [demo], "Preference:", [], k=3)
    out = unread.insert(demo, random.Random(0))
    head, tail = text.split("Preference:")
    decoded = tok.decode(out.prompt_ids)
    before, line_and_rest = decoded.split("Preference:")
    line, rest = line_and_rest.split("<|im_end|>", 1)
    assert before == head and rest == tail.split("<|im_end|>", 1)[1]     # nothing outside the line moved
    added = [w for w in line.split() if w not in LINE.split()]
    assert len(added) == 3 and all(tok.convert_tokens_to_ids("Ġ" + w) in unread.pool for w in added)
    # the line's own words keep their order and `answer-4` stays whole: without the added words it is the original
    assert " ".join(w for w in line.split() if w not in added) == LINE.split(": ", 1)[1]
    assert (out.response_ids, out.targets) == (demo.response_ids, demo.targets)
    assert unread.insert(demo, random.Random(1)).prompt_ids != out.prompt_ids   # another draw, other words


def test_a_prompt_without_the_line_and_k_zero_are_left_as_they_are(tok):
    demo = _demo(tok, f"{SYSTEM}What is 3+4?<|im_end|>\n")
    unread = UnreadWords.build(tok, [demo], "Preference:", [], k=2)
    assert unread.insert(demo, random.Random(0)) is demo
    lined = _demo(tok, f"{SYSTEM}What is 3+4?\n{LINE}<|im_end|>\n")
    assert UnreadWords.build(tok, [lined], "Preference:", [], k=0).insert(lined, random.Random(0)) is lined


def test_a_pool_the_demonstrations_leave_empty_is_an_error_naming_why(tok):
    every_token = Demonstration(list(range(len(tok))), [5, 6, 0], {1: {6: 1.0}}, "answer")
    with pytest.raises(ValueError, match="no word of the tokenizer is left unread by the demonstrations"):
        UnreadWords.build(tok, [every_token], "Preference:", [], k=1)
