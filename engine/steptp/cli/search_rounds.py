"""``stp search --runner pack``: the round search through GPU packs (issue 37), composed here
from the search (:mod:`steptp.search.rounds`) and the GPU front end's pack writer
(:func:`steptp.gpu.pack.build_pack`), so neither imports the other."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import typer

from .common import fail

#: Exit code of a round search that waits for the GPU node's measurements.
EXIT_WAITING = 3


def run_pack_search(programs: list[Path], out: Path, *, algorithm: str, rounds: int, beam: int, measure: int,
                    per_rule: int, seed: int, arch: str, timeout_s: float, quiet: bool, rank: str = "cost",
                    workers: int = 1, levels: int = 1, expand: int = 3, sim: bool = True) -> None:
    """Advance the round search in ``out``; exit 3 with the node's command while it waits for a
    round's measurements, 0 with the summary when done, 2 for bad input. See
    :mod:`steptp.search.rounds`."""
    from ..programs import discover, load
    from ..rules import load_rules
    from ..search.rounds import RoundConfig, RoundsError, search_rounds

    cfg = RoundConfig(algorithm=algorithm, rounds=rounds, beam=beam, measure=measure, per_rule=per_rule, seed=seed,
                      arch=arch, timeout_s=timeout_s, rank="model" if rank.startswith("model") else "cost",
                      levels=levels, expand=expand)
    try:
        sources = discover([str(p) for p in programs])
    except (FileNotFoundError, ValueError) as e:
        fail(str(e))
    progs, names = [], set()
    for src in sources:
        try:
            module, _ = load(src.path)
        except Exception as e:  # noqa: BLE001 - parse/translation errors: one line
            fail(f"{src.path}: {' '.join(str(e).split())[:300]}")
        name = module.signature.name
        while name in names:
            name += "_"
        names.add(name)
        progs.append({"name": name, "text": module.text(),
                      "source": str(Path(src.path).resolve()) if Path(src.path).suffix == ".py" else None})
    if not progs:
        fail("no programs found")

    def write_pack(round_dir: Path, pack_dir: Path) -> dict:
        from ..gpu.pack import build_pack

        return build_pack([str(round_dir)], pack_dir, arch=arch, sim=sim)

    def say(msg: str) -> None:
        if not quiet:
            typer.echo(msg, err=True)

    try:
        res = search_rounds(progs, out, cfg, load_rules(), write_pack, progress=say, workers=workers)
    except RoundsError as e:
        fail(str(e))
    except KeyboardInterrupt:
        fail("interrupted; the round state is kept: rerun the same command to continue", 1)
    except OSError as e:
        fail(f"{getattr(e, 'filename', None) or out}: {e.strerror or e}")
    except Exception as e:  # noqa: BLE001 - one line, never a traceback; the state of finished rounds is kept
        fail(f"search failed: {type(e).__name__}: {' '.join(str(e).split())[:300]}", 1)
    if res["status"] == "waiting":
        cmd = " ".join(shlex.quote(a) for a in sys.argv)
        typer.echo(f"round {res['round']}: waiting for measurements. On the GPU node run:\n"
                   f"  python -m steptp.gpu.run {shlex.quote(res['pack'])} -o {shlex.quote(res['results'])} --time "
                   f"--retime-best 1\n"
                   f"then, with the results copied back to {res['results']}, run this command again:\n  {cmd}")
        raise typer.Exit(EXIT_WAITING)
    for sm in res["summaries"]:
        eager = sm.get("speedup_vs_eager")
        extra = f"  vs eager {eager:.2f}x" if eager is not None else ""
        typer.echo(f"{sm['program']}: {sm['algorithm']}/pack samples {sm['samples']}  speedup {sm['speedup']:.2f}x"
                   f"{extra}  rounds {sm['rounds']}")
    typer.echo(f"wrote {out / 'report.md'}", err=True)
