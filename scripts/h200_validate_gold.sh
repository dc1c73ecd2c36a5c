#!/usr/bin/env bash
# One shard of the H200 gold + wrong + red-team validation: run on the device machine from the checkout root.
#
#   METAKERNEL_REVISION=<commit> bash scripts/h200_validate_gold.sh [SELECTION...]
#
# Prints the sandbox's isolation self-test first, then grades solutions/ (gold must pass, wrong and red-team files
# must be rejected as their docstrings say), resuming from validation/h200-gold.json (carried in with the tree,
# re-grading entries of an older protocol), rewriting it after every file and stopping new gradings after $BUDGET
# seconds. Exit 3 means "more to do: run it again" (carry $OUT's report back into validation/ first).
set -uo pipefail
# The report is written after every file to $REPORT: by default under $OUT, so a call stopped at its time limit
# still brings it back. With REPORT under a git-ignored folder (e.g. .dev/state/h200-gold.json) it stays on the warm
# device machine between calls, so the next call resumes from it without carrying it back in; a copy goes to $OUT.
REPORT=${REPORT:-${OUT:-validation}/h200-gold.json}
mkdir -p "$(dirname "$REPORT")"
[ "$REPORT" = validation/h200-gold.json ] || [ -f "$REPORT" ] || cp validation/h200-gold.json "$REPORT" 2>/dev/null || true
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python3 -m metakernel.grader.probe | tee "${OUT:-/tmp}/isolation.txt"
python3 -m metakernel problems validate --gold "$@" --device cuda --report "$REPORT" --resume \
  --time-budget "${BUDGET:-480}"
status=$?
if [ -n "${OUT:-}" ] && [ "$REPORT" != "$OUT/h200-gold.json" ]; then cp "$REPORT" "$OUT/h200-gold.json"; fi
exit $status
