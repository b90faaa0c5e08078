#!/usr/bin/env bash
# Counts the tests that skipped, from a test log, by reason, in one line:
#   skipped: 17 tests — no usable CUDA device; 1 test — Python: a CUDA device is usable here
# A Rust test that skips writes `skipped TEST: REASON (DETAIL)...` (or `skipped: REASON (...)`)
# straight to standard error, so a passing run shows it; unittest's verbose lines end
# `... skipped 'REASON'`.
#
#   scripts/dev/count-skips.sh LOG
set -euo pipefail
awk '
{
  if (match($0, /\.\.\. skipped \047[^\047]*\047/)) {
    n["Python: " substr($0, RSTART + 13, RLENGTH - 14)]++
    next
  }
  if (match($0, /(^|\.\.\. )skipped( [^ ]+)?: [^(;]+/)) {
    reason = substr($0, RSTART, RLENGTH)
    sub(/.*skipped( [^ ]+)?: /, "", reason)
    sub(/ +$/, "", reason)
    n[reason]++
  }
}
END {
  line = ""
  for (reason in n) {
    line = line (line == "" ? "" : "; ") n[reason] (n[reason] == 1 ? " test — " : " tests — ") reason
  }
  print "skipped: " (line == "" ? "no test" : line)
}' "$1"
