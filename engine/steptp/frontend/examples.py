"""Keep the ``.leir`` translations of the bundled example programs up to date.

Every ``examples/*.py`` file is a KernelBench-style program; beside it lives ``NAME.leir``,
its translation by :func:`translate_file` (default dtype of the file). Usage::

    python -m steptp.frontend.examples [DIR]          # (re)write the .leir files
    python -m steptp.frontend.examples --check [DIR]  # exit 1 if one is missing or stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..leir.fileformat import format_leir
from .translate import translate_file

#: default: ``examples/`` under the current directory (run from the repository root)
DEFAULT_DIR = Path("examples")


def example_programs(directory: str | Path = DEFAULT_DIR) -> list[Path]:
    """The ``*.py`` program files of ``directory`` (sorted; ``_*.py`` skipped)."""
    return sorted(p for p in Path(directory).glob("*.py") if not p.name.startswith("_"))


def sync_examples(directory: str | Path = DEFAULT_DIR, check: bool = False) -> list[Path]:
    """Translate every example; with ``check`` only compare. Returns the ``.leir`` paths that
    were stale or missing (rewritten unless ``check``). Raises :class:`TranslationError` if a
    program does not translate."""
    stale = []
    for py in example_programs(directory):
        text = format_leir(translate_file(py).module)
        leir = py.with_suffix(".leir")
        if not leir.exists() or leir.read_text() != text:
            stale.append(leir)
            if not check:
                leir.write_text(text)
    return stale


def main(argv: list[str] | None = None) -> int:
    """Command line entry point; returns the exit status (1: stale files with ``--check``)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("directory", nargs="?", default=str(DEFAULT_DIR))
    ap.add_argument("--check", action="store_true", help="only check; exit 1 if a .leir file is stale")
    args = ap.parse_args(argv)
    stale = sync_examples(args.directory, check=args.check)
    for p in stale:
        print(("stale: " if args.check else "wrote: ") + str(p))
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
