#!/usr/bin/env bash
# One device call's runner for benchmarks/tools/gpu_pending.sh: installs the wheels carried in
# .whl/ (optuna, SQLAlchemy and their needs, nvidia-cudnn-frontend: the device image lacks them),
# then runs each step of $STEPS into a work folder, packing everything into $OUT/results.tgz after
# each step, so that a call cut at its limit still brings back the steps that finished. $BUDGET
# (seconds, default 570) bounds the whole call: a step gets what is left, and none starts with
# under 30 s. Run from the repository root:
#
#   STEPS="ima-fence ima-desc" BUDGET=560 bash benchmarks/tools/gpu_call.sh
#
# Here, before the call: `echo /.whl/ >> .git/info/exclude`, then the wheels
# (../shared/scripts/gpu_wheels.sh .whl, and `pip download` of nvidia-cudnn-frontend for the fp8
# bench's cuDNN column, as the device tool's README says), and carry [".whl"].
set -u
cd "$(dirname "$0")/../.."
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 1; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
R=${OUT:-benchmarks/results/tmp}
export CALL_OUT=$R  # a step's artefact that must come back even if the call is cut (land's pack)
W=$(mktemp -d)
mkdir -p "$R"
start=$(date +%s)
status=0
for s in ${STEPS:?STEPS names the gpu_pending.sh steps to run}; do
  left=$(( ${BUDGET:-570} - ($(date +%s) - start) ))
  if [ "$left" -lt 30 ]; then echo "=== $s skipped: ${left} s left"; continue; fi
  echo "=== $s ($left s left, $(date +%T))"
  OUT=$W timeout "$left" bash benchmarks/tools/gpu_pending.sh "$s" > "$W/step_$s.log" 2>&1
  rc=$?
  [ "$rc" -eq 0 ] || status=1
  echo "=== $s rc=$rc ($(date +%T))"
  tail -n 15 "$W/step_$s.log"
  tar -C "$W" -czf "$R/results.tgz" .
done
exit $status
