"""Running searches and writing their results (``stp search``).

One search per program (:func:`search_program`) writes into its directory:

* ``summary.json``: ``samples`` (Equal, timed candidates), ``speedup`` (the **re-timed**
  speedup of the final best over the root: both timed again interleaved,
  :func:`steptp.runner.timing.compare`, 10 rounds; the median of the paired ratios when its
  95 % interval lies above 1, else 1: no reproducible improvement), ``speedup_best_sample``
  (Runtime_root / Runtime_best from the search's own 3-measurement samples: the best of many
  noisy samples, which overstates), ``strategies`` (distinct strategies on the best
  trajectory), ``efficiency`` (speedup / samples; 0 with no sample), ``best``,
  ``trajectory`` (root first; each step: strategy, site, params, LEIR, time_us, speedup),
  ``curve`` (best speedup after each sample), ``seconds`` (propose / verify / time / total),
  ``confirmed`` (the re-time: root and best medians, speedup, ci, verdict, rounds),
  ``counts`` (nodes per status), ``noop`` (candidates that build to the same code as
  their parent on the device, e.g. a thread binding on the CPU: not timed, not a step) and, for a PyTorch program, ``eager_time_us`` and
  ``speedup_vs_eager`` (PyTorch eager time / best LEIR time, same device and input shapes).
* ``best.leir``: the fastest verified program with its ``%`` header (``stp verify`` loads it).
* ``tree.jsonl``: every node of the search (also rejected ones, with the reason).

:func:`search_many` runs several programs (resumable: a program whose ``summary.json``
exists is skipped) and writes ``report.md`` (a Table 3/4-style row per algorithm, paper
§4.4) with a plot of best speedup vs. samples, and ``run_summary.json``: the programs of the
run, how many were searched, and those that failed, as ``input_errors`` (bad program or
option) apart from ``internal_errors`` (an unexpected exception: a bug or a crash; the CLI
exits 1 when every program failed so). Rejected candidates of a search are neither: they are
nodes of its tree (``counts`` in its ``summary.json``). Metrics follow paper §4.4: search
efficiency in the report = average speedup / average samples.

This module gathers the public names of the modules that do each job:
:mod:`~steptp.search.config` (options), :mod:`~steptp.search.inputs` (program files),
:mod:`~steptp.search.factories` (policy and scorer), :mod:`~steptp.search.driver` (one
program), :mod:`~steptp.search.scheduler` (many programs, rounds), :mod:`~steptp.search.report`
(``report.md``) and :mod:`~steptp.search.export` (chat records). What a runner kind adds to a
summary is the runner's (:mod:`steptp.runner.pack_summary` for GPU packs).
"""

from __future__ import annotations

from ..runner.baseline import eager_time_us
from ..runner.pack_summary import BASELINE_FIELDS, gpu_aggregate
from .config import POLICIES, SIGNALLED, SearchConfig, SearchInputError
from .core import Timer
from .driver import confirmed_record, search_program, summarize
from .export import chat_record, export_chat
from .factories import make_policy, make_scorer
from .inputs import collect_programs, load_program
from .report import load_summaries, table_rows, write_report
from .scheduler import run_summary, search_many

__all__ = ["SearchConfig", "SearchInputError", "search_program", "search_many", "run_summary", "write_report",
           "export_chat", "chat_record", "collect_programs", "load_program", "eager_time_us", "make_policy",
           "make_scorer", "table_rows", "load_summaries", "POLICIES", "Timer", "SIGNALLED", "BASELINE_FIELDS",
           "gpu_aggregate", "confirmed_record", "summarize"]
