"""The rule authors' reference, ``docs/rule-language.md``, generated from the engine itself.

Every name a rule file may use comes from a registry, and so does its meaning: the rule
file's fields from :data:`steptp.rules.schema.RULE_SCHEMA`, the ``where:`` relations from
:data:`steptp.engine.egraph.RELATIONS`, the ``filter:`` checks from
:data:`steptp.engine.filters.FILTERS`, the parameter domains from
:data:`steptp.engine.domains.DOMAINS` and :data:`steptp.engine.filters.EXTRA_DOMAINS`, the
value functions from :data:`steptp.engine.domains.VALUE_FUNCTIONS` and the rewrite primitives
from :data:`steptp.engine.primitives.PRIMITIVES`. Each entry's meaning is its docstring (its
``doc`` for relations); the few value functions registered as lambdas, which cannot carry a
docstring, are described in :data:`VALUE_FUNCTION_DOCS`. Each entry's example is taken from
the shipped rules that use it (found by scanning them), so the page shows real use.

Regenerate with ``stp rules docs -o docs/rule-language.md``; ``tests/test_docs.py`` fails
when the committed page differs from :func:`rule_language_page`, when a registry name is
missing from it, or when an entry has no meaning. Output is deterministic (sorted names,
no dates).
"""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path

import yaml

#: Meaning of every field of a rule file (top level, ``difficulty``, ``tests[]`` items,
#: ``fresh`` kinds). A field of :data:`~steptp.rules.schema.RULE_SCHEMA` missing here makes
#: :func:`rule_language_page` raise, so a new field cannot go undocumented.
FIELD_DOCS: dict[str, str] = {
    "id": "The strategy's id, `snake_case`, equal to the file name without `.yaml`. Entries, CoTs and "
          "`stp apply` name the rule by it.",
    "name": "The paper's strategy name (App. A.3), e.g. `loop split`; the CoT's `strategy`.",
    "category": "`graph`, `operator`, `memory` or `math` (the paper's four categories).",
    "description": "The fixed strategy sentence that opens every CoT of the rule.",
    "source": "Optional free text: where the strategy comes from (paper section, TVM schedule primitive).",
    "inverse": "Optional id of the inverse strategy (`loop_fusion` for `loop_split`).",
    "expansion": "Optional `true` for an expansion, the inverse of a simplification (`expand_log`, `apart`): "
                 "the dataset's difficulty filter (paper §3.4) keeps fewer of its easy steps than of a "
                 "simplification's.",
    "follows": "Optional ids of strategies whose output offers sites that source programs lack; "
               "`stp dataset --follow-ups` tries this rule on their results.",
    "preconditions": "Names of the paper's nine feasibility checks (App. A.2) the rule relies on; "
                     "`K` of the difficulty must equal their number.",
    "difficulty": "`{K, P, S, level}`: preconditions, modified aspects, synthesised categories; `score = "
                  "0.1K + 0.5(P-1) + S` (paper eq. 1) and `level` (optional) must match the score.",
    "match": "The pattern that finds sites: exactly one scope key (see *Match scopes*).",
    "where": "Preconditions, all of which must hold at a site (see *`where:` clauses*).",
    "params": "Parameter domains, one per parameter, evaluated per site in YAML order and sampled "
              "with the run's seed (see *Parameter domains*).",
    "let": "Derived values, value expressions over the bindings (see *Value functions*), or "
           "`{lookup: value, table: {key: value}, default: value}`.",
    "fresh": "New names that collide with nothing in scope: `{index: {kind, like, prefix}}` for a loop "
             "index, `{tensor: {}}` (or `tensor`) for a tensor.",
    "rewrite": "The rewrite: a list of primitive steps run in order (see *Rewrite primitives*); a single "
               "string is short for `[{replace: ...}]`.",
    "cot": "The chain of thought: a Jinja template file name (`*.j2`, beside the rule, in a `templates/` "
           "directory next to it, then the shipped templates) or an inline Jinja string.",
    "filter": "Checks computed in Python on each (site, parameters) pair, after matching "
              "(see *`filter:` checks*).",
    "tests": "The rule's own tests, run by `stp rules test` and `stp rules lint`: at least one.",
    "difficulty.K": "Number of preconditions (checked against `preconditions`).",
    "difficulty.P": "Number of modified aspects (expressions, loop axes, range adjustments, equations, "
                    "variables, index calculations), at least 1.",
    "difficulty.S": "Number of categories of newly synthesised elements.",
    "difficulty.level": "Optional `easy` (score < 1), `medium` (< 2.5) or `difficult`; checked against the score.",
    "tests.name": "Optional test name shown in failures.",
    "tests.before": "A whole `.leir` text (signature header and program).",
    "tests.after": "The exact transformed program the rule must produce (signature unchanged).",
    "tests.no_match": "`true`: the rule must not apply to `before` (instead of `after`).",
    "tests.params": "Optional parameter values; unspecified ones are drawn with `seed`. Python-computed "
                    "domains take LEIR text (`{x: 'exp(A^{f32,g}_{tx,a})'}`).",
    "tests.site": "Optional site: an index into the enumerated sites, or a partial description "
                  "(`{loop: 1}`, `{nest: [1]}`).",
    "tests.seed": "Optional seed of the site and parameter draw (default 0).",
    "tests.cot_contains": "Optional snippets the rendered CoT must contain.",
    "tests.verify": "`false` skips this test's numeric verification (default `true`).",
    "fresh.index": "A loop index: `kind` (the loop kind; `B` keeps the thread/block prefix of `like` or "
                   "uses `prefix`), `like` (an index whose name it resembles), `prefix`.",
    "fresh.tensor": "A tensor name (`A C D E ...`); its dtype and scope are written in the template and "
                    "its shape is inferred from its writes.",
}

#: Match scopes: what one site is and what the match binds.
SCOPE_DOCS: dict[str, str] = {
    "expr": "A value pattern; a site is one occurrence of a subterm in an equation's value (not inside "
            "subscripts). Binds `?eq`, `?nest` and `?site`.",
    "equation": "An equation pattern `?X_{..}=...`; a site is one equation. Binds `?eq`, `?nest`.",
    "loop": "One loop pattern `?k^{?n}_{?i=0}`; a site is one loop of one nest. Binds `?nest`, `?pos`.",
    "nest": "A metavariable `\"?N\"`; a site is one nest (nested nests included).",
    "nests": "2 to 4 metavariables `[\"?n1\", \"?n2\"]`; a site is that many consecutive sibling nests.",
    "tensor": "A metavariable `\"?X\"`; a site is one tensor name (all its occurrences).",
}

#: The paper's nine checks (App. A.2), by name.
PRECONDITION_DOCS: dict[str, str] = {
    "pattern_match": "a specific computation pattern exists",
    "dependency": "computation-order dependencies among expressions allow it",
    "operation_identity": "repeated computation operations exist",
    "loop_nest_consistency": "the expressions share the same loop structure",
    "equation_count": "there are enough equations",
    "loop_axis_count": "there are enough loop axes",
    "loop_range_factorization": "the loop range can be split",
    "reduction_axis": "it is not applied illegally to a reduction axis",
    "intermediate_variable": "the variable is not an input or output",
}

#: Built-in parameter domains and their modifiers (:data:`steptp.engine.domains.DOMAINS`,
#: :data:`~steptp.engine.domains.DOMAIN_MODIFIERS`).
DOMAIN_DOCS: dict[str, str] = {
    "divisors_of": "the divisors of an integer value, ascending",
    "choice": "the listed values",
    "range": "the integers `lo..hi` inclusive: `[lo, hi]` or `{from: lo, to: hi}`",
    "permutations_of": "the permutations of a list (tuples of old positions: `order[k]` is the old position "
                       "of the item now at `k`), in lexicographic order",
    "exclude": "values to leave out",
    "exclude_identity": "leave out the identity permutation (default `true` for `permutations_of`)",
    "keep_innermost_kinds": "loops of these kinds that are innermost stay in place",
    "innermost": "only the innermost N items are permuted; the outer ones keep their places",
    "require": "a value expression (or a list of them) that must hold with the candidate value bound",
}

#: Value functions registered as lambdas (no docstring possible): ``name -> (arguments,
#: meaning)``. Functions defined with ``def`` carry their meaning in their docstring;
#: ``N`` is a nest (``?N``), ``X`` a tensor name, ``L`` a list, ``t`` a term, ``pos`` a loop
#: position (from 0).
VALUE_FUNCTION_DOCS: dict[str, tuple[str, str]] = {
    "axis_limit": ("ax", "The hardware limit of thread/block axis `ax` (`tx`..`bz`), from `steptp.backend.hardware`."),
    "axis_of": ("N, pos", "The thread/block axis (`tx`..`bz`) loop `pos` of nest `N` is bound to, `\"\"` if none."),
    "bound_axes": ("N", "The axes bound anywhere in the kernel (the top-level nest) around nest `N`."),
    "concat": ("L1, L2", "The two lists joined."),
    "contains": ("L, x", "Whether `x` is an item of `L` (names compare by name)."),
    "drop": ("L, k", "`L` without its item `k`."),
    "eq_count": ("N", "The number of equations in nest `N`, inner nests included."),
    "extent_of": ("N, pos", "The extent of loop `pos` of nest `N`."),
    "free_indices": ("t", "The loop indices a term (or list of terms) uses, first occurrence first."),
    "index_in": ("L, x", "The position of `x` in `L`, or -1."),
    "index_of": ("N, pos", "The index name of loop `pos` of nest `N`."),
    "insert_at": ("L, k, x", "`L` with `x` (an item, or a list spliced) inserted at position `k`."),
    "is_thread_axis": ("ax", "Whether `ax` is a threadIdx axis (`tx`, `ty`, `tz`)."),
    "item_count": ("N", "The number of items (equations and inner nests) in nest `N`'s body."),
    "keep_loops": ("L, names", "The loops of `L` whose index is in `names`."),
    "kind_of": ("N, pos", "The kind (`L P V U B`) of loop `pos` of nest `N`."),
    "len": ("L", "The length of a list."),
    "loop": ("N, pos", "Loop `pos` of nest `N` (for `with_kind` and friends, or a loop template)."),
    "loop_count": ("N", "The number of nest `N`'s own loops."),
    "loop_pos": ("N, i", "The position of the loop of index `i` in nest `N`, or -1."),
    "max": ("a, b", "The larger of two values."),
    "max_threads_per_block": ("", "The hardware limit of threads per block (`steptp.backend.hardware`)."),
    "min": ("a, b", "The smaller of two values."),
    "not_identity": ("order", "Whether `order` is not the identity permutation `(0, 1, ...)`."),
    "readers": ("X", "The number of equations reading tensor `X`."),
    "replace_at": ("L, k, x", "`L` with item `k` replaced by `x` (an item, or a list spliced)."),
    "slice": ("L, a, b", "Items `a` to `b` (exclusive) of `L`, as Python's `L[a:b]`."),
    "subscripts_of": ("t", "The subscript list of a tensor term."),
    "tensor_name": ("t", "The name of a tensor term."),
    "tensors_of": ("t", "The names of the tensors a term reads (subscripts included), first occurrence first."),
    "threads_per_block": ("N", "The product of the threadIdx extents bound in the kernel around nest `N`."),
    "with_extent": ("lp, n", "Loop `lp` with its extent replaced by `n`."),
    "with_index": ("lp, i", "Loop `lp` with its index renamed `i`."),
    "with_kind": ("lp, K", "Loop `lp` with its kind replaced by `K`."),
    "writers": ("X", "The number of equations writing tensor `X`."),
}

#: Examples of the value functions no shipped rule uses (the others show a shipped use):
#: ``name -> (value expression, what it gives)``; ``tests/test_docs.py`` parses each expression.
VALUE_FUNCTION_EXAMPLES: dict[str, tuple[str, str]] = {
    "drop": ("drop(loops_of(?N), 0)", "the loops of N without its outermost one"),
    "index_in": ("index_in(indices_of(loops_of(?N)), ?i) >= 1", "index ?i is not N's outermost loop"),
    "insert_at": ("insert_at(loops_of(?N), 1, loop(?M, 0))", "N's loops with M's first loop inserted second"),
    "kind_of": ("kind_of(?N, 0) == B", "N's outermost loop is bound to a thread or block axis"),
    "loop": ("loop(?N, 0)", "N's outermost loop, to splice into a loops template"),
    "loop_pos": ("loop_pos(?N, ?a)", "where the loop of index ?a sits in N"),
    "readers": ("readers(?X) == 1", "exactly one equation reads X"),
    "replace_at": ("replace_at(loops_of(?N), 0, with_kind(loop(?N, 0), P))", "N's loops, the outermost parallel"),
    "subscripts_of": ("subscripts_of(?site)", "the subscript list of the matched tensor access"),
    "tensor_name": ("tensor_name(?site)", "the name of the matched tensor access"),
    "window_spans": ("window_spans(?l, loops_of(?N))", "per entry of subscript ?l, the extent of the box it reads over N's loops"),
    "with_extent": ("with_extent(loop(?N, 0), 4)", "N's outermost loop with extent 4"),
    "with_index": ("with_index(loop(?N, 0), ?io)", "N's outermost loop renamed to a fresh index ?io"),
    "with_kind": ("with_kind(loop(?N, 0), U)", "N's outermost loop, unrolled"),
    "writers": ("writers(?X) == 1", "exactly one equation writes X"),
}

_ROLE = re.compile(r":(?:func|data|class|meth|mod|attr):`~?([^`]+)`")


def md(doc: str) -> str:
    """A docstring as one Markdown paragraph: RST ``code`` and ``:func:`x``` roles become
    Markdown code spans, lines are joined (blank lines keep a paragraph break)."""
    text = inspect.cleandoc(doc or "")
    text = _ROLE.sub(lambda m: f"`{m.group(1)}`", text)
    text = text.replace("``", "`")
    paras = []
    for p in re.split(r"\n\s*\n", text):
        items: list[str] = []
        for line in p.splitlines():
            if not line.strip():
                continue
            if re.match(r"\s*[*-] ", line) or not items:
                items.append(line.strip())
            else:
                items[-1] += " " + line.strip()
        if items:
            paras.append("\n".join(items))
    return "\n\n".join(paras)


def _shipped_rules(directory=None) -> list[tuple[str, dict]]:
    """``(id, data)`` of the rules whose uses illustrate the page: the ``*.yaml`` files of
    ``directory`` (default: the shipped rules), or the files of a list (``stp rules docs
    --rules DIR``: the shipped rules and the user's)."""
    from ..resources import rules_dir

    out = []
    files = list(directory) if isinstance(directory, (list, tuple)) else \
        sorted(Path(directory or rules_dir()).glob("*.yaml"))
    for f in files:
        data = yaml.safe_load(f.read_text(encoding="utf-8"))
        if isinstance(data, dict):
            out.append((str(data.get("id", f.stem)), data))
    return out


def _strings(node, path: str):
    """``(field path, string)`` for every string under ``node`` (a ``pattern:`` value, LEIR
    text, is skipped: its ``max(``/``exp(`` are LEIR functions, not value functions)."""
    if isinstance(node, str):
        yield path, node
    elif isinstance(node, dict):
        for k, v in node.items():
            if k != "pattern":
                yield from _strings(v, f"{path}.{k}" if path else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _strings(v, f"{path}[{i}]")


def _shipped_recipes() -> list[tuple[str, dict]]:
    """``(id, data)`` of the shipped recipes (``rules/recipes/*.yaml``), their value
    expressions searched like the rules' (only the shipped ones: the page is deterministic)."""
    from ..engine.recipes import load_recipes
    from ..resources import rules_dir

    return [(r.id, r.spec) for r in load_recipes([rules_dir() / "recipes"])]


def _uses(rules, sections: tuple[str, ...], name: str) -> list[tuple[str, str, str]]:
    """``(rule id, field, text)`` of the strings of ``sections`` that call ``name(``."""
    call = re.compile(rf"(?<![\w?.]){re.escape(name)}\(")
    out = []
    for rid, data in rules:
        for sec in sections:
            for fld, s in _strings(data.get(sec), sec):
                if call.search(s):
                    out.append((rid, fld, " ".join(s.split())))
    return out


def _example(uses) -> str:
    if not uses:
        return ""
    rid, fld, text = min(uses, key=lambda u: (len(u[2]), u[0], u[1]))
    return f"Example (`{rid}`, `{fld}`): `{text}`"


def _users(rule_ids) -> str:
    ids = sorted(set(rule_ids))
    if not ids:
        return "No shipped rule uses it yet."
    more = f" and {len(ids) - 8} more" if len(ids) > 8 else ""
    return "Used by " + ", ".join(f"`{i}`" for i in ids[:8]) + more + "."


def _yaml_block(step) -> str:
    text = yaml.safe_dump(step, sort_keys=False, allow_unicode=True, width=110, default_flow_style=None)
    return "```yaml\n" + text.rstrip() + "\n```"


def _documented(name: str, fn):
    """``fn``, or, for an undocumented wrapper (a lambda registered under ``name``), the function
    ``name`` or ``_name`` of the module that registers it when that one has a docstring."""
    if (fn.__doc__ or "").strip():
        return fn
    mod = sys.modules.get(getattr(fn, "__module__", "") or "")
    for attr in (name, f"_{name}"):
        f = getattr(mod, attr, None)
        if callable(f) and (f.__doc__ or "").strip():
            return f
    return fn


def _value_args(name: str, arity: int, fn) -> str:
    fn = _documented(name, fn)
    if name in VALUE_FUNCTION_DOCS:
        return VALUE_FUNCTION_DOCS[name][0]
    m = re.match(rf"``{re.escape(name)}\(([^`]*)\)``", inspect.cleandoc(fn.__doc__ or ""))
    if m:
        return m.group(1)
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return ", ".join(f"a{k}" for k in range(max(arity, 0)))
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if names and names[0] == "ctx":
        names = names[1:]
    if arity < 0:
        return ", ".join(names) + ", ..."
    return ", ".join(names[:arity])


def _value_meaning(name: str, fn) -> str:
    doc = md(_documented(name, fn).__doc__ or "")
    doc = re.sub(rf"^`{re.escape(name)}\([^`]*\)`:\s*", "", doc)
    if doc:
        return doc[:1].upper() + doc[1:]
    return VALUE_FUNCTION_DOCS.get(name, ("", ""))[1]


#: What the page says where a registry entry has no meaning (tests/test_docs.py fails on it).
UNDOCUMENTED = "*Undocumented: add a docstring (see `steptp.rules.docgen`).*"


def _schema_fields() -> list[str]:
    from .schema import RULE_SCHEMA

    props = RULE_SCHEMA["properties"]
    out = list(props)
    out += [f"difficulty.{k}" for k in props["difficulty"]["properties"]]
    out += [f"tests.{k}" for k in props["tests"]["items"]["properties"]]
    return out


def _fresh_kinds() -> list[str]:
    from .schema import _FRESH

    return [f"fresh.{k}" for k in _FRESH["oneOf"][1]["properties"]]


def _registries():
    from ..engine import apply as _apply  # noqa: F401  (imports every module that registers)
    from ..engine import mathprims as _m  # noqa: F401
    from ..engine import values as _v  # noqa: F401
    from ..engine.domains import DOMAIN_MODIFIERS, DOMAINS, VALUE_FUNCTIONS
    from ..engine.egraph import RELATIONS
    from ..engine.filters import EXTRA_DOMAIN_KEYS, EXTRA_DOMAINS, FILTERS
    from ..engine.primitives import PRIMITIVES

    return RELATIONS, FILTERS, DOMAINS, DOMAIN_MODIFIERS, EXTRA_DOMAINS, EXTRA_DOMAIN_KEYS, VALUE_FUNCTIONS, PRIMITIVES


def undocumented() -> list[str]:
    """Registry names and rule fields :func:`rule_language_page` would describe with no
    meaning (no docstring, no entry in the tables above): ``kind: name`` strings, sorted."""
    rel, filters, domains, modifiers, extra, _keys, values, prims = _registries()
    out = [f"field: {f}" for f in _schema_fields() + _fresh_kinds() if f not in FIELD_DOCS]
    out += [f"relation: {n}" for n, s in rel.items() if not s.doc.strip()]
    out += [f"filter: {n}" for n, s in filters.items() if not s.doc.strip()]
    out += [f"domain: {n}" for n in (*domains, *modifiers) if n not in DOMAIN_DOCS]
    out += [f"domain: {n}" for n, fn in extra.items() if not (fn.__doc__ or "").strip()]
    out += [f"value function: {n}" for n, (_a, fn) in values.items() if not _value_meaning(n, fn)]
    out += [f"primitive: {n}" for n, s in prims.items() if not s.doc.strip()]
    return sorted(out)


def rule_language_page(rules_directory=None) -> str:
    """The Markdown text of ``docs/rule-language.md`` (deterministic); ``rules_directory``:
    where the examples come from (a directory or a list of rule files; default: the shipped
    rules). A registry name or
    rule field without a meaning (:func:`undocumented`) is shown as :data:`UNDOCUMENTED`;
    ``tests/test_docs.py`` fails on it."""
    from ..engine import cot
    from .schema import CATEGORIES, PRECONDITIONS, RULE_SCHEMA, SCOPES

    rel, filters, domains, modifiers, extra, extra_keys, values, prims = _registries()
    rules = _shipped_rules(rules_directory)
    required = set(RULE_SCHEMA["required"])
    test_required = {"before"}
    L: list[str] = []
    w = L.append
    w("# Rule language reference")
    w("")
    w("<!-- Generated by `stp rules docs -o docs/rule-language.md` from the engine's registries and the "
      "shipped rules; do not edit by hand (tests/test_docs.py checks it is current). -->")
    w("")
    w("A strategy is one YAML file in `rules/`: a **pattern** that finds sites, **preconditions**, "
      "**parameter domains**, **fresh names**, a list of generic **rewrite primitives**, a **chain of "
      "thought** template and its own **tests**. The engine has no strategy-specific code: everything "
      "below is what a rule may name. Examples are taken from the shipped rules. A guide with worked "
      "examples: [Writing a rule](writing-rules.md).")
    w("")
    w(f"Counts: {len(rel)} relations, {len(filters)} filters, "
      f"{len(domains) + len(extra)} parameter domains, {len(values)} value functions, "
      f"{len(prims)} rewrite primitives, {len(rules)} shipped rules.")
    w("")
    # -- fields
    w("## Fields of a rule file")
    w("")
    w("| field | required | meaning |")
    w("|---|---|---|")
    for f in RULE_SCHEMA["properties"]:
        w(f"| `{f}` | {'yes' if f in required else 'no'} | {FIELD_DOCS.get(f, UNDOCUMENTED)} |")
    w("")
    w("`difficulty` holds:")
    w("")
    for k in RULE_SCHEMA["properties"]["difficulty"]["properties"]:
        w(f"* `{k}`: {FIELD_DOCS.get('difficulty.' + k, UNDOCUMENTED)}")
    w("")
    w("Each item of `tests` holds:")
    w("")
    for k in RULE_SCHEMA["properties"]["tests"]["items"]["properties"]:
        w(f"* `{k}`{' (required)' if k in test_required else ''}: {FIELD_DOCS.get('tests.' + k, UNDOCUMENTED)}")
    w("")
    w("Each entry of `fresh` is one of:")
    w("")
    for k in _fresh_kinds():
        w(f"* `{k.split('.', 1)[1]}`: {FIELD_DOCS.get(k, UNDOCUMENTED)}")
    w("")
    w("Categories: " + ", ".join(f"`{c}`" for c in CATEGORIES) + ".")
    w("")
    w("Preconditions (`preconditions:`, the paper's checks of App. A.2, in its order):")
    w("")
    for k, p in enumerate(PRECONDITIONS, 1):
        w(f"{k}. `{p}`: {PRECONDITION_DOCS.get(p, '')}")
    w("")
    w("The loader checks the shape against a JSON Schema, then the meaning (patterns parse, every "
      "metavariable a template uses is bound, relations and primitives exist, `K` equals the number of "
      "preconditions, a stated level matches the score, the CoT template exists, the tests' LEIR parses). "
      "Errors name the file and the field: `rules/loop_split.yaml: params.f.divisors_of: 3.5 is not of "
      "type 'string', 'integer'`.")
    w("")
    # -- scopes
    w("## Match scopes")
    w("")
    w("`match:` holds exactly one of these keys. Patterns are LEIR text in which any piece may be a "
      "metavariable `?name`; `*?s` in a subscript stands for a run of entries (a list splice).")
    w("")
    for s in SCOPES:
        ex = _example([(rid, f"match.{s}", _flow(d["match"][s])) for rid, d in rules
                       if isinstance(d.get("match"), dict) and s in d["match"]])
        w(f"* `{s}`: {SCOPE_DOCS[s]} {ex}".rstrip())
    w("")
    # -- where
    w("## `where:` clauses")
    w("")
    w("Each item is parsed by the rule grammar (`engine/steptp/leir/pattern.lark`, entry `where_clause`) "
      "and is one of: `rel(?x, ...)` (a relation holds; arguments are metavariables, integers, words or "
      "`_`), `not rel(...)` (it does not hold), an integer comparison such as `?n % 4 == 0` or "
      "`loop_count(?N) >= 2`, `not (rel1(...) and rel2(...))` (no assignment of the group's own "
      "metavariables makes it true), `{term: \"?x\", pattern: \"exp(?y)\"}` (a term matches a pattern) "
      "or `{check: \"value expression\"}` (a condition in the value language, evaluated per site after "
      "matching).")
    w("")
    w("### Relations")
    w("")
    w("Computed by egglog from the program's facts (`steptp.engine.egraph.RELATIONS`); a *function* "
      "returns an integer to compare. Argument sorts: `Nest`/`Eq` are nest and equation ids, `Term` a "
      "subterm, `TL` a subscript or argument list, `Loop` a loop descriptor.")
    w("")
    for name in sorted(rel):
        sig = rel[name]
        kind = f"function → {sig.result}" if sig.result else "relation"
        ex = _example(_uses(rules, ("where",), name))
        w(f"* `{name}`({', '.join(sig.args)}), {kind}: {sig.doc.rstrip('.') or UNDOCUMENTED}." + (f" {ex}" if ex else ""))
    w("")
    # -- filters
    w("## `filter:` checks")
    w("")
    w("Checks that need a computation on the site rather than a Datalog fact: each item is "
      "`{name: {arguments}}` naming an entry of `steptp.engine.filters.FILTERS`. A (site, parameters) "
      "pair is a candidate only when every filter accepts it.")
    w("")
    for name in sorted(filters):
        spec = filters[name]
        w(f"### `{name}`")
        w("")
        w(_args_line(spec.required, spec.optional))
        w("")
        w(md(spec.doc) or UNDOCUMENTED)
        w("")
        steps = [(rid, st) for rid, d in rules for st in (d.get("filter") or []) if isinstance(st, dict) and name in st]
        if steps:
            rid, st = min(steps, key=lambda x: (len(repr(x[1])), x[0]))
            w(f"Example (`{rid}`):")
            w("")
            w(_yaml_block({"filter": [st]}))
            w("")
        w(_users(rid for rid, _st in steps))
        w("")
    # -- domains
    w("## Parameter domains")
    w("")
    w("Each parameter under `params:` has exactly one domain, evaluated per site in YAML order (a "
      "domain may use the site's bindings, earlier parameters and `let` values); `apply_rule` draws "
      "a site, then each parameter, with the run's seed.")
    w("")
    for key in (*domains, *extra):
        meaning = DOMAIN_DOCS.get(key) or md(extra[key].__doc__ or "") or UNDOCUMENTED
        uses = [(rid, f"params.{p}", _flow(spec)) for rid, d in rules for p, spec in (d.get("params") or {}).items()
                if isinstance(spec, dict) and key in spec]
        mods = f" Options: {', '.join(f'`{m}`' for m in extra_keys.get(key, ()))}." if extra_keys.get(key) else ""
        w(f"* `{key}`: {meaning.rstrip('.')}.{mods} {_example(uses)}".rstrip())
    w("")
    w("Modifiers a built-in domain may carry:")
    w("")
    for key in modifiers:
        uses = [(rid, f"params.{p}", _flow(spec)) for rid, d in rules for p, spec in (d.get("params") or {}).items()
                if isinstance(spec, dict) and key in spec]
        w(f"* `{key}`: {DOMAIN_DOCS.get(key, UNDOCUMENTED)}. {_example(uses)}".rstrip())
    w("")
    # -- value functions
    w("## Value functions")
    w("")
    w("A YAML string containing `?` or `(` in `let:`, a parameter domain, a `{check: ...}` clause, a "
      "step's `when:` or a primitive argument is a value expression: metavariables, integers, decimals "
      "(`0.0625`, `1.5e-3`), quoted strings, bare words (string literals), `+ - * / // %`, comparisons, "
      "`and`/`or`/`not`, and the functions below (`steptp.engine.domains.VALUE_FUNCTIONS`). `N` is a "
      "nest, `X` a tensor name, `L` a list, `t` a term, `pos` a loop position (from 0). A bad argument "
      "raises a `ValueExprError` naming the function; a name that is not a value function is refused "
      "when the rule loads (`FILE:LINE:COL: let.r: unknown value function 'slise'; did you mean "
      "'slice'?`).")
    w("")
    w("Arithmetic on integers stays integer (`/` must divide exactly: it computes extents and "
      "factors). A decimal is the exact rational it writes (`0.1` is 1/10, not the nearest double, "
      "as the symbolic check of math rules computes); arithmetic with a decimal, or with a bound float "
      "constant of the program (`?c` matched on `3.0`), is exact rational arithmetic (`1.0/?c` is "
      "1/3), and such a value becomes the nearest float literal where a rewrite uses it. A `let:` "
      "value may be a decimal alone (`r: 0.0625` or `r: \"0.0625\"`): a decimal not inside an "
      "expression is not a string literal.")
    w("")
    sections = ("let", "params", "where", "rewrite", "filter", "fresh")
    recipes = _shipped_recipes()
    for name in sorted(values):
        arity, fn = values[name]
        uses = _uses(rules, sections, name)
        in_recipes = _uses(recipes, ("when", "tries", "steps"), name)
        w(f"### `{name}`")
        w("")
        w(f"`{name}({_value_args(name, arity, fn)})`: {_value_meaning(name, fn) or UNDOCUMENTED}")
        w("")
        ex = _example(uses) or (_example(in_recipes).replace("Example (`", "Example (recipe `", 1)
                                if in_recipes else "")
        if not ex and name in VALUE_FUNCTION_EXAMPLES:
            code, note = VALUE_FUNCTION_EXAMPLES[name]
            ex = f"Example: `{code}`: {note}."
        if ex:
            w(ex)
            w("")
        if uses or not in_recipes:
            w(_users(rid for rid, _f, _t in uses))
        if in_recipes:
            ids = sorted({rid for rid, _f, _t in in_recipes})
            w(("Also used" if uses else "Used") + " by the recipe(s) " + ", ".join(f"`{i}`" for i in ids)
              + " (`rules/recipes/`).")
        w("")
    # -- primitives
    w("## Rewrite primitives")
    w("")
    w("`rewrite:` is a list of steps `{primitive: arguments}` run in order "
      "(`steptp.engine.primitives.PRIMITIVES`). Templates are instantiated with every binding (match, "
      "where, params, let, fresh). A primitive with a *positional* argument also accepts that argument "
      "alone (`- remove_nest: \"?N\"`). Every step may also carry `as: name` (binds `?name` to the nest "
      "or equation the step creates, for later steps) and `when: \"value expression\"` (the step runs "
      "only when it is true). After the steps the result must differ from the input, re-parse to "
      "itself, pass the LEIR analysis with the unchanged signature and pass the GPU preflight wherever "
      "the input did.")
    w("")
    for name in sorted(prims):
        spec = prims[name]
        steps = [(rid, st) for rid, d in rules for st in _rewrite_steps(d) if name in st]
        w(f"### `{name}`")
        w("")
        line = _args_line(spec.required, spec.optional)
        if spec.positional:
            line += f" Positional: `{spec.positional}`."
        w(line)
        w("")
        w(md(spec.doc) or UNDOCUMENTED)
        w("")
        if steps:
            rid, st = min(steps, key=lambda x: (len(repr(x[1])), x[0]))
            w(f"Example (`{rid}`):")
            w("")
            w(_yaml_block({"rewrite": [st]}))
            w("")
        w(_users(rid for rid, _st in steps))
        w("")
    # -- cot
    w("## Chain of thought (`cot:`)")
    w("")
    w(md(cot.__doc__ or ""))
    w("")
    return "\n".join(L).rstrip() + "\n"


def _args_line(required, optional) -> str:
    req = ", ".join(f"`{a}`" for a in required) or "none"
    opt = ", ".join(f"`{a}`" for a in optional)
    return f"Arguments: {req}" + (f"; optional {opt}" if opt else "") + "."


def _flow(spec) -> str:
    """A YAML value on one line (a string as it is)."""
    if isinstance(spec, str):
        return spec
    return yaml.safe_dump(spec, default_flow_style=True, width=10_000, sort_keys=False).strip()


def _rewrite_steps(data: dict) -> list[dict]:
    rw = data.get("rewrite")
    if isinstance(rw, str):
        return [{"replace": rw}]
    return [st for st in (rw or []) if isinstance(st, dict)]


def write_rule_language(path: str | Path, rules_directory=None) -> bool:
    """Write :func:`rule_language_page` to ``path``; True when the file changed."""
    p = Path(path)
    text = rule_language_page(rules_directory)
    old = p.read_text(encoding="utf-8") if p.is_file() else None
    if old == text:
        return False
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text, encoding="utf-8")
    return True


__all__ = ["FIELD_DOCS", "VALUE_FUNCTION_DOCS", "VALUE_FUNCTION_EXAMPLES", "md", "undocumented", "rule_language_page",
           "write_rule_language"]
