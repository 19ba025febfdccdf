"""training/quickstart/beside.py: a function in a spawned process, its value, its failure, its death."""
import operator
import os
import time

import pytest

from training.quickstart.beside import Beside


def test_the_value_comes_back():
    assert Beside(pow, 2, 10).result() == 1024


def test_an_exception_in_the_child_comes_back_with_its_traceback():
    with pytest.raises(RuntimeError, match=r"(?s)the evaluation failed:.*ZeroDivisionError"):
        Beside(operator.truediv, 1, 0, what="the evaluation").result()


def test_a_child_that_dies_without_a_result_is_an_error_naming_its_exit_code_not_a_wait():
    with pytest.raises(RuntimeError, match=r"the evaluation ended \(exit code 3\) without a result"):
        Beside(os._exit, 3, what="the evaluation").result(poll_s=0.2)


def test_stop_ends_a_running_child_and_can_be_called_twice():
    beside = Beside(time.sleep, 600)
    beside.stop()
    beside.stop()
    assert not beside._process.is_alive() and beside._process.exitcode != 0
