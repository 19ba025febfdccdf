"""A calculator tool: the `python` kind's example in docs/tools.md.

tools.json:  {"name": "calculator", "kind": "python", "handler": "examples.tools.calculator:calculate"}
             and a price row "calculator": {"per_call": 0.0001}
"""
from __future__ import annotations

import ast
import operator

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.Pow: operator.pow, ast.Mod: operator.mod, ast.FloorDiv: operator.floordiv,
        ast.USub: operator.neg, ast.UAdd: operator.pos}


def calculate(expression: str, precision: int = 6) -> float:
    """Evaluate an arithmetic expression exactly.

    Args:
        expression: numbers with + - * / // % ** and parentheses, e.g. "(3 + 4) * 2"
        precision: digits kept after the decimal point
    """
    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            if isinstance(node.op, ast.Pow) and abs(value(node.right)) > 100:
                raise ValueError("exponent too large (at most 100)")
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.operand))
        raise ValueError(f"not arithmetic: {ast.unparse(node)!r}")

    return round(float(value(ast.parse(expression, mode="eval").body)), precision)
