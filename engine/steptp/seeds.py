"""The one seed derivation of the package: every seeded draw gets its generator here.

:func:`seeded_rng` joins its parts with ``:`` and seeds ``random.Random`` with that text.
Python seeds a ``str`` with its SHA-512 (version 2 seeding, the same on every platform and
Python 3 release), so the same parts give the same draws everywhere.

One order of parts, the order ``stp dataset`` has always used (so its files are unchanged):

1. the run's seed (``--seed``);
2. the program the draw is about, when it is about one (a source key, a canonical program
   text, a case id);
3. the rule, when it is about one (a rule id);
4. what the draw is for and its counters (``"round2"``, ``"follow-up"``, ``"cap"``,
   ``"draw"``, a sample index...).

Users: ``stp dataset`` (candidate order ``(seed, program key, rule id)``, derived rounds
``(seed, program key, "round<k>")``, follow-ups ``(seed, program key, "follow-up", rule id)``),
:func:`steptp.engine.apply_rule` (``(seed, rule id)``: site and parameters;
``(seed, rule id, "retry")``: the order of the candidates tried after a GPU-preflight
rejection), the engine policy (:mod:`steptp.policy`), the recogniser of ``stp eval``
(through :mod:`steptp.rules.service`), the cost model's samples
(:mod:`steptp.cost_model.learned`) and the evolutionary search. One exception: ``stp rules
coverage`` draws with ``(seed, rule id, program name)``, rule before program, as it always
has, so its tables stay unchanged. The dataset's chat-set filters and mutants
(:mod:`steptp.dataset.difficulty`, :mod:`steptp.dataset.pipeline`,
:mod:`steptp.dataset.mutants`) and the corpus generator keep their own seeded generators, so
the dataset's files stay byte-identical. This module imports nothing
from the package, so every layer may use it.
"""

from __future__ import annotations

import random


def seeded_rng(seed, *scope) -> random.Random:
    """The generator of one seeded draw: ``random.Random(":".join(map(str, (seed, *scope))))``.

    ``seed``: the run's seed (any value with a stable ``str``, normally an ``int``);
    ``scope``: the program, the rule, then the purpose and counters, in that order (module
    docstring), each with a stable ``str``. Never raises for such values."""
    return random.Random(":".join(map(str, (seed, *scope))))


__all__ = ["seeded_rng"]
