"""GAIA's leaderboard scorer (evaluation/scoring/gaia.py): its rules, and as the `gaia` judge."""
import pytest

from evaluation.scoring.gaia import comparison_kind, normalize_number_str, normalize_str, question_scorer, split_string
from evaluation.scoring.judge import RULE_JUDGES, Judge


# ---- the scorer: the leaderboard's rules -------------------------------------------------------
def test_normalizers_as_the_leaderboard_defines_them():
    assert normalize_number_str("$1,234.5") == 1234.5       # $ , removed
    assert normalize_number_str("45%") == 45.0               # % removed
    assert normalize_number_str("17 km") == float("inf")     # anything else: not a number
    assert split_string("a, b;c") == ["a", " b", "c"]        # both separators, spaces kept
    assert normalize_str("Sea Gull!") == "seagull"           # the scorer's own example: seagull vs. sea gull
    assert normalize_str("St. Louis", remove_punct=False) == "st.louis"


@pytest.mark.parametrize("answer,truth,right", [
    # ground truth is a number: the answer must parse to the same float after removing $ % ,
    ("17", "17", True), ("17.0", "17", True), ("$17", "17", True), ("17%", "17", True),
    ("1,700", "1700", True), (".5", "0.5", True), ("1e3", "1000", True),
    ("17 km", "17", False), ("seventeen", "17", False), ("17.01", "17", False),
    ("1,7", "17", True),                      # commas go before float(): "1,7" reads as 17 (the rule, as is)
    # ground truth with , or ; : element-wise, same length, numbers as numbers, strings keep punctuation
    ("2, 3, 5", "2, 3, 5", True), ("2,3,5", "2, 3, 5", True), ("2; 3; 5", "2, 3, 5", True),
    ("2, 3", "2, 3, 5", False), ("2, 3, 5.0", "2, 3, 5", True), ("2, 3, $5", "2, 3, 5", True),
    ("Paris, rome", "paris, Rome", True), ("St Louis, Boston", "St. Louis, Boston", False),
    ("1000", "1,000", False),                 # "1,000" is not a float, so a 2-element list
    # ground truth is a string: whitespace and punctuation removed, lower-cased
    ("Seagull", "sea gull", True), ("paris!", "Paris", True), ("St Louis", "St. Louis", True),
    ("the Paris", "Paris", False), ("Paris, France", "Paris", False),
    (None, "None", True), (None, "Paris", False),   # a missing answer is the string "None"
])
def test_question_scorer_rules(answer, truth, right):
    assert question_scorer(answer, truth) is right


def test_comparison_kind_follows_the_ground_truth():
    assert [comparison_kind(t) for t in ("3.5", "a; b", "1,000", "Paris")] == ["number", "list", "list", "string"]


def test_gaia_judge_is_the_scorer_and_nothing_else():
    judge = Judge("gaia")
    assert "gaia" in RULE_JUDGES
    right = judge("q?", "$42", "42")
    assert (right.correct, right.rule, right.judge_model) == (True, "gaia", "gaia")
    assert judge("q?", "Paris", "Paris, France").rule == "not_gaia"
    # rules 1-2 of the other judges do not apply: an exact case-insensitive match of "1,000" vs
    # "1,000" is the scorer's list comparison (True), and "1000" is wrong (False), as GAIA scores it
    assert judge("q?", "1000", "1,000").correct is False
    # the test split has no answers: no verdict, and not a judge error
    none = judge("q?", "Vienna", None)
    assert (none.correct, none.rule) == (None, "no_reference")
