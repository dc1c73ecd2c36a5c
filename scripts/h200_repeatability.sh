#!/usr/bin/env bash
# The grader's repeatability check on the device machine in one call (issue 3): first the host's own CPU speed
# over time (30 s, no GPU), then every gold kernel with >= 50 us of GPU time graded twice, the eager baseline
# measured again for each grading, so end-to-end, GPU-only and both speedups are compared.
#
#   METAKERNEL_REVISION=<commit> bash scripts/h200_repeatability.sh            # every draw counted (gate off)
#   METAKERNEL_REVISION=<commit> GATE=0.15 bash scripts/h200_repeatability.sh  # the grader's default gate
# (GATE runs measure a reference fast level first; HOST_FAST_US, GATE_WAIT_S, MIN_TIMING_S, REPORT override.
# KEEP_DRAWS=1 records every draw's time and probes: scripts/gate_variants.py then replays other gates on them;
# FRESH_BASELINES=0 reuses the first eager baseline, halving the call when only kernel medians are studied.)
#
# Resumable: bench_grader keeps finished kernels in its output (carried back in with the tree) and exits 3 while
# kernels remain. The reports are copied to $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
HOST=validation/h200-host-speed.json
[ -f "$HOST" ] || python3 scripts/bench_host_speed.py --seconds "${HOST_SECONDS:-30}" --out "$HOST"
if [ -n "${GATE:-}" ]; then
  REPORT=${REPORT:-validation/h200-grader-bench-gate.json}
  extra=(--host-gate "$GATE" --min-timing-s "${MIN_TIMING_S:-2}" --host-fast-us "${HOST_FAST_US:-auto}"
         --host-gate-wait-s "${GATE_WAIT_S:-8}")
else
  REPORT=${REPORT:-validation/h200-grader-bench-speedups.json}
  extra=(--host-gate 0 --min-timing-s 0)
fi
[ -n "${KEEP_DRAWS:-}" ] && extra+=(--keep-draws)
[ "${FRESH_BASELINES:-1}" = 1 ] && extra+=(--fresh-baselines)
python3 scripts/bench_grader.py --only "${ONLY:-1,25,28,36,44,61,72,73}" \
  --budget "${BUDGET:-420}" --out "$REPORT" "${extra[@]}"
rc=$?
if [ -n "${OUT:-}" ]; then
  cp "$HOST" "$REPORT" "$OUT/" 2>/dev/null
fi
exit $rc
