"""The tools both τ-bench domains share: ``calculate``, ``think``, ``transfer_to_human_agents``."""

from __future__ import annotations

import ast
import operator
from typing import Any

_CALC_CHARS = frozenset("0123456789+-*/(). ")
_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
# τ-bench evaluates with Python's eval; "9**9**9**9" would then never return. A power's
# exponent is bounded instead (nothing in a retail or airline sum needs more).
_MAX_EXPONENT = 64


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
            raise ValueError(f"exponent {right} is too large")
        return _BINARY[type(node.op)](left, right)
    raise ValueError("unsupported expression")


def calculate(data: Any, expression: str) -> str:
    """τ-bench's calculator: digits, + - * / ( ) . and spaces; the result a float rounded to
    2 places ("2 * 3" gives "6.0", as τ-bench's recorded outputs show).

    >>> calculate(None, "2 * ((350 - 122) + (499 - 127))"), calculate(None, "1 / 0"), calculate(None, "2 ** x")
    ('1200.0', 'Error: division by zero', 'Error: invalid characters in expression')
    """
    if not all(char in _CALC_CHARS for char in expression):
        return "Error: invalid characters in expression"
    try:
        return str(round(float(_evaluate(ast.parse(expression, filename="<string>", mode="eval"))), 2))
    except Exception as e:  # noqa: BLE001 - τ-bench reports any evaluation failure as text
        return f"Error: {e}"


def think(data: Any, thought: str) -> str:
    """Changes nothing and returns nothing, as in τ-bench."""
    return ""


def transfer_to_human_agents(data: Any, summary: str) -> str:
    """Ends the episode in τ-bench; the environment marks it (see ``TERMINATE_TOOLS``)."""
    return "Transfer successful"
