#!/bin/bash
# The whole GPU measurement of one round on the node (issue 44), within DEADLINE_S seconds:
# install the carried apache-tvm-ffi wheel, then ONE `python -m steptp.gpu.run` call that
#   1. verifies every entry on the GPU against the CPU references computed on the node and
#      times each Equal one interleaved with the original (at most ENTRIES_SHARE % of the time),
#   2. re-times each program's fastest entry (--retime-best 1),
#   3. runs each re-timed best under compute-sanitizer (memcheck and initcheck; racecheck and
#      synccheck where it uses shared memory or barriers), SAN_JOBS at once, SAN_CAP_S each; a
#      finding rejects it, and a best the tool could check but did not is not reported,
#   4. measures the baselines per program against our best, interleaved (baselines.jsonl):
#      eager and ours from Python, eager in a CUDA graph against our kernels (BASE_CAP_S
#      each), then torch.compile default and max-autotune-no-cudagraphs (COMPILE_CAP_S per
#      compilation), programs the deadline does not reach named with that reason.
# Every phase runs under the run's deadline and each worker call under its cap, so the call
# ends by DEADLINE_S; results.jsonl / retime.jsonl are appended entry by entry and
# baselines.jsonl is rewritten after each phase, so OUTDIR keeps what finished even when a
# cap or the deadline hits (or the outer `timeout` has to stop the call).
#
#   usage: benchmarks/gpu_at_size.sh PACK OUTDIR WHEEL_DIR DEADLINE_S
#
# PACK: OUT/rounds/<k>/pack built here (stp search ... --runner pack --no-sim); OUTDIR: the
# results directory (copy it to OUT/rounds/<k>/results here and rerun the stp search
# command); WHEEL_DIR: a folder holding the cp312 apache_tvm_ffi wheel (used only when the
# node lacks tvm_ffi); DEADLINE_S: seconds for the whole script (660 fits 12 minutes of device
# time with the machine's start). Tunables (environment): ENTRIES_SHARE (45), SAN_CAP_S (90),
# SAN_JOBS (4), BASE_CAP_S (60), COMPILE_CAP_S (120), REPEAT (8), MIN_MS (2).
# Exit: gpu.run's (0 entries ran, 1 none ran, 2 bad pack), 124 when the outer timeout hit.
set -u
pack=${1:?usage: gpu_at_size.sh PACK OUTDIR WHEEL_DIR DEADLINE_S}
outdir=${2:?OUTDIR}; wheels=${3:?WHEEL_DIR}; deadline=${4:?DEADLINE_S}
case $deadline in ''|*[!0-9]*) echo "error: DEADLINE_S must be whole seconds, got '$deadline'" >&2; exit 2;; esac
[ -f "$pack/manifest.json" ] || { echo "error: $pack is not a pack (no manifest.json)" >&2; exit 2; }
t0=$(date +%s)
mkdir -p "$outdir" || exit 2
site=/tmp/stp-site
if ! python3 -c "import tvm_ffi" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
        "$wheels"/apache_tvm_ffi-*.whl || { echo "error: no apache_tvm_ffi wheel in $wheels" >&2; exit 2; }
fi
export PYTHONPATH="$(cd "$pack" && pwd)/python:$site" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader 2>/dev/null || true
command -v compute-sanitizer >/dev/null || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1 \
    || echo "note: compute-sanitizer not on PATH (gpu.run also looks in the nvidia pip packages)"

# the budget: what is left after the setup, less 25 s for the driver's exit and the copy back
left=$(( deadline - ($(date +%s) - t0) - 25 ))
if [ "$left" -lt 60 ]; then echo "error: DEADLINE_S $deadline leaves ${left} s for the run" >&2; exit 2; fi
entries=$(( left * ${ENTRIES_SHARE:-45} / 100 ))
echo "budget: ${left} s in all, entries ${entries} s; caps: sanitizer ${SAN_CAP_S:-90} s, baselines ${BASE_CAP_S:-60} s," \
     "torch.compile ${COMPILE_CAP_S:-120} s"
timeout -k 10 $(( left + 20 )) python3 -m steptp.gpu.run "$pack" -o "$outdir" -q \
    --time --repeat "${REPEAT:-8}" --min-ms "${MIN_MS:-2}" --retime-best 1 \
    --sanitizer --sanitizer-cap-s "${SAN_CAP_S:-90}" --sanitizer-jobs "${SAN_JOBS:-4}" \
    --baselines --compile --autotune --baseline-cap-s "${BASE_CAP_S:-60}" --compile-cap-s "${COMPILE_CAP_S:-120}" \
    --entries-deadline-s "$entries" --deadline-s "$left" \
    > "$outdir/run.json" 2> "$outdir/run.err"
rc=$?
echo "rc=$rc after $(( $(date +%s) - t0 )) s"
ls -la "$outdir" | grep -E "jsonl|json|md" || true
tail -c 2000 "$outdir/run.err"
exit $rc
