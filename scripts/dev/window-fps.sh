#!/usr/bin/env bash
# Measures the viewer's window while the timeline cursor is dragged: frames per second as the
# app reports them (CACHALOT_FRAME_STATS=1), on a virtual display (Xvfb) with the mouse driven
# by xdotool. Without a GPU the window is drawn by Mesa's software OpenGL (llvmpipe), as on the
# development machine, or by lavapipe with `--renderer wgpu`.
#
#   scripts/dev/window-fps.sh [FILE] [VIEW OPTIONS]   # FILE: anything `cachalot view` opens; none: the empty window
#   scripts/dev/window-fps.sh --run ops FILE --backend sim --no-compute   # a live run streaming in
#
# With --run (a live run, `cachalot view --run ...`), nothing is dragged: the frame rates are
# reported every two seconds while the run streams (with the entries received so far), for
# LIVE_SECONDS (default 12) after the window appeared.
#
# Environment: CACHALOT (the binary; default target/release/cachalot), WAIT (seconds to let the
# file load before dragging; default 6), DRAG_Y (the height the mouse drags at; default 170, the
# timeline's plot), DRAG_SECONDS (how long the drag lasts; default 8). Needs Xvfb and xdotool.
#
# The Memory view (Active Memory Timeline over the peak analysis), dragged in its picture:
#   DRAG_Y=420 scripts/dev/window-fps.sh FILE --view memory
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
cachalot=${CACHALOT:-$root/target/release/cachalot}
for tool in Xvfb xdotool; do
    command -v "$tool" >/dev/null || { echo "window-fps.sh: $tool is needed" >&2; exit 1; }
done
[[ -x $cachalot ]] || { echo "window-fps.sh: no $cachalot (cargo build --release -p cachalot-cli)" >&2; exit 1; }

# Xvfb picks a free display and writes its number to fd 3 once it accepts clients.
displays=$(mktemp)
log=$(mktemp)
Xvfb -displayfd 3 -screen 0 1600x1000x24 3>"$displays" >/dev/null 2>&1 &
xvfb=$!
trap 'kill "$xvfb" 2>/dev/null; wait "$xvfb" 2>/dev/null; rm -f "$log" "$displays"' EXIT
for _ in $(seq 100); do [[ -s $displays ]] && break; sleep 0.1; done
[[ -s $displays ]] || { echo "window-fps.sh: Xvfb did not start" >&2; exit 1; }
export DISPLAY=:$(head -n 1 "$displays") XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}

CACHALOT_FRAME_STATS=1 "$cachalot" view "$@" >"$log" 2>&1 &
app=$!
for _ in $(seq 200); do xdotool search --name cachalot >/dev/null 2>&1 && break; sleep 0.1; done
if [[ " $* " == *" --run "* ]]; then
    sleep "${LIVE_SECONDS:-12}"
    kill "$app" 2>/dev/null || { echo "window-fps.sh: the viewer exited early:" >&2; cat "$log" >&2; exit 1; }
    wait "$app" 2>/dev/null || true
    grep -v "frames/s" "$log" || true
    grep "frames/s" "$log"
    exit 0
fi
sleep "${WAIT:-6}"
# Drag across the timeline's plot (the window is 1400x900; the plot sits at y = 100..240), or
# at DRAG_Y (the Memory view's picture spans about y = 320..560): one xdotool process moves the
# mouse every 10 ms for DRAG_SECONDS (default 8), back and forth, so that the rate of the moves
# does not depend on how fast processes start on a loaded machine.
y=${DRAG_Y:-170}
moves=$(awk -v s="${DRAG_SECONDS:-8}" 'BEGIN { print int(s * 100) }')
chain=(mousemove 300 "$y" mousedown 1)
for i in $(seq "$moves"); do
    x=$(( 300 + (i * 4) % 2000 ))
    (( x > 1300 )) && x=$(( 2300 - x ))
    chain+=(mousemove "$x" "$y" sleep 0.01)
done
chain+=(mouseup 1)
drag_start=$(date +%s.%N)
xdotool "${chain[@]}"
drag_end=$(date +%s.%N)
sleep 2.5
kill "$app" 2>/dev/null || { echo "window-fps.sh: the viewer exited early:" >&2; cat "$log" >&2; exit 1; }
wait "$app" 2>/dev/null || true
# What the app said (e.g. which renderer draws the window), then its frame counts: it prints
# one every two seconds, ending "(S s until T)"; those whose seconds lie inside the drag are
# shown, and their median.
grep -v "frames/s" "$log" || true
inside=$(grep "frames/s" "$log" | awk -v a="$drag_start" -v b="$drag_end" '{
    until = $NF; sub(/\)/, "", until); seconds = $(NF - 3); sub(/\(/, "", seconds)
    if (until - seconds >= a && until <= b) print
}')
[[ -n $inside ]] || { echo "window-fps.sh: no report fell inside the drag:" >&2; grep "frames/s" "$log" >&2; exit 1; }
echo "$inside"
echo "$inside" | awk '{ print $2 }' | sort -n | awk -v d="$(awk -v a="$drag_start" -v b="$drag_end" 'BEGIN { printf "%.1f", b - a }')" '
    { v[NR] = $1 }
    END { printf "median of %d reports inside the %s s drag: %.1f frames/s\n", NR, d, (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
