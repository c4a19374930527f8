"""Locations of the shipped data: rule YAML files and Jinja templates.

The repo-root ``rules/`` and ``templates/`` directories (design card) are installed as the
packages ``steptp._rules`` and ``steptp._templates`` (see ``pyproject.toml``), so they are
found the same way from a source checkout, an editable install and a wheel.
"""

from __future__ import annotations

import os
from functools import lru_cache
from importlib import resources
from pathlib import Path

import jinja2


def rules_dir() -> Path:
    """Directory holding the shipped ``*.yaml`` rule files."""
    return Path(str(resources.files("steptp._rules")))


#: The environment variable naming user rule folders (``:``-separated on POSIX, as ``PATH``),
#: loaded after the shipped rules (and their ``recipes/`` after the shipped recipes); ``--rules
#: DIR`` of the ``stp`` commands adds to it (and so reaches the worker processes those commands
#: start).
RULES_PATH_ENV = "STP_RULES_PATH"


def user_rule_dirs() -> list[Path]:
    """The user rule folders of ``$STP_RULES_PATH`` (:data:`RULES_PATH_ENV`), in order,
    empty entries skipped, ``~`` expanded."""
    env = os.environ.get(RULES_PATH_ENV, "")
    return [Path(p).expanduser() for p in env.split(os.pathsep) if p.strip()]


def templates_dir() -> Path:
    """Directory holding the shipped ``*.j2`` templates (CoT, prompts, answers)."""
    return Path(str(resources.files("steptp._templates")))


@lru_cache(maxsize=1)
def jinja_env() -> jinja2.Environment:
    """Jinja environment over :func:`templates_dir`; undefined variables raise."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=False,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def render(template: str, **context) -> str:
    """Render the named template file (e.g. ``"prompt_single.j2"``) with ``context``."""
    return jinja_env().get_template(template).render(**context).strip()
