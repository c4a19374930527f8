"""JSON Schema of a rule YAML file, and validation with file + field-path errors.

The schema checks the *shape* of a rule (keys, types, enumerations). Semantic checks
(patterns parse, metavariables are bound, relations and primitives exist, ``K`` equals
the number of preconditions, the stated level matches the score) are done by
:func:`steptp.rules.loader.load_rule` with the same error format::

    rules/loop_split.yaml: params.f.divisors_of: 3.5 is not of type 'string', 'integer'

The rule language itself is documented in ``rules/README.md``.
"""

from __future__ import annotations

from typing import Any

import jsonschema

#: The paper's nine feasibility checks (App. A.2), in the paper's order.
PRECONDITIONS = (
    "pattern_match",            # (1) a specific computation pattern exists
    "dependency",               # (2) computation-order dependencies among expressions
    "operation_identity",       # (3) repeated computation operations exist
    "loop_nest_consistency",    # (4) expressions share the same loop structure
    "equation_count",           # (5) enough equations
    "loop_axis_count",          # (6) enough loop axes
    "loop_range_factorization", # (7) the loop range can be split
    "reduction_axis",           # (8) not applied illegally to reduction axes
    "intermediate_variable",    # (9) variable is not an input/output
)

CATEGORIES = ("graph", "operator", "memory", "math")
LEVELS = ("easy", "medium", "difficult")
SCOPES = ("expr", "loop", "nest", "nests", "tensor", "equation")

_MVAR = {"type": "string", "pattern": r"^\?[A-Za-z][A-Za-z0-9_]*$"}
_VALUE = {"type": ["string", "integer", "boolean", "array"]}

_DOMAIN = {
    "type": "object",
    "additionalProperties": False,
    "minProperties": 1,
    "properties": {
        "divisors_of": {"type": ["string", "integer"]},
        "choice": {"type": ["array", "string"]},
        "range": {"oneOf": [
            {"type": "array", "items": {"type": ["string", "integer"]}, "minItems": 2, "maxItems": 2},
            {"type": "object", "required": ["from", "to"], "additionalProperties": False,
             "properties": {"from": {"type": ["string", "integer"]}, "to": {"type": ["string", "integer"]}}},
        ]},
        "permutations_of": {"type": ["string", "integer"]},
        "exclude": {"type": "array"},
        "exclude_identity": {"type": "boolean"},
        "keep_innermost_kinds": {"type": "array", "items": {"enum": ["L", "P", "V", "U", "B"]}},
        "innermost": {"type": "integer", "minimum": 1},
        "require": {"type": ["string", "array"], "items": {"type": "string"}},
        # Python-computed domains (steptp.engine.filters.EXTRA_DOMAINS; steptp.engine.mathprims)
        "atoms_of": {"type": "string"},
        "exp_factors_of": {"type": "string"},
        "reusable_terms": {"type": "string"},
        "look_through": {"type": "string"},
        "identity": {"type": ["integer", "number"]},
        "avoid": {"type": "array", "items": {"type": "string"}},
    },
}

_FRESH = {
    "oneOf": [
        {"enum": ["index", "tensor"]},
        {"type": "object", "additionalProperties": False, "minProperties": 1, "maxProperties": 1,
         "properties": {
             "index": {"type": ["object", "null"], "additionalProperties": False,
                       "properties": {"like": {"type": "string"}, "kind": {"type": "string"},
                                      "prefix": {"type": "string"}}},
             "tensor": {"type": ["object", "null"], "additionalProperties": False, "properties": {}},
         }},
    ]
}

_LET = {
    "oneOf": [
        {"type": ["string", "number"]},
        {"type": "object", "required": ["lookup"], "additionalProperties": False,
         "properties": {"lookup": {"type": ["string", "integer"]},
                        "table": {"type": "object", "additionalProperties": {"type": ["string", "integer"]}},
                        "default": {"type": ["string", "integer"]}}},
    ]
}

_WHERE_ITEM = {
    "oneOf": [
        {"type": "string", "minLength": 1},
        {"type": "object", "required": ["term", "pattern"], "additionalProperties": False,
         "properties": {"term": _MVAR, "pattern": {"type": "string", "minLength": 1}}},
        {"type": "object", "required": ["check"], "additionalProperties": False,
         "properties": {"check": {"type": "string", "minLength": 1}}},
    ]
}

_TEST = {
    "type": "object",
    "required": ["before"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string"},
        "before": {"type": "string", "minLength": 1},
        "params": {"type": "object"},
        "site": {"type": ["integer", "object"]},
        "seed": {"type": "integer"},
        "after": {"type": "string", "minLength": 1},
        "no_match": {"const": True},
        "cot_contains": {"type": "array", "items": {"type": "string"}},
        "verify": {"type": "boolean"},
    },
    "oneOf": [{"required": ["after"]}, {"required": ["no_match"]}],
}

RULE_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "stp rule",
    "type": "object",
    "additionalProperties": False,
    "required": ["id", "name", "category", "description", "preconditions", "difficulty", "match", "rewrite",
                 "cot", "tests"],
    "properties": {
        "id": {"type": "string", "pattern": r"^[a-z][a-z0-9_]*$"},
        "name": {"type": "string", "minLength": 1},
        "category": {"enum": list(CATEGORIES)},
        "description": {"type": "string", "minLength": 1},
        "source": {"type": "string"},
        "inverse": {"type": ["string", "null"], "pattern": r"^[a-z][a-z0-9_]*$"},
        "expansion": {"type": "boolean"},
        "follows": {"type": "array", "items": {"type": "string", "pattern": r"^[a-z][a-z0-9_]*$"},
                    "uniqueItems": True},
        "preconditions": {"type": "array", "items": {"enum": list(PRECONDITIONS)}, "uniqueItems": True},
        "difficulty": {
            "type": "object",
            "required": ["K", "P", "S"],
            "additionalProperties": False,
            "properties": {
                "K": {"type": "integer", "minimum": 0},
                "P": {"type": "integer", "minimum": 1},
                "S": {"type": "integer", "minimum": 0},
                "level": {"enum": list(LEVELS)},
            },
        },
        "match": {
            "type": "object",
            "additionalProperties": False,
            "minProperties": 1,
            "properties": {
                "expr": {"type": "string", "minLength": 1},
                "loop": {"type": "string", "minLength": 1},
                "nest": _MVAR,
                "nests": {"type": "array", "items": _MVAR, "minItems": 2, "maxItems": 4},
                "tensor": _MVAR,
                "equation": {"type": "string", "minLength": 1},
            },
        },
        "where": {"type": "array", "items": _WHERE_ITEM},
        "params": {"type": "object", "propertyNames": {"pattern": r"^[A-Za-z][A-Za-z0-9_]*$"},
                   "additionalProperties": _DOMAIN},
        "let": {"type": "object", "propertyNames": {"pattern": r"^[A-Za-z][A-Za-z0-9_]*$"},
                "additionalProperties": _LET},
        "fresh": {"type": "object", "propertyNames": {"pattern": r"^[A-Za-z][A-Za-z0-9_]*$"},
                  "additionalProperties": _FRESH},
        "rewrite": {"oneOf": [
            {"type": "string", "minLength": 1},
            {"type": "array", "minItems": 1,
             "items": {"type": "object", "minProperties": 1, "maxProperties": 1}},
        ]},
        "cot": {"type": "string", "minLength": 1},
        "filter": {"type": "array", "items": {"type": "object", "minProperties": 1, "maxProperties": 1}},
        "tests": {"type": "array", "minItems": 1, "items": _TEST},
    },
}

_VALIDATOR = jsonschema.Draft202012Validator(RULE_SCHEMA)


class RuleError(ValueError):
    """An invalid rule file. ``str(e)`` is one line per problem: ``FILE:LINE:COL: FIELD.PATH:
    message`` when the loader located the field in the file's text, else ``FILE: FIELD.PATH:
    message``; ``e.source``, ``e.field``, ``e.problems`` (``(field, message)`` pairs),
    ``e.positions`` (``(line, column)`` or None per problem, 1-based), ``e.line`` and
    ``e.column`` (of the first problem) give the parts. ``name``: the name the message is
    about (an unknown relation, function, key), which the loader looks for inside the field
    to point at it rather than at the field's start."""

    def __init__(self, source: str, field: str, message: str, problems: list[tuple[str, str]] | None = None,
                 *, name: str | None = None, positions: list | None = None):
        self.source = source
        self.field = field
        self.message = message
        self.name = name
        self.problems = problems or [(field, message)]
        self.positions = list(positions) if positions is not None else [None] * len(self.problems)
        first = self.positions[0] if self.positions else None
        self.line, self.column = first if first else (None, None)
        text = "\n".join(f"{source}{f':{p[0]}:{p[1]}' if p else ''}: {f or '(top level)'}: {m}"
                         for (f, m), p in zip(self.problems, self.positions))
        super().__init__(text)

    def __reduce__(self):
        return (_rebuild_rule_error, (self.source, self.field, self.message, self.problems, self.name,
                                      self.positions))


def _rebuild_rule_error(source, field, message, problems, name, positions):
    return RuleError(source, field, message, problems, name=name, positions=positions)


def field_path(parts) -> str:
    """``["params", "f", "divisors_of"]`` -> ``params.f.divisors_of``; list indices as ``tests[0]``."""
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += ("." if out else "") + str(p)
    return out


def _message(err: jsonschema.ValidationError) -> str:
    if err.validator in ("oneOf", "anyOf") and err.context:
        # report the most specific sub-error instead of "is not valid under any of the given schemas"
        best = jsonschema.exceptions.best_match(err.context)
        if best is not None and best.message:
            sub = field_path(best.relative_path)
            return (f"{sub}: " if sub else "") + best.message
    if err.validator == "additionalProperties":
        return err.message.replace("Additional properties are not allowed", "unknown key(s)")
    return err.message


def validate_rule_data(data: Any, source: str) -> None:
    """Validate parsed YAML against :data:`RULE_SCHEMA`; raise :class:`RuleError` listing
    every problem as ``source: field.path: message`` (sorted by field path)."""
    if not isinstance(data, dict):
        raise RuleError(source, "", f"a rule file must be a mapping, got {type(data).__name__}")
    errors = sorted(_VALIDATOR.iter_errors(data), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    if errors:
        problems = [(field_path(e.absolute_path), _message(e)) for e in errors]
        raise RuleError(source, problems[0][0], problems[0][1], problems)


__all__ = ["PRECONDITIONS", "CATEGORIES", "LEVELS", "SCOPES", "RULE_SCHEMA", "RuleError", "field_path",
           "validate_rule_data"]
