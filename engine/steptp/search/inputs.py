"""The programs a search runs on: program files found under the inputs
(:func:`collect_programs`) and one program loaded (:func:`load_program`)."""

from __future__ import annotations

from pathlib import Path

from .config import SearchInputError


def collect_programs(inputs: list[str | Path]) -> list[Path]:
    """Program files of ``inputs`` by the one rule set of :func:`steptp.programs.discover`
    (directories recursively; a ``.py`` needs ``class Model``; ``X.py`` wins over
    ``X.leir``). Raises :class:`SearchInputError` for a missing path, a file of another type
    or a directory without programs."""
    from ..programs import discover

    out: list[Path] = []
    for raw in inputs:
        try:
            found = discover([raw])
        except (FileNotFoundError, ValueError) as e:
            msg = str(e).replace("input not found: ", "")
            raise SearchInputError(f"{msg}: no such file or directory" if isinstance(e, FileNotFoundError)
                                   else msg) from None
        if not found:
            raise SearchInputError(f"{raw}: no .py or .leir programs")
        out.extend(src.path for src in found)
    return out


def load_program(path: Path, meta: bool = False):
    """``(LeirModule, Translation or None)`` of a ``.leir`` file (parsed and analysed) or a
    PyTorch ``.py`` file (translated; ``meta``: traced on PyTorch's meta device, no data): :func:`steptp.programs.load`. Raises
    :class:`SearchInputError` with one line naming the file."""
    from ..leir import LeirSyntaxError
    from ..leir.analysis import LeirSemanticError
    from ..programs import load

    try:
        return load(path, meta=meta)
    except FileNotFoundError:
        raise SearchInputError(f"{path}: no such file") from None
    except LeirSyntaxError as e:
        raise SearchInputError(str(e).splitlines()[0]) from None
    except LeirSemanticError as e:
        raise SearchInputError(f"{path}: {e}") from None
    except OSError as e:
        raise SearchInputError(f"{path}: cannot read: {e.strerror or e}") from None
    except Exception as e:  # noqa: BLE001 - TranslationError and the program's own errors
        raise SearchInputError(f"{path}: cannot translate: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
                               ) from None


__all__ = ["collect_programs", "load_program"]
