#!/usr/bin/env bash
# One shard of the H200 gold + wrong + red-team validation: run on the device machine from the checkout root.
#
#   METAKERNEL_REVISION=<commit> [STATE=.dev/state/h200-gold.json] [SEED=validation/<report>.json] [BUDGET=480] \
#     [JOBS=3] [PYSPY=/path/to/py-spy] bash scripts/h200_validate_gold.sh [SELECTION...]
#
# Prints the sandbox's isolation self-test first (and, once per machine, runs the static rules' reachability walks
# against this machine's libraries), then grades solutions/ (gold must pass, wrong and red-team files
# must be rejected as their docstrings say), resuming, re-grading entries of another grader, and stopping new
# gradings after $BUDGET seconds. Exit 3 means "more to do: run it again". $JOBS files are graded at once (their
# untimed phases overlap; each timed phase has the GPU alone); JOBS=1 grades one after another.
#
# Where the report lives: the grading writes it after every file under $OUT (so a call stopped at its time limit
# still brings back every finished grading), starting from $STATE when that exists (a git-ignored file the warm
# device machine keeps between calls), else from $SEED (a committed report carried in with the tree: a validation
# that spans device sessions resumes from the last session's, e.g. validation/h100-gold-<commit>.json), else from
# validation/h200-gold.json;
# at the end the report is copied back to $STATE for the next call. Without $OUT, it is $STATE itself.
set -uo pipefail
STATE=${STATE:-${REPORT:-.dev/state/h200-gold.json}}
mkdir -p "$(dirname "$STATE")"
SEED=${SEED:-validation/h200-gold.json}
if [ ! -f "$SEED" ]; then echo "h200_validate_gold: no report at SEED=$SEED" >&2; exit 2; fi
if [ ! -f "$STATE" ] && [ "$STATE" != "$SEED" ]; then
  cp "$SEED" "$STATE"
fi
report=$STATE
if [ -n "${OUT:-}" ]; then
  report=$OUT/h200-gold.json
  [ -f "$STATE" ] && cp "$STATE" "$report"
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python3 -m metakernel.grader.probe | tee "${OUT:-/tmp}/isolation.txt"
# The static rules judge names against the libraries installed here: walk every module and function an allowed
# chain of names reaches with this machine's torch and DSLs (once per machine; the result comes back under $OUT).
mkdir -p .dev/state
if [ ! -f .dev/state/reachability.txt ] && python3 -c "import pytest" 2>/dev/null; then
  python3 -m pytest -q -p no:cacheprovider tests/test_static_rules.py -k "reachable or reviewed" \
    > .dev/state/reachability.txt 2>&1 || echo "h200_validate_gold: the reachability walks FAILED here" >&2
  tail -3 .dev/state/reachability.txt
fi
[ -f .dev/state/reachability.txt ] && [ -n "${OUT:-}" ] && cp .dev/state/reachability.txt "$OUT/"
# The whole log comes back under $OUT (session 24: a run aborted in C++ with its log left on the machine).
log=${OUT:-/tmp}/validate-log.txt
watcher=
if [ -n "${PYSPY:-}" ] && [ -x "$PYSPY" ]; then  # stacks of a stalled grading come back too (stall_dump.sh)
  bash scripts/stall_dump.sh "$log" & watcher=$!
fi
python3 -m metakernel problems validate --gold "$@" --device cuda --report "$report" --resume \
  --time-budget "${BUDGET:-480}" --jobs "${JOBS:-3}" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
[ -n "$watcher" ] && kill "$watcher" 2>/dev/null
if [ "$report" != "$STATE" ] && [ -f "$report" ]; then cp "$report" "$STATE"; fi
# A failed walk is a route the static rules do not know on this machine (session 23: torch.cuda.pynvml, on the GPU
# image only): say so last, where the call's output tail shows it.
if grep -q "^FAILED" .dev/state/reachability.txt 2>/dev/null; then
  echo "h200_validate_gold: REACHABILITY WALKS FAILED on this machine (a route the static rules do not know):" >&2
  grep -E "^E +AssertionError" .dev/state/reachability.txt | cut -c1-300 >&2
fi
exit $status
