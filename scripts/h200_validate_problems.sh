#!/usr/bin/env bash
# One shard of the H200 problem validation (DESIGN 9): run on the device machine from the checkout root.
#
#   METAKERNEL_REVISION=<commit> bash scripts/h200_validate_problems.sh [SELECTION...]
#
# It validates at full scale on CUDA, resumes from validation/h200-problems.json (carried in with the tree),
# rewrites that report after every problem, stops starting new problems after $BUDGET seconds (one device command
# is capped at 10 minutes) and copies the report to $OUT. Exit 3 means "more to do: run it again".
set -uo pipefail
REPORT=validation/h200-problems.json
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python3 -m metakernel problems validate "$@" --device cuda --scale full --report "$REPORT" --resume \
  --time-budget "${BUDGET:-420}"
rc=$?
if [ -n "${OUT:-}" ] && [ -f "$REPORT" ]; then cp "$REPORT" "$OUT/"; fi
exit $rc
