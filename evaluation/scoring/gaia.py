"""GAIA's quasi-exact-match scorer, ported from the GAIA leaderboard's `scorer.py`
(huggingface.co/spaces/gaia-benchmark/leaderboard: `question_scorer`, `normalize_number_str`,
`split_string`, `normalize_str`), rule for rule; evaluation/scoring/judge.py runs it as the judge
named `gaia` (the gaia profile's judge).

The ground truth's form picks the comparison:
1. it parses as a float (Python's `float()`): the model answer with `$`, `%` and `,` removed
   must parse to the same float (an answer that does not parse is +inf, so wrong);
2. else it holds a `,` or `;`: both are split on those characters, the lists must be the same
   length, and each pair is compared as a number (when that ground-truth element parses) or
   as a string with whitespace removed and lower-cased, punctuation kept;
3. else: both strings with all whitespace and all ASCII punctuation removed, lower-cased, equal.

A missing model answer (None) is compared as the string "None", as the leaderboard does.
What is left out of the port: the leaderboard's prints and its warning on lists of different
lengths (the verdict is the same).
"""
from __future__ import annotations

import re
import string

NUMBER_JUNK = ("$", "%", ",")        # removed from an answer before float() (common units, thousands)
LIST_SEPARATORS = (",", ";")


def normalize_number_str(number_str: str) -> float:
    """`number_str` without `$ % ,` as a float; +inf when it is not a number."""
    for char in NUMBER_JUNK:
        number_str = number_str.replace(char, "")
    try:
        return float(number_str)
    except ValueError:
        return float("inf")


def split_string(s: str, char_list: tuple[str, ...] | list[str] = LIST_SEPARATORS) -> list[str]:
    """`s` split on any of `char_list` (elements keep their surrounding spaces)."""
    return re.split(f"[{''.join(char_list)}]", s)


def normalize_str(input_str: str, remove_punct: bool = True) -> str:
    """Every whitespace character removed ("sea gull" == "seagull"), lower-cased, and with
    `remove_punct` every character of `string.punctuation` removed."""
    no_spaces = re.sub(r"\s", "", input_str)
    if remove_punct:
        return no_spaces.lower().translate(str.maketrans("", "", string.punctuation))
    return no_spaces.lower()


def is_float(element) -> bool:
    try:
        float(element)
        return True
    except ValueError:
        return False


def question_scorer(model_answer: str | None, ground_truth: str) -> bool:
    """True when `model_answer` matches `ground_truth` under the rules in the module docstring."""
    if model_answer is None:
        model_answer = "None"
    if is_float(ground_truth):
        return normalize_number_str(model_answer) == float(ground_truth)
    if any(char in ground_truth for char in LIST_SEPARATORS):
        gt_elems = split_string(ground_truth)
        ma_elems = split_string(model_answer)
        if len(gt_elems) != len(ma_elems):
            return False
        comparisons = []
        for ma_elem, gt_elem in zip(ma_elems, gt_elems):
            if is_float(gt_elem):
                comparisons.append(normalize_number_str(ma_elem) == float(gt_elem))
            else:   # punctuation kept: list elements can hold it
                comparisons.append(normalize_str(ma_elem, remove_punct=False)
                                   == normalize_str(gt_elem, remove_punct=False))
        return all(comparisons)
    return normalize_str(model_answer) == normalize_str(ground_truth)


def comparison_kind(ground_truth: str) -> str:
    """Which rule `question_scorer` applies to `ground_truth`: "number", "list" or "string"."""
    if is_float(ground_truth):
        return "number"
    return "list" if any(char in ground_truth for char in LIST_SEPARATORS) else "string"
