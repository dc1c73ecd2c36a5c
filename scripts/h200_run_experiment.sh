#!/usr/bin/env bash
# Run (or resume) an experiment on the lent device machine and bring ALL of it back (DESIGN 6, 9).
#
#   METAKERNEL_REVISION=<commit> EXP=/tmp/mk-exp bash scripts/h200_run_experiment.sh --model scripted/gold \
#       --problems 28,36 --direction both --replicates 2
#
# The device tool returns plain files from $OUT but drops folders nested as deep as attempts/<model>/<address>/
# grades/, which lost the per-attempt files of the first H200 experiment. So the experiment lives in $EXP (kept
# while the machine stays warm, so a second call resumes it with the same arguments) and is packed into
# $OUT/experiment.tar.gz when the run ends -- also when `timeout` stops it, because the store is crash-safe and
# the next call resumes. Exit codes are metakernel run's (3: not complete yet, run again).
set -uo pipefail
EXP=${EXP:-/tmp/mk-exp}
timeout "${BUDGET:-540}" python3 -m metakernel run --experiment "$EXP" "$@"
rc=$?
if [ -n "${OUT:-}" ] && [ -d "$EXP" ]; then
  tar czf "$OUT/experiment.tar.gz" -C "$(dirname "$EXP")" "$(basename "$EXP")"
fi
[ "$rc" = 124 ] && rc=3
exit $rc
