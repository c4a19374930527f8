"""The node's own checkers (issue 44): each program's best runs under NVIDIA ``compute-sanitizer``.

``compute-sanitizer --tool memcheck`` (out-of-bounds and misaligned accesses, hardware
exceptions) and ``--tool initcheck`` (reads of device global memory never written: an
intermediate read before a kernel wrote it) on every checked function, ``--tool racecheck``
(shared-memory data hazards) when its CUDA source declares ``__shared__`` memory, and
``--tool synccheck`` (a ``__syncthreads()`` barrier some threads of the block do not reach,
or other invalid uses of synchronisation primitives) when it calls ``__syncthreads`` or
declares shared memory (issue 52), each in a process of its own that loads
the pack's library and launches the function once on trial 0's reference inputs
(``python -m steptp.gpu.sanitizer PACK REFDIR PROGRAM LIB FUNC``, :func:`launch_main`), each
under a time cap. A finding rejects the program like a wrong output
(:class:`steptp.runner.record.EntryRecord` status ``sanitizer``, the first error line as its
reason).

Output format (NVIDIA, *Compute Sanitizer User Manual*,
https://docs.nvidia.com/compute-sanitizer/ComputeSanitizer/index.html, sections "Memcheck
Tool: Understanding Memcheck Errors" and "Racecheck Tool: Racecheck Report Modes"): every line
of the tool starts with the prefix ``=========``; a memcheck error is a line such as
``========= Invalid __global__ write of size 4 bytes`` followed by indented detail lines,
the run ends with ``========= ERROR SUMMARY: N errors`` (``1 error``); racecheck's analysis
mode reports ``========= Error: Race reported between Write access at ... and Read access
at ...`` and ends with ``========= RACECHECK SUMMARY: N hazards displayed (E errors, W
warnings)``; initcheck ("Initcheck Tool") reports e.g. ``========= Uninitialized __global__
memory read of size 4 bytes`` and synccheck ("Synccheck Tool") e.g. ``========= Barrier error
detected. Divergent thread(s) in block``, each followed by indented detail lines, and both end
with the same ``ERROR SUMMARY`` line as memcheck. ``--error-exitcode`` makes the tool exit
with that code when it found errors.

A program's best is reported only with a clean verdict where the tool can run
(:func:`best_verdict`): where it cannot (the simulated device, no ``compute-sanitizer`` on
the node) the best says so (``unchecked: ...``); where it can but gave no verdict (not run,
over its cap, the deadline) that entry is not reported as the best.

Where the tool is looked for (:func:`find_tool`): ``$STP_COMPUTE_SANITIZER``, ``PATH``,
``/usr/local/cuda*/bin``, ``/opt/nvidia/**``, and the NVIDIA pip packages on ``sys.path``
(``nvidia/**/compute-sanitizer``). On the simulated device no CUDA kernel runs, so nothing is
checked (``sanitizer`` null with the reason).
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from ..runner.record import SanitizerCheck

#: Exit code the tool is asked to return when it reports an error (``--error-exitcode``).
ERROR_EXITCODE = 86
#: Errors printed at most per run (``--print-limit``): the first is the reason.
PRINT_LIMIT = 20
_PREFIX = "========="
_ERROR_SUMMARY = re.compile(r"ERROR SUMMARY:\s*(\d+)\s+errors?")
_RACE_SUMMARY = re.compile(r"RACECHECK SUMMARY:\s*(\d+)\s+hazards?\s+displayed\s*"
                           r"\((\d+)\s+errors?,\s*(\d+)\s+warnings?\)")
_NOT_AN_ERROR = ("COMPUTE-SANITIZER", "ERROR SUMMARY", "RACECHECK SUMMARY", "LEAK SUMMARY",
                 "Target application returned")


def find_tool() -> str | None:
    """Path of an executable ``compute-sanitizer`` (module docstring), or None."""
    env = os.environ.get("STP_COMPUTE_SANITIZER")
    if env and os.access(env, os.X_OK):
        return env
    hit = shutil.which("compute-sanitizer")
    if hit:
        return hit
    pats = ["/usr/local/cuda*/bin/compute-sanitizer", "/usr/local/cuda*/compute-sanitizer/compute-sanitizer",
            "/opt/nvidia/**/compute-sanitizer"]
    pats += [str(Path(p) / "nvidia" / "**" / "compute-sanitizer") for p in sys.path if p and Path(p).is_dir()]
    for pat in pats:
        for f in sorted(glob.glob(pat, recursive=True), reverse=True):
            if os.path.isfile(f) and os.access(f, os.X_OK):
                return f
    return None


#: The tools, in the order they run (each only when :func:`tools_for` selects it).
TOOLS = ("memcheck", "initcheck", "racecheck", "synccheck")


def uses_shared_memory(cuda_source: str, func: str = "main") -> bool:
    """Whether function ``func``'s kernels in a library's CUDA C declare ``__shared__``
    memory (racecheck checks only shared memory)."""
    from ..backend.cuda_runtime import function_source  # noqa: PLC0415

    return "__shared__" in function_source(cuda_source, func)


def uses_barriers(cuda_source: str, func: str = "main") -> bool:
    """Whether function ``func``'s kernels in a library's CUDA C call ``__syncthreads`` (or
    another block barrier: ``__syncwarp``, ``bar.sync``) or declare ``__shared__`` memory
    (whose users synchronise): what synccheck checks."""
    from ..backend.cuda_runtime import function_source  # noqa: PLC0415

    src = function_source(cuda_source, func)
    return any(k in src for k in ("__syncthreads", "__syncwarp", "bar.sync", "__shared__"))


def tools_for(cuda_source: str, func: str = "main") -> list[str]:
    """The tools run on function ``func`` of a library's CUDA C, in order: memcheck and
    initcheck always, racecheck with shared memory, synccheck with barriers or shared memory
    (:func:`uses_shared_memory`, :func:`uses_barriers`)."""
    shared = uses_shared_memory(cuda_source, func)
    return (["memcheck", "initcheck"] + (["racecheck"] if shared else [])
            + (["synccheck"] if shared or uses_barriers(cuda_source, func) else []))


def launcher_argv(pack: str, refdir: str | None, okey: str, where: dict) -> list[str]:
    """The command that launches ``where`` (``{"lib", "func"}``) once: this interpreter
    running :func:`launch_main`."""
    return [sys.executable, "-m", "steptp.gpu.sanitizer", str(pack), str(refdir or "-"), okey, where["lib"],
            where["func"]]


def command(tool_path: str, tool: str, argv: list[str]) -> list[str]:
    """``compute-sanitizer --tool TOOL --error-exitcode 86 --print-limit 20 ARGV...``
    (racecheck: ``--racecheck-report analysis``, one line per hazard found). ``tool``: one
    of :data:`TOOLS`; ``ValueError`` for another."""
    if tool not in TOOLS:
        raise ValueError(f"unknown compute-sanitizer tool {tool!r}")
    cmd = [tool_path, "--tool", tool, "--error-exitcode", str(ERROR_EXITCODE), "--print-limit", str(PRINT_LIMIT)]
    if tool == "racecheck":
        cmd += ["--racecheck-report", "analysis"]
    return cmd + list(argv)


def parse_output(text: str, tool: str) -> tuple[int | None, int | None, str]:
    """``(errors, warnings, first error line)`` of one run's output. ``errors``: racecheck's
    errors from its ``RACECHECK SUMMARY`` when present, else the ``ERROR SUMMARY`` count
    (memcheck, initcheck, synccheck); None when the output has no summary (the tool or the
    program did not finish). ``warnings``: racecheck's warnings (None for the other tools).
    The first error line is the
    first prefixed line that is not a detail (indented) line, a banner or a summary."""
    errors = warnings = None
    m = _ERROR_SUMMARY.search(text)
    if m:
        errors = int(m.group(1))
    if tool == "racecheck":
        r = _RACE_SUMMARY.search(text)
        if r:
            errors, warnings = int(r.group(2)), int(r.group(3))
    first = ""
    for line in text.splitlines():
        if not line.startswith(_PREFIX):
            continue
        body = line[len(_PREFIX):]
        if not body.strip() or body.startswith(("  ", "\t", " \t")):
            continue  # an indented detail line of the error above
        body = body.strip()
        if body.startswith(_NOT_AN_ERROR) or body.startswith("Warning"):
            continue
        first = body[:300]
        break
    return errors, warnings, first


def run_tool(tool_path: str, tool: str, argv: list[str], cap_s: float, env: dict | None = None) -> SanitizerCheck:
    """Run one sanitizer tool over ``argv`` with a time cap (seconds); never raises for the
    program or the tool (a cap hit, a crash: ``errors`` None with the reason)."""
    t0 = time.perf_counter()
    try:
        p = subprocess.run(command(tool_path, tool, argv), capture_output=True, text=True, timeout=cap_s, env=env)
    except subprocess.TimeoutExpired:
        return SanitizerCheck(tool, reason=f"over the {cap_s:g} s cap", seconds=round(time.perf_counter() - t0, 2))
    except OSError as e:
        return SanitizerCheck(tool, reason=f"compute-sanitizer did not start: {e}", seconds=0.0)
    secs = round(time.perf_counter() - t0, 2)
    out = (p.stdout or "") + "\n" + (p.stderr or "")
    errors, warnings, first = parse_output(out, tool)
    if errors is None:
        tail = " | ".join(x.strip() for x in out.strip().splitlines()[-3:])[:300]
        return SanitizerCheck(tool, returncode=p.returncode, seconds=secs,
                              reason=f"no ERROR SUMMARY in the output (exit {p.returncode}): {tail}")
    if errors == 0 and p.returncode not in (0, ERROR_EXITCODE):
        # clean for the tool, but the launch itself failed: no verdict
        tail = " | ".join(x.strip() for x in out.strip().splitlines()[-3:])[:300]
        return SanitizerCheck(tool, errors=None, warnings=warnings, returncode=p.returncode, seconds=secs,
                              reason=f"the launch failed under the tool (exit {p.returncode}): {tail}")
    return SanitizerCheck(tool, errors=errors, warnings=warnings, first_error=first if errors else "",
                          returncode=p.returncode, seconds=secs)


def check_function(pack: str, refdir: str | None, okey: str, where: dict, tool_path: str, cap_s: float,
                   deadline: float | None = None) -> list[SanitizerCheck]:
    """The tools of :func:`tools_for` (memcheck, initcheck; racecheck and synccheck where
    the function uses shared memory or barriers) on the function ``where``, each capped at
    ``cap_s`` (less when ``deadline``, a ``time.perf_counter()`` value, is nearer); stops
    after a finding. A tool the deadline left no time for is recorded with that reason (no
    verdict)."""
    src = (Path(pack) / where["lib"] / "kernel.cu").read_text(encoding="utf-8")
    tools = tools_for(src, where["func"])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    out = []
    for tool in tools:
        cap = cap_s if deadline is None else min(cap_s, deadline - time.perf_counter())
        if cap < 1.0:
            out.append(SanitizerCheck(tool, reason="deadline: the node's time ran out before this check"))
            break
        out.append(run_tool(tool_path, tool, launcher_argv(pack, refdir, okey, where), cap, env))
        if out[-1].finding:
            break
    return out


def absent_reason() -> str | None:
    """Why no sanitizer check can run here (simulated device, tool not found), or None."""
    from ..backend.cuda_runtime import simulated  # noqa: PLC0415

    if simulated():
        return "the simulated CUDA device (CPU builds): no CUDA kernel to check"
    if find_tool() is None:
        return ("compute-sanitizer not found (STP_COMPUTE_SANITIZER, PATH, /usr/local/cuda*/bin, /opt/nvidia, "
                "nvidia pip packages)")
    return None


#: The verdict a best carries where no compute-sanitizer can check it (:func:`unchecked_label`).
UNCHECKED_NO_TOOL = "unchecked: no compute-sanitizer"
UNCHECKED_SIMULATED = "unchecked: simulated device (CPU builds, no CUDA kernel to check)"


def unchecked_label() -> str | None:
    """Where no sanitizer can check anything (:func:`absent_reason`), the verdict a best
    carries instead of ``clean``: :data:`UNCHECKED_SIMULATED` on the simulated device,
    :data:`UNCHECKED_NO_TOOL` on a GPU node without the tool; None where the tool runs (then
    only a clean verdict makes a best)."""
    from ..backend.cuda_runtime import simulated  # noqa: PLC0415

    if simulated():
        return UNCHECKED_SIMULATED
    return UNCHECKED_NO_TOOL if find_tool() is None else None


def best_verdict(rec, unchecked: str | None) -> str | None:
    """The sanitizer verdict under which the record ``rec`` (an Equal
    :class:`~steptp.runner.record.EntryRecord`) may be reported as a program's best:
    ``"clean"`` when every tool that ran on it found nothing; ``unchecked`` (from
    :func:`unchecked_label`) when it was not checked because no tool can run here; None when
    it may not be the best: a finding, or the tool exists but gave no verdict on it (not run,
    over its cap, the deadline, a failed launch)."""
    c = rec.sanitizer_clean()
    if c is True:
        return "clean"
    if c is False:
        return None
    return unchecked


def no_verdict_reason(rec) -> str:
    """Why ``rec`` has no clean verdict (for the summary of a program left without a best)."""
    if rec.sanitizer_clean() is False:
        return rec.reason
    checks = [f"{c.tool}: {c.reason}" for c in rec.sanitizer or [] if c.reason]
    return "no compute-sanitizer verdict (" + ("; ".join(checks) or rec.sanitizer_reason or "not run") + ")"


def launch_main(argv: list[str] | None = None) -> int:
    """``python -m steptp.gpu.sanitizer PACK REFDIR PROGRAM LIB FUNC``: load the library,
    fill the function's tensors with trial 0's inputs (outputs poisoned) and launch it once,
    synchronised. Exit 0 after the launch, 3 when it failed (the error on stderr), 2 for bad
    arguments."""
    from ..backend.errors import BackendError  # noqa: PLC0415
    from . import node  # noqa: PLC0415
    from ..backend import cuda_runtime as cr  # noqa: PLC0415

    a = sys.argv[1:] if argv is None else argv
    if len(a) != 5:
        print("usage: python -m steptp.gpu.sanitizer PACK REFDIR PROGRAM LIB FUNC", file=sys.stderr)
        return 2
    pack, refdir, okey, lib, func = a
    try:
        if okey not in node.manifest(pack)["programs"]:
            print(f"error: no program {okey} in {pack}", file=sys.stderr)
            return 2
        d = node._program(pack, None if refdir == "-" else refdir, okey)
        built, mod = node._load(pack, {"lib": lib, "func": func})
        cr.launch(built, mod, node._fill(d, built, 0))
    except (BackendError, OSError, KeyError, ValueError) as e:
        print(f"error: launch failed: {getattr(e, 'reason', e)}", file=sys.stderr)
        return 3
    print(f"launched {func} of {lib} once")
    return 0


__all__ = ["ERROR_EXITCODE", "TOOLS", "UNCHECKED_NO_TOOL", "UNCHECKED_SIMULATED", "find_tool", "uses_shared_memory",
           "uses_barriers", "tools_for", "launcher_argv", "command", "parse_output", "run_tool", "check_function",
           "absent_reason", "unchecked_label", "best_verdict", "no_verdict_reason", "launch_main"]

if __name__ == "__main__":
    sys.exit(launch_main())
