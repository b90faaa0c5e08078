#!/usr/bin/env bash
# Issue 22: how fast cachalot opens a large PyTorch snapshot pickle, against Python's own
# `pickle.load` of the same file, run back to back in this one command on this machine.
#
#   scripts/dev/pickle-speed.sh [ENTRIES...]     # default: 3000000 10000000
#
# For each size it writes a synthetic snapshot (trace/examples/synthetic_trace.rs) to $TMPDIR,
# then runs, ROUNDS times in turn (default 2), under /usr/bin/time (wall seconds, CPU seconds
# (user + system: the fairer figure while other jobs share the cores), peak RSS):
#   python    python3 -c "import pickle; pickle.load(open(F, 'rb'))"   (the C unpickler)
#   stream    read_pickle F              the reader cachalot uses
#   replay    cachalot replay F          read + replay of every entry
#   view      cachalot view F --screenshot  read + rebuild + first frame (headless, lavapipe); VIEW=0 skips it
# and prints one Markdown table: the best round of each, its ratio to python's best, and for
# the larger sizes the ratio of time and memory to the first size's. The files are deleted.
# Builds the release binaries first (minutes on a cold target directory).
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
sizes=("$@")
[[ ${#sizes[@]} -gt 0 ]] || sizes=(3000000 10000000)
rounds=${ROUNDS:-2}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/pickle-speed.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

cargo build --release --quiet -p cachalot-trace --example synthetic_trace --example read_pickle
cargo build --release --quiet -p cachalot-cli
bin=$root/target/release
commands=(python stream replay)
[[ ${VIEW:-1} == 0 ]] || commands+=(view)
# COMMANDS="python view" runs only those (python must be among them: it is the reference).
[[ -z ${COMMANDS:-} ]] || read -r -a commands <<<"$COMMANDS"

run() { # NAME FILE -> "wall-seconds kilobytes cpu-seconds" of the command NAME on FILE
    local name=$1 file=$2
    local cmd
    case $name in
        python) cmd=(python3 -c "import pickle, sys; pickle.load(open(sys.argv[1], 'rb'))" "$file") ;;
        stream) cmd=("$bin/examples/read_pickle" "$file") ;;
        replay) cmd=("$bin/cachalot" replay "$file") ;;
        view) cmd=("$bin/cachalot" view "$file" --screenshot "$tmp/first-frame.png") ;;
    esac
    /usr/bin/time -f "%e %M %U %S" -o "$tmp/time" "${cmd[@]}" >/dev/null 2>"$tmp/stderr" || {
        echo "pickle-speed.sh: $name failed:" >&2
        cat "$tmp/stderr" >&2
        exit 1
    }
    awk '{ printf "%s %s %.2f\n", $1, $2, $3 + $4 }' "$tmp/time"
}

declare -A best_s best_kb best_cpu
ratios=$(mktemp)
for entries in "${sizes[@]}"; do
    file=$tmp/trace-$entries.pickle
    "$bin/examples/synthetic_trace" "$entries" "$file" 2>/dev/null
    for round in $(seq "$rounds"); do
        for name in "${commands[@]}"; do
            read -r s kb cpu < <(run "$name" "$file")
            # Each round's ratios to that round's python run, for the medians at the end.
            [[ $name == python ]] && { round_s=$s; round_cpu=$cpu; }
            awk -v e="$entries" -v n="$name" -v r="$round" -v s="$s" -v c="$cpu" -v ps="$round_s" -v pc="$round_cpu" \
                'BEGIN { printf "%s %s %s %.3f %.3f\n", e, n, r, s / ps, c / pc }' >>"$ratios"
            key=$name/$entries
            if [[ -z ${best_s[$key]:-} ]] || awk -v a="$s" -v b="${best_s[$key]}" 'BEGIN { exit !(a < b) }'; then
                best_s[$key]=$s
                best_kb[$key]=$kb
                best_cpu[$key]=$cpu
            fi
        done
    done
    best_kb[size/$entries]=$(stat -c %s "$file")
    rm -f "$file"
done

# The median over the rounds of each command's ratio to python's run of the same round.
echo "Per round, the ratio to python's run of the same round (wall, CPU); the median of the rounds:"
for entries in "${sizes[@]}"; do
    for name in "${commands[@]}"; do
        [[ $name == python ]] && continue
        walls=$(awk -v e="$entries" -v n="$name" '$1 == e && $2 == n { print $4 }' "$ratios" | sort -n | tr '\n' ' ')
        cpus=$(awk -v e="$entries" -v n="$name" '$1 == e && $2 == n { print $5 }' "$ratios" | sort -n | tr '\n' ' ')
        median() { echo "$1" | awk '{ printf "%.2f", ($0 == "") ? 0 : (NF % 2 ? $((NF + 1) / 2) : ($(NF / 2) + $(NF / 2 + 1)) / 2) }'; }
        echo "$entries $name: wall ${walls}-> median $(median "$walls"); CPU ${cpus}-> median $(median "$cpus")"
    done
done
rm -f "$ratios"
echo

first=${sizes[0]}
echo "$(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%Y-%m-%d), best wall time of $rounds rounds"
echo
echo "| entries (file) | command | wall s | × python | CPU s | × python | peak MB | × python | wall, CPU, memory × ${first} |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for entries in "${sizes[@]}"; do
    mb=$(awk -v b="${best_kb[size/$entries]}" 'BEGIN { printf "%.0f", b / 1e6 }')
    for name in "${commands[@]}"; do
        key=$name/$entries
        awk -v e="$entries ($mb MB)" -v n="$name" -v s="${best_s[$key]}" -v kb="${best_kb[$key]}" -v c="${best_cpu[$key]}" \
            -v ps="${best_s[python/$entries]}" -v pkb="${best_kb[python/$entries]}" -v pc="${best_cpu[python/$entries]}" \
            -v fs="${best_s[$name/$first]}" -v fkb="${best_kb[$name/$first]}" -v fc="${best_cpu[$name/$first]}" \
            -v same="$([[ $entries == "$first" ]] && echo 1 || echo 0)" \
            'BEGIN {
                growth = same ? "" : sprintf("%.2f, %.2f, %.2f", s / fs, c / fc, kb / fkb)
                printf "| %s | %s | %.2f | %.2f | %.2f | %.2f | %.0f | %.2f | %s |\n", e, n, s, s / ps, c, c / pc, kb / 1024, kb / pkb, growth
            }'
    done
done
