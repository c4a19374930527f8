#!/bin/bash
# One GPU-node call of a `stp search --runner pack` round (issue 37), as run on the H200
# (benchmarks/results/gpu-search-h200.md): install the carried apache-tvm-ffi wheel, run the
# round's pack (GPU verification, interleaved timing against the original, PyTorch eager, and
# a second measurement of each program's fastest entry), copy the few result files back.
#
#   usage: benchmarks/gpu_node_round.sh PACK OUTDIR [WHEEL_DIR] [DEADLINE_S]
#
# PACK: OUT/rounds/<k>/pack (built here by stp search ... --runner pack --no-sim); OUTDIR:
# where results.jsonl, retime.jsonl and the summaries land (copy them to OUT/rounds/<k>/results
# here and rerun the stp search command). WHEEL_DIR: a folder holding the cp312
# apache_tvm_ffi wheel when the node lacks tvm_ffi (default .whl). DEADLINE_S: stop the run
# cleanly after this many seconds (default 400). The whole measurement at size (sanitizer,
# like-with-like baselines, torch.compile) is benchmarks/gpu_at_size.sh.
set -u
pack=${1:?PACK}; outdir=${2:?OUTDIR}; wheels=${3:-.whl}; deadline=${4:-400}
t0=$(date +%s)
site=/tmp/stp-site
if ! python3 -c "import tvm_ffi" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
        "$wheels"/apache_tvm_ffi-*.whl || { echo "error: no apache_tvm_ffi wheel in $wheels" >&2; exit 2; }
fi
export PYTHONPATH="$(cd "$pack" && pwd)/python:$site" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || true
results=$(mktemp -d)
python3 -m steptp.gpu.run "$pack" -o "$results" --time --retime-best 1 -q --deadline-s "$deadline" \
    > "$outdir/run.json" 2> "$outdir/run.err"
rc=$?
echo "rc=$rc after $(( $(date +%s) - t0 )) s"
for f in results.jsonl retime.jsonl summary.json retime-summary.json report.md; do
    [ -f "$results/$f" ] && cp "$results/$f" "$outdir/"
done
tail -c 2000 "$outdir/run.err"
exit $rc
