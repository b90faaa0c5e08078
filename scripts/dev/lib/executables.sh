# Sourced by the device scripts. `executables NAME` reads cargo's JSON messages
# (--message-format=json-render-diagnostics) on stdin and prints the paths of the executables
# built for the target named NAME; with jq where it exists, else with python3.
executables() {
    if command -v jq >/dev/null; then
        jq -r --arg name "$1" 'select(.reason == "compiler-artifact" and .target.name == $name and .executable != null) | .executable'
    else
        python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == sys.argv[1] and m.get("executable"):
        print(m["executable"])' "$1"
    fi
}
