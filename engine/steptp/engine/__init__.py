"""Rule engine: egglog matching (patterns + Datalog preconditions), generic primitives,
single-site application with seeded parameters.

Public API::

    find_sites(rule, module) -> list[Site]
    list_candidates(rule, module) -> list[(Site, params)]
    apply_rule(rule, module, seed=0, site=None, params=None) -> Step   # raises NoMatch
"""

from . import values as _values  # noqa: F401 - registers the rule-language value functions (all of them)
from . import structural as _structural  # noqa: F401 - registers the structural rewrite primitives
from . import tiling as _tiling  # noqa: F401 - registers the GPU tiling value functions
from .apply import (NoMatch, PreflightRejected, Step, apply_rule, checked_candidates, list_candidates,
                    new_preflight_problems, site_nests)
from .match import CompileError, Matcher, Site, compile_rule, find_sites, find_sites_many
from .primitives import Change, EqRef, NestRef, RewriteError
from . import mathprims  # noqa: F401,E402 - registers the algebra primitive, filter and domains
from . import magnitude  # noqa: F401,E402 - registers the no_overflow filter
from . import signs  # noqa: F401,E402 - registers the provably filter

__all__ = ["NoMatch", "PreflightRejected", "checked_candidates", "new_preflight_problems", "Step", "apply_rule", "list_candidates", "site_nests", "Site", "find_sites", "find_sites_many",
           "Matcher", "compile_rule", "CompileError", "RewriteError", "Change", "NestRef", "EqRef"]
