"""The evaluator of a search (:class:`Measure`): verify every candidate against the ROOT
program, time the Equal ones.

* Verification: :func:`steptp.verify.verify_pair` (root vs. candidate, 3 seeded random +
  2 ordered trials, in a worker process with a time limit). With ``device="cpu"`` the GPU preflight and
  CUDA code generation are skipped (``gpu_check=False``); with ``device="cuda"`` they are
  part of the Build check and the candidate runs on the GPU (``device="cuda"``).
* Timing: :func:`steptp.runner.timing.measure` (a performance build: no NaN poisoning;
  paper App. B.2: TVM ``time_evaluator``, 3 warm-up runs, 3 repetitions), reported in
  microseconds. The median of the repetitions is used.
* Measurement: by the search's runner (:mod:`steptp.runner.base`: ``local`` here, ``pack``
  on a GPU node later), the Equal candidates of a proposal batch together; a pending answer
  raises :class:`steptp.runner.base.Pending`. With a runner that measures elsewhere
  (:attr:`~steptp.runner.base.Runner.measures_here` False) candidates are verified on this
  CPU (with the GPU preflight and CUDA code generation) and again where they are measured;
  programs too large to execute here (:func:`steptp.verify.too_large_to_run_here`) only
  there, at full size.
* Caches: verification results per canonical program text (kept by the driver across the
  runs of a search that waits for its runner), so a program seen twice costs nothing the
  second time.
"""

from __future__ import annotations

import time

from ..leir import LeirModule
from ..runner.base import text_key
from .core import Evaluation, canonical




class RootFailed(RuntimeError):
    """The root program cannot be timed (the search has no reference runtime)."""


class TargetUnavailable(RuntimeError):
    """The requested device (e.g. ``cuda``) is not present on this machine."""


def cuda_problem() -> str:
    """'' when CUDA programs can be built, run and timed here, else one line saying what is
    missing (:func:`steptp.backend.cuda_runtime.cuda_available`)."""
    from ..backend.cuda_runtime import cuda_available

    return cuda_available() or ""


class Measure:
    """The verify-then-measure evaluator of one search (see the module docstring).

    ``root``: the program every candidate is compared with; ``name``: its name in the search
    (the runner's program key). ``device``: ``cpu`` or ``cuda`` (``stp search --device``).
    ``runner``: a :class:`steptp.runner.base.Runner` (default: the ``local`` runner on
    ``device`` with ``timer``). With a runner that measures here candidates are verified on
    ``device``; with another (a GPU node answering later) on this CPU with the GPU preflight and CUDA code
    generation (``gpu_check``), and again on the node. ``trials``/``seed``: verification
    trials (paper: 3). ``timeout_s``: time limit of one verification. ``verified``: a dict
    (canonical text -> ``{"equal", "reason"}``) kept by the caller across runs (a replayed
    search verifies nothing twice). ``entry``: ``fn(module, steps) -> dict`` the payload a
    remote runner ships. Raises :class:`TargetUnavailable` (``cuda`` missing with the local
    runner) and :class:`RootFailed` (the root cannot be timed locally)."""

    def __init__(self, root: LeirModule, device: str = "cpu", trials: int = 3, seed: int = 0,
                 timeout_s: float = 120.0, repeat: int = 3, warmup: int = 3, timer=None, *, runner=None,
                 name: str | None = None, verified: dict | None = None, entry=None):
        if device not in ("cpu", "cuda"):
            raise ValueError(f"unknown device {device!r} (cpu or cuda)")
        self.root, self.device, self.trials, self.seed, self.timeout_s = root, device, trials, seed, timeout_s
        self.timer = timer
        self.name = name or root.signature.name
        self.verified = {} if verified is None else verified
        self.entry = entry
        self._funcs: dict = {}
        if runner is None:
            from ..runner import kinds  # noqa: PLC0415

            runner = kinds.create("local", device=device, repeat=repeat, warmup=warmup, timer=timer)
        self.runner = runner
        #: the runner verifies and measures on this machine's device (else elsewhere, later)
        self.here = bool(runner.measures_here)
        from ..verify import too_large_to_run_here  # noqa: PLC0415

        #: too large to execute on this CPU: only the static checks here, verified on the node
        self.at_size = not self.here and bool(too_large_to_run_here(root))
        why = cuda_problem() if self.here and device == "cuda" else ""
        if why:
            raise TargetUnavailable(f"--device cuda: {why}")
        try:
            self.root_time_us = runner.root_time_us(self.name, root)
        except Exception as e:  # noqa: BLE001 - LoweringError/BuildError/ExecError of the timing build
            raise RootFailed(f"the root program cannot be timed: {' '.join(str(e).split())[:300]}") from None

    def same_code(self, parent: LeirModule, module: LeirModule) -> bool:
        """True when ``module`` builds to the same code as ``parent`` on this device, so
        timing it would measure the parent again: on ``cpu``, their performance-form PrimFuncs
        are structurally equal up to the names of variables and loops
        (``tvm_ffi.structural_equal(..., map_free_vars=True)``; a ``B`` loop is a serial loop
        there, so a thread binding changes nothing). Always False on ``cuda`` and with a custom
        ``timer``. Never raises (a program that does not lower is not called a no-op)."""
        if self.device != "cpu" or self.timer is not None:
            return False
        try:
            import tvm_ffi  # noqa: PLC0415

            return bool(tvm_ffi.structural_equal(self._perf_func(parent), self._perf_func(module),
                                                 map_free_vars=True))
        except Exception:  # noqa: BLE001
            return False

    def _perf_func(self, module: LeirModule):
        from ..backend.build import parse_tvmscript  # noqa: PLC0415
        from ..backend.perf import perf_cpu_text  # noqa: PLC0415

        key = canonical(module)
        hit = self._funcs.get(key)
        if hit is None:
            hit = self._funcs[key] = parse_tvmscript(perf_cpu_text(module))
        return hit

    def verify(self, module: LeirModule) -> dict:
        """``{"equal", "reason"}`` of ``module`` against the root (3 random + 2 ordered
        trials; cached by canonical text in :attr:`verified`). With a remote runner and a root
        too large to run here (:func:`steptp.verify.too_large_to_run_here`, :attr:`at_size`) only the checks that execute nothing
        (:func:`steptp.verify.static_check`: GPU preflight, CUDA code generation), ``"where":
        "node"``: the node verifies it at full size before timing it, and only its verdict
        makes a sample."""
        from ..verify import verify_pair  # noqa: PLC0415

        key = canonical(module)
        hit = self.verified.get(key)
        if hit is None:
            if self.here:
                res = verify_pair(self.root, module, trials=self.trials, seed=self.seed, isolated=True,
                                  timeout_s=self.timeout_s, gpu_check=self.device == "cuda",
                                  device=None if self.device == "cpu" else self.device)
            elif self.at_size:
                from ..backend.errors import BackendError  # noqa: PLC0415
                from ..runner.pool import shared  # noqa: PLC0415
                from ..verify import static_check_texts  # noqa: PLC0415

                try:  # in the "check" worker: a time limit and an address-space cap
                    ok, why = shared("check", self.timeout_s).call(static_check_texts, self.root.text(), module.text())
                except BackendError as e:  # WorkerFailure: killed at its time limit, or crashed
                    ok, why = False, f"static check: {e}"
                hit = self.verified[key] = {"equal": bool(ok), "reason": why, "where": "node"}
                return hit
            else:
                from ..runner.pool import shared  # noqa: PLC0415

                res = verify_pair(self.root, module, trials=self.trials, seed=self.seed, timeout_s=self.timeout_s,
                                  gpu_check=True, runner=shared("verify", self.timeout_s))
            hit = self.verified[key] = {"equal": bool(res.equal), "reason": res.reason or ("" if res.equal
                                                                                          else "not equal")}
        return hit

    def evaluate(self, module: LeirModule) -> Evaluation:
        """:meth:`evaluate_batch` of one single-step candidate."""
        return self.evaluate_batch([(module, [])])[0]

    def evaluate_batch(self, items: list[tuple[LeirModule, list]]) -> list[Evaluation]:
        """Verify each ``(module, steps)`` against the root (``steps``:
        :class:`steptp.policy.steps.Step` objects; a multi-step proposal step by step: it is
        cut at its first step that does not verify, ``Evaluation.steps`` the steps kept), then measure the Equal ones as one batch through the runner. Raises
        :class:`steptp.runner.base.Pending` when the runner has not answered yet (nothing
        verified is lost: :attr:`verified`)."""
        from ..runner.base import MeasureInput, Pending  # noqa: PLC0415

        evs: list[Evaluation] = []
        todo: list[tuple[int, LeirModule, list]] = []
        for module, steps in items:
            ev = Evaluation("not_equal", seconds={"verify": 0.0, "time": 0.0})
            t0 = time.perf_counter()
            kept = len(steps)
            for j, st in enumerate(steps[:-1]):
                v = self.verify(LeirModule(self.root.signature, st.program.program))
                if not v["equal"]:
                    kept = j
                    break
            if steps and kept < len(steps):
                if kept == 0:
                    first = LeirModule(self.root.signature, steps[0].program.program)
                    ev.reason = f"step 1 ({steps[0].rule}) does not verify: {self.verify(first)['reason']}"
                    ev.seconds["verify"] = time.perf_counter() - t0
                    evs.append(ev)
                    continue
                module = LeirModule(self.root.signature, steps[kept - 1].program.program)
                steps = steps[:kept]
            v = self.verify(module)
            ev.seconds["verify"] = time.perf_counter() - t0
            ev.verify = dict(v)
            ev.steps = len(steps)
            if not v["equal"]:
                ev.reason = v["reason"]
            else:
                todo.append((len(evs), module, steps))
            evs.append(ev)
        if not todo:
            return evs
        t0 = time.perf_counter()
        inputs = [MeasureInput(f"{self.name}:{text_key(canonical(m))}", self.name, self.root, m,
                               entry=self.entry(m, st) if self.entry is not None else None) for _, m, st in todo]
        futs = self.runner.run(inputs)
        if not all(f.done() for f in futs):
            raise Pending(f"{self.name}: {sum(not f.done() for f in futs)} measurement(s) pending")
        spent = (time.perf_counter() - t0) / len(todo)
        for (i, _, _), f in zip(todo, futs):
            r = f.result()
            ev = evs[i]
            ev.seconds["time"] = spent
            ev.status, ev.reason = r.status, r.reason
            if r.status == "equal":
                ev.time_us, ev.speedup = r.time_us, (r.speedup if not self.here else None)
        return evs

    def retime(self, module: LeirModule, steps: list | None = None):
        """The runner's re-time of ``module`` against the root (:class:`MeasureResult`), or
        raises :class:`steptp.runner.base.Pending`."""
        from ..runner.base import MeasureInput, Pending  # noqa: PLC0415

        x = MeasureInput(f"{self.name}:{text_key(canonical(module))}", self.name, self.root, module, purpose="retime",
                         entry=self.entry(module, steps or []) if self.entry is not None else None)
        f = self.runner.run([x])[0]
        if not f.done():
            raise Pending(f"{self.name}: the re-time is pending")
        return f.result()
