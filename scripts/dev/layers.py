#!/usr/bin/env python3
"""The workspace's shape, checked: crates import downward only, and no crate's modules import
each other in a circle.

    scripts/dev/layers.py [--dot FILE]

1. Crates. Every workspace crate has a layer (LAYERS below: cli -> viewer -> runtime ->
   backends -> core, with trace beside core for everything file-shaped and shaders beside the
   backends' kernels). A crate may depend on crates of lower layers only.
2. Modules. Inside each crate, a module's `crate::other` paths (in `use` lines and in code)
   are its imports of `other` (a top-level module, or a second-level one where a module is a
   folder). A circle among them means two modules cannot be understood one before the other;
   there must be none.

Prints what it found and exits 1 on a violation. `--dot FILE` also writes the crate graph as
Graphviz, each crate with its one job (its `description`) and the outside crates it uses, a layer
a row: `dot -Tsvg FILE -o docs/crates.svg` renders the picture of the README's layout.
"""
import json
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Lower numbers sit lower; a crate may depend only on crates whose layer is lower than its own.
LAYERS = {
    "cachalot-core": 0,
    "cachalot-trace": 1,
    "cachalot-shaders": 1,
    "cachalot-cuda": 2,
    "cachalot-wgpu": 2,
    "cachalot-runtime": 3,
    "cachalot-torch": 3,
    "cachalot-viewer": 4,
    "cachalot-cli": 5,
}


def crate_graph():
    meta = json.loads(subprocess.check_output(
        ["cargo", "metadata", "--format-version", "1", "--no-deps", "--offline"], cwd=ROOT))
    crates, facts = {}, {}
    for package in meta["packages"]:
        normal = [d for d in package["dependencies"] if d.get("kind") != "dev"]
        deps = sorted({d["name"] for d in normal if d["name"].startswith("cachalot-")})
        outside = sorted({d["name"] + (" (optional)" if d.get("optional") else "")
                          for d in normal if not d["name"].startswith("cachalot-")})
        crates[package["name"]] = (Path(package["manifest_path"]).parent, deps)
        facts[package["name"]] = (package.get("description") or "", outside)
    return crates, facts


def module_of(path: Path, src: Path):
    """The module a file belongs to, as the crate's other modules name it."""
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts in (["lib"], ["main"]):
        return None
    if parts[-1] == "mod":
        parts = parts[:-1]
    return parts[0]


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def module_graph(src: Path):
    graph = defaultdict(set)
    for path in sorted(src.rglob("*.rs")):
        module = module_of(path, src)
        if module is None:
            continue
        code = strip_comments(path.read_text())
        for target in re.findall(r"\bcrate::([a-z_][a-z0-9_]*)", code):
            if target != module:
                graph[module].add(target)
        # `use crate::{a, b::c}` imports a and b.
        for group in re.findall(r"\buse\s+crate::\{([^}]*)\}", code):
            for target in re.findall(r"(?:^|,)\s*([a-z_][a-z0-9_]*)", group):
                if target not in ("self", module):
                    graph[module].add(target)
    return graph


def cycles(graph):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def wrap(text: str, width: int = 44) -> str:
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return "\\n".join(lines + [line])


def dot(crates, facts) -> str:
    """The crate graph as Graphviz: a layer a row, lowest at the bottom."""
    lines = ["digraph crates {",
             "  rankdir=BT; newrank=true; nodesep=0.3; ranksep=0.5;",
             '  node [shape=box, style="rounded,filled", fillcolor="#f4f6fb", fontname="sans", fontsize=10];',
             '  edge [color="#7a869a", arrowsize=0.6];']
    for name in sorted(crates):
        description, outside = facts[name]
        uses = wrap("uses: " + ", ".join(outside)) if outside else "uses: nothing outside"
        label = f"<b>{name}</b>\\n{wrap(description)}\\n<i>{uses}</i>"
        label = label.replace("&", "&amp;").replace("<b>", "").replace("</b>", "")
        label = label.replace("<i>", "").replace("</i>", "").replace('"', "'")
        lines.append(f'  "{name}" [label="{label}"];')
    for layer in sorted(set(LAYERS.values())):
        same = " ".join(f'"{n}";' for n in sorted(crates) if LAYERS.get(n) == layer)
        lines.append(f"  {{ rank=same; {same} }}")
    for name, (_, deps) in sorted(crates.items()):
        # Edges point down the page: from a crate to what it builds on.
        lines += [f'  "{dep}" -> "{name}" [dir=back];' for dep in deps]
    lines.append("}")
    return "\n".join(lines) + "\n"


def main():
    dot_path = sys.argv[sys.argv.index("--dot") + 1] if "--dot" in sys.argv else None
    crates, facts = crate_graph()
    problems = []
    for name, (_, deps) in sorted(crates.items(), key=lambda c: LAYERS.get(c[0], 99)):
        if name not in LAYERS:
            problems.append(f"{name}: no layer in scripts/dev/layers.py; give it one")
            continue
        for dep in deps:
            if LAYERS.get(dep, 99) >= LAYERS[name]:
                problems.append(f"{name} depends on {dep}, which is not below it")
        print(f"{name:18} -> {', '.join(deps) if deps else '(nothing of ours)'}")
    for name, (directory, _) in sorted(crates.items()):
        for circle in cycles(module_graph(directory / "src")):
            problems.append(f"{name}: modules import each other in a circle: {' <-> '.join(circle)}")
    if dot_path:
        Path(dot_path).write_text(dot(crates, facts))
    for problem in problems:
        print(f"layers: {problem}", file=sys.stderr)
    print(f"layers: {len(crates)} crates, {'no' if not problems else len(problems)} violation(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
