"""Writing programs: :func:`generate_program` (one program of a named type),
:func:`generate_corpus` (a seeded directory of them, types in a balanced seeded order) and
:func:`parse_header`."""

from __future__ import annotations

import hashlib
import json
import random
import re
from pathlib import Path
from typing import Any, Iterable, Sequence

from .builder import CorpusError, DEFAULT_BUDGET, DTYPE_WEIGHTS, DTYPES, _HEADER_TAG, _index
from .render import _norm_dtype, program_source
from .catalogue import PROGRAM_TYPES




def generate_program(type_name: str, rng: random.Random | int, dtype: str = "float32",
                     budget: int = DEFAULT_BUDGET, *, seed: int | None = None) -> str:
    """Generate the Python source of one program of type ``type_name``.

    ``rng`` is a ``random.Random`` (consumed) or an int seed (then it is also the recorded
    seed). ``dtype`` is ``float16``/``float32``/``float64`` (aliases ``f16``... accepted);
    float16 falls back to float32 when a component has no float16 CPU kernel. ``budget`` bounds
    the estimated work (FLOPs + input elements). ``seed`` is only recorded in the header.
    Deterministic: the same arguments give the same text. Raises :class:`CorpusError` for an
    unknown type or dtype, or a budget too small for the type's smallest shapes.
    """
    if type_name not in PROGRAM_TYPES:
        raise CorpusError(f"unknown program type {type_name!r} ({len(PROGRAM_TYPES)} types known)")
    return program_source(PROGRAM_TYPES[type_name], rng, dtype, budget, seed=seed)


def program_seed(seed: int, index: int, salt: str = "program") -> int:
    """The seed of program ``index`` in a corpus generated with ``seed`` (32-bit, stable)."""
    h = hashlib.sha256(f"stp-corpus:{salt}:{seed}:{index}".encode()).digest()
    return int.from_bytes(h[:4], "big")


def _type_order(names: list[str], seed: int, count: int) -> list[str]:
    out: list[str] = []
    rnd = 0
    while len(out) < count:
        r = random.Random(program_seed(seed, rnd, "order"))
        perm = list(names)
        for i in range(len(perm) - 1, 0, -1):       # Fisher-Yates on rng.random() only
            j = _index(r.random(), i + 1)
            perm[i], perm[j] = perm[j], perm[i]
        out.extend(perm)
        rnd += 1
    return out[:count]


def generate_corpus(outdir: str | Path, count: int, seed: int = 0, budget: int = DEFAULT_BUDGET,
                    types: Iterable[str] | None = None, *, dtypes: Sequence[str] | None = None) -> list[Path]:
    """Write ``count`` programs to ``outdir`` and return their paths (in order).

    Types are taken round-robin in a seeded shuffle of ``types`` (default: all of
    :data:`PROGRAM_TYPES`), so ``count >= len(types)`` covers every type. Program ``i`` is
    ``outdir/{i:05d}_{type}.py``, generated with seed :func:`program_seed` ``(seed, i)`` and a
    dtype drawn from ``dtypes`` (default float16/32/64 weighted by :data:`DTYPE_WEIGHTS`).
    Also writes ``outdir/corpus.json`` (arguments and one line per program) and removes corpus
    programs left in ``outdir`` by an earlier run that this one did not write (other files are
    never touched). Same arguments, byte-identical files.
    """
    if count < 0:
        raise CorpusError("count must be >= 0")
    names = sorted(PROGRAM_TYPES) if types is None else list(dict.fromkeys(types))
    for n in names:
        if n not in PROGRAM_TYPES:
            raise CorpusError(f"unknown program type {n!r}")
    if not names:
        raise CorpusError("no program types selected")
    if dtypes is None:
        choices, weights = list(DTYPES), list(DTYPE_WEIGHTS)
    else:
        choices = [_norm_dtype(d) for d in dtypes]
        weights = [1.0] * len(choices)
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    order = _type_order(names, seed, count)
    paths: list[Path] = []
    manifest = []
    for i, tname in enumerate(order):
        pseed = program_seed(seed, i)
        u = random.Random(program_seed(seed, i, "dtype")).random() * sum(weights)
        dtype = choices[-1]
        for c, w in zip(choices, weights):
            u -= w
            if u < 0:
                dtype = c
                break
        src = generate_program(tname, pseed, dtype, budget)
        p = out / f"{i:05d}_{tname}.py"
        p.write_text(src)
        paths.append(p)
        manifest.append({"file": p.name, "type": tname, "category": PROGRAM_TYPES[tname].category,
                         "seed": pseed, "dtype": dtype})
    keep = {p.name for p in paths}
    for stale in sorted(out.glob("*.py")):      # programs of an earlier, larger run in the same dir
        if stale.name not in keep and re.fullmatch(r"\d{5,}_\w+\.py", stale.name):
            with stale.open() as fh:
                if fh.read(len(_HEADER_TAG)) == _HEADER_TAG:
                    stale.unlink()
    (out / "corpus.json").write_text(json.dumps(
        {"seed": seed, "count": count, "budget": budget, "types": len(names), "programs": manifest},
        indent=1) + "\n")
    return paths


def parse_header(source: str | Path) -> dict:
    """The ``# key: value`` header of a corpus program (from its text or path) as a dict.

    ``seed``, ``budget`` and ``work`` become ints; ``components`` a list. Empty dict when
    the text is not a corpus program.
    """
    text = source.read_text() if isinstance(source, Path) else str(source)
    if not text.startswith(_HEADER_TAG):
        if "\n" not in text and Path(text).exists():
            text = Path(text).read_text()
        if not text.startswith(_HEADER_TAG):
            return {}
    info: dict[str, Any] = {}
    for line in text.splitlines()[1:]:
        m = re.match(r"# (\w+): (.*)$", line)
        if not m:
            break
        info[m.group(1)] = m.group(2)
    for k in ("seed", "budget", "work"):
        if k in info and info[k].lstrip("-").isdigit():
            info[k] = int(info[k])
    info["components"] = [c for c in info.get("components", "").split(" -> ") if c]
    if "requested_dtype" in info:
        info["requested_dtype"] = info["requested_dtype"].split()[0]
    return info
