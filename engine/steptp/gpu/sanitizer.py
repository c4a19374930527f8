"""The node's own checkers (issue 44): each program's best runs under NVIDIA ``compute-sanitizer``.

``compute-sanitizer --tool memcheck`` (out-of-bounds and misaligned accesses, hardware
exceptions) on every checked function, and ``--tool racecheck`` (shared-memory data hazards)
when its CUDA source declares ``__shared__`` memory, each in a process of its own that loads
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
warnings)``. ``--error-exitcode`` makes the tool exit with that code when it found errors.

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


def uses_shared_memory(cuda_source: str, func: str = "main") -> bool:
    """Whether function ``func``'s kernels in a library's CUDA C declare ``__shared__``
    memory (racecheck checks only shared memory)."""
    from ..backend.cuda_runtime import function_source  # noqa: PLC0415

    return "__shared__" in function_source(cuda_source, func)


def launcher_argv(pack: str, refdir: str | None, okey: str, where: dict) -> list[str]:
    """The command that launches ``where`` (``{"lib", "func"}``) once: this interpreter
    running :func:`launch_main`."""
    return [sys.executable, "-m", "steptp.gpu.sanitizer", str(pack), str(refdir or "-"), okey, where["lib"],
            where["func"]]


def command(tool_path: str, tool: str, argv: list[str]) -> list[str]:
    """``compute-sanitizer --tool TOOL --error-exitcode 86 --print-limit 20 ARGV...``
    (racecheck: ``--racecheck-report analysis``, one line per hazard found)."""
    if tool not in ("memcheck", "racecheck"):
        raise ValueError(f"unknown compute-sanitizer tool {tool!r}")
    cmd = [tool_path, "--tool", tool, "--error-exitcode", str(ERROR_EXITCODE), "--print-limit", str(PRINT_LIMIT)]
    if tool == "racecheck":
        cmd += ["--racecheck-report", "analysis"]
    return cmd + list(argv)


def parse_output(text: str, tool: str) -> tuple[int | None, int | None, str]:
    """``(errors, warnings, first error line)`` of one run's output. ``errors``: racecheck's
    errors from its ``RACECHECK SUMMARY`` when present, else the ``ERROR SUMMARY`` count;
    None when the output has no summary (the tool or the program did not finish).
    ``warnings``: racecheck's warnings (None for memcheck). The first error line is the
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
    """memcheck, and racecheck when the function uses shared memory, each capped at
    ``cap_s`` (less when ``deadline``, a ``time.perf_counter()`` value, is nearer); stops
    after a finding."""
    src = (Path(pack) / where["lib"] / "kernel.cu").read_text(encoding="utf-8")
    tools = ["memcheck"] + (["racecheck"] if uses_shared_memory(src, where["func"]) else [])
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


__all__ = ["ERROR_EXITCODE", "find_tool", "uses_shared_memory", "launcher_argv", "command", "parse_output", "run_tool",
           "check_function", "absent_reason", "launch_main"]

if __name__ == "__main__":
    sys.exit(launch_main())
