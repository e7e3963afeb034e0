#!/usr/bin/env python3
"""Finds circles in the graph of which source file uses which, per crate.

A file uses another when it names an item of the other's module: `use crate::a::b::X`,
`crate::a::b::f(..)`, `super::b::X`, `self::b::X` or `b::X` for a child module `b`, each
item of a brace group (`use super::{X, b::Y}`), and a parent's `pub use b::X` (a re-export
uses the child). A name reached through a re-export (`crate::X` where lib.rs has
`pub use a::X`) uses the file that defines it. `::b::X` is an extern crate, not a child.
Declaring `mod b;` alone is ownership, not use. Prints every strongly connected group of two or more files, and exits 1 if there
is one (0 otherwise), so CI can hold the line.

Usage: scripts/import-cycles.py [--crates crates] [--verbose]
"""
import argparse
import os
import re
import sys
from collections import defaultdict

PATH = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
USE_BLOCK = re.compile(r"\buse\s+([^;]+);", re.S)
MOD_DECL = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+([A-Za-z_][A-Za-z0-9_]*)\s*;", re.M)
PATH_ATTR = re.compile(r'#\[path\s*=\s*"([^"]+)"\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+([A-Za-z_][A-Za-z0-9_]*)\s*;')


def strip_comments(text):
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


def modules_of(src):
    """Maps module path (tuple) -> file, following `mod x;` and `#[path]` from lib/main."""
    files = {}
    roots = [f for f in ("lib.rs", "main.rs") if os.path.exists(os.path.join(src, f))]

    def visit(path, module):
        files[module] = path
        text = strip_comments(open(path, encoding="utf-8").read())
        # Test-only modules are not part of the crate's graph.
        text = re.sub(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*;", "", text)
        here = os.path.dirname(path)
        stem = os.path.splitext(os.path.basename(path))[0]
        owns = here if stem in ("lib", "main", "mod") else os.path.join(here, stem)
        for target, name in PATH_ATTR.findall(text):
            visit(os.path.normpath(os.path.join(here, target)), module + (name,))
        for name in MOD_DECL.findall(text):
            if module + (name,) in files:
                continue
            for cand in (os.path.join(owns, name + ".rs"), os.path.join(owns, name, "mod.rs")):
                if os.path.exists(cand):
                    visit(cand, module + (name,))
                    break

    for root in roots:
        visit(os.path.join(src, root), ())
    return files


REEXPORTS = {}


def reexports_of(files):
    """By module, the names its file re-exports (`pub use child::..::Name`), and the full
    module path they come from: naming `crate::Name` uses the file that defines it, not
    the one that re-exports it."""
    out = {}
    for module, path in files.items():
        text = strip_comments(open(path, encoding="utf-8").read())
        names = {}
        for block in re.findall(r"\bpub(?:\([^)]*\))?\s+use\s+([^;]+);", text, re.S):
            for flat in expand(block):
                words = [w for w in flat.split("::") if w and w != "self"]
                if len(words) < 2:
                    continue
                name = words[-1].split(" as ")[0]
                if words[0] in ("crate", "super", "self"):
                    continue
                names[name] = module + tuple(words[:-1])
        out[module] = names
    return out


def resolve(module, words, files):
    """The file of the longest known module prefix of `module + words` (through a
    re-export to the module that defines the name)."""
    full = module + tuple(words)
    for n in range(len(full), -1, -1):
        if full[:n] in files:
            if n < len(full):
                origin = REEXPORTS.get(full[:n], {}).get(full[n])
                if origin is not None and origin != full[:n]:
                    return resolve(origin, [], files)
            return files[full[:n]]
    return None


def expand(tree):
    """The flat paths of a `use` tree: `a::{b, c::{d, e}}` -> a::b, a::c::d, a::c::e."""
    tree = re.sub(r"\s+", "", tree)
    depth, start, parts = 0, None, []
    for i, ch in enumerate(tree):
        if ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                prefix, inner, rest = tree[:start], tree[start + 1 : i], tree[i + 1 :]
                items, d, cur = [], 0, ""
                for c in inner:
                    if c == "," and d == 0:
                        items.append(cur)
                        cur = ""
                        continue
                    d += c == "{"
                    d -= c == "}"
                    cur += c
                items.append(cur)
                for item in items:
                    if item:
                        parts.extend(expand(prefix + item + rest))
                return parts
    return [re.sub(r"\bas\w+$", "", tree)]


def uses(module, path, text, files):
    out = set()
    children = {m[-1] for m in files if m[:-1] == module and len(m) == len(module) + 1}
    # Brace groups name each item under their prefix: `use super::{A, b::C}`.
    flat = " ".join(
        p + ";" for block in USE_BLOCK.findall(text) for p in expand(block) if "{" in block
    )
    for kind, rest in PATH.findall(text + " " + flat):
        words = [w for w in rest.split("::") if w and w != "self"]
        if kind == "crate":
            base = ()
        elif kind == "self":
            base = module
        else:
            base = module[:-1]
            while words and words[0] == "super":
                base, words = base[:-1], words[1:]
        target = resolve(base, words, files)
        if target:
            out.add(target)
    # `use child::X` / `pub use child::X` and `child::f()` name a child module directly.
    for block in USE_BLOCK.findall(text):
        first = re.split(r"[:{\s]", block.strip(), maxsplit=1)[0]
        if first in children:
            words = [w for w in re.split(r"[^A-Za-z0-9_]+", block) if w]
            target = resolve(module, words, files)
            if target:
                out.add(target)
    for child in children:
        # `::kube::X` is the extern crate, not a child module named `kube`.
        if re.search(r"(?<![:\w])" + child + r"::", text):
            out.add(files[module + (child,)])
    out.discard(path)
    return out


def cycles(graph):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    sys.setrecursionlimit(10000)
    for v in list(graph):
        if v not in index:
            strong(v)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--crates", default="crates")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    found = 0
    for crate in sorted(os.listdir(args.crates)):
        src = os.path.join(args.crates, crate, "src")
        if not os.path.isdir(src):
            continue
        files = modules_of(src)
        REEXPORTS.clear()
        REEXPORTS.update(reexports_of(files))
        graph = defaultdict(set)
        for module, path in files.items():
            text = strip_comments(open(path, encoding="utf-8").read())
            text = text.split("#[cfg(test)]\nmod tests")[0]
            graph[path] |= uses(module, path, text, files)
        if args.verbose:
            for v in sorted(graph):
                print(v, "->", ", ".join(sorted(graph[v])))
        for group in cycles(graph):
            found += 1
            print(f"{crate}: circle of {len(group)} files: " + " <-> ".join(group))
    if found:
        print(f"{found} circle(s)")
        return 1
    print("no circles between files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
