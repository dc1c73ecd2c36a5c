#!/usr/bin/env bash
# Started in the background by h200_validate_gold.sh when $PYSPY names a py-spy binary (carried in: the device has
# no network): when the validation log has not grown for $STALL_S seconds (default 100), every Python process's
# stacks are appended to $OUT/stacks.txt (py-spy --nonblocking: the processes are not paused), at most once per
# $STALL_S. Session 26's 59 TIRx grading ran past its call's limit with nothing in the log to say where.
log=${1:?validation log}
dst=${OUT:-/tmp}/stacks.txt
stall=${STALL_S:-100}
last=0
while sleep 20; do
  [ -f "$log" ] || continue
  now=$(date +%s)
  age=$(( now - $(stat -c %Y "$log") ))
  if [ "$age" -gt "$stall" ] && [ $((now - last)) -gt "$stall" ]; then
    last=$now
    { echo "=== $(date -u +%T) log idle ${age}s; last line: $(tail -1 "$log" | cut -c1-120)"
      for pid in $(pgrep -f python3); do
        echo "--- pid $pid uid $(stat -c %u /proc/"$pid") $(tr '\0' ' ' < /proc/"$pid"/cmdline | cut -c1-160)"
        timeout 20 "$PYSPY" dump --nonblocking --pid "$pid" 2>&1 | head -60
      done; } >> "$dst" 2>&1
    [ "$(stat -c %s "$dst")" -gt 3000000 ] && exit 0  # $OUT returns files of at most 16 MiB
  fi
done
