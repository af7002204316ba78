#!/usr/bin/env python3
"""Import circles between the files and between the folders of each crate.

A file imports another when it names an item through `crate::...` or `super::...`
(in a `use` or in a path); the name resolves to the deepest module file that exists.
A folder imports another when one of its files imports a file of the other. Test
modules (`#[cfg(test)] mod tests`) are left out: they may import from anywhere.
Prints each crate's counts and every circle; exits 1 if there is one.

    python3 scripts/import-circles.py
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CRATES = {"normrl": ROOT / "src", "normrl-agents": ROOT / "agents/src", "normrl-envs": ROOT / "envs/src"}


def module_of(src: Path, file: Path) -> tuple:
    parts = list(file.relative_to(src).with_suffix("").parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


def strip_tests(text: str) -> str:
    at = re.search(r"#\[cfg\(test\)\]\s*(pub(\(crate\))?\s+)?mod\s+\w+\s*\{", text)
    return text[: at.start()] if at else text


def test_only_children(text: str) -> list:
    """Modules a file declares for tests only (`#[cfg(test)] mod x;`): left out."""
    pattern = r"#\[cfg\([^\]]*\btest\b[^\]]*\)\]\s*(?:pub(?:\(crate\))?\s+)?mod\s+(\w+)\s*;"
    return re.findall(pattern, text)


def expand_use_groups(text: str) -> list:
    """Every `crate::a::b` / `super::a` path, with `use x::{y, z::w}` groups expanded."""
    paths = []
    for m in re.finditer(r"\buse\s+((?:crate|super)(?:::\w+)*)::\{", text):
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        inner = re.sub(r"\{[^{}]*\}", "", text[m.end() : i - 1])
        for item in inner.split(","):
            item = item.strip().split(" as ")[0].strip()
            if item and item != "self":
                paths.append(m.group(1) + "::" + item)
            elif item == "self":
                paths.append(m.group(1))
    paths += re.findall(r"\b((?:crate|super)(?:::\w+)+)", text)
    return paths


def resolve(path: str, here: tuple, modules: set):
    parts = path.split("::")
    if parts[0] == "crate":
        base, rest = (), parts[1:]
    else:
        # `super` is the parent of the module the file is (a `mod.rs` is its folder).
        base, rest = here, parts
        while rest and rest[0] == "super":
            base, rest = base[:-1], rest[1:]
    candidate = base + tuple(rest)
    while candidate not in modules and candidate:
        candidate = candidate[:-1]
    return candidate


def circles(graph: dict) -> list:
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def main() -> int:
    found = 0
    for crate, src in CRATES.items():
        files = sorted(f for f in src.rglob("*.rs") if f != src / "main.rs")
        modules = {module_of(src, f): f for f in files}
        for mod, file in list(modules.items()):
            for name in test_only_children(file.read_text()):
                modules.pop(mod + (name,), None)
        graph, folders = {}, {}
        for mod, file in modules.items():
            text = strip_tests(file.read_text())
            text = re.sub(r"//[^\n]*", "", text)
            targets = {resolve(p, mod, set(modules)) for p in expand_use_groups(text)}
            targets.discard(mod)
            graph[mod] = {t for t in targets if t}
            folder = mod[:1]
            for t in graph[mod]:
                if t[:1] != folder and t[:1]:
                    folders.setdefault(folder, set()).add(t[:1])
        file_circles = circles(graph)
        folder_circles = circles(folders)
        edges = sum(len(v) for v in graph.values())
        print(f"{crate}: {len(modules)} files, {edges} imports between files, "
              f"{len(file_circles)} file circles, {len(folder_circles)} folder circles")
        for c in file_circles + folder_circles:
            print("  circle: " + " <-> ".join("::".join(m) or "<root>" for m in c))
        found += len(file_circles) + len(folder_circles)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
