#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Checks that the C sources call each other in layers, with no circles:
file A "calls" file B when A calls a function that B defines (not
static). Every set of files that reach each other through such calls (a
strongly connected component of more than one file) is printed with the
calls that close it, and the exit status is 1. It also checks that each
public function of daemon/ starts with its file's name (jobs_on_message
belongs in jobs.c, not dispatch.c), and that every public destructor
(a void function named *_free, *_close, *_destroy or *_release) takes
the caller's pointer as T ** and nulls it, as czmq's do: one that does
not is listed, and the exit status is 1. A function that releases what
a struct holds while the struct stays the caller's is a *_clear; the
library's C API (gnmr_*) keeps its published signatures. And no
function is longer than MAX_LINES lines (signature to closing brace):
a longer one is split into named phases.

    scripts/layers.py [DIR ...]     (default: the source folders)

A heuristic reading of C, enough for this tree: definitions start at
column 0 and reach a "{" before any ";"; calls
are NAME( outside comments and strings; a function two files define
(alternative builds of one interface) is no one's. `make check` runs it.
"""
import os
import re
import sys

DIRS = ("common", "policy", "proto", "store", "daemon", "cuda_agent",
        "client", "sim")
DEF = re.compile(r"^(?!static\b)(?!typedef\b)(?!extern\b)(?!return\b)"
                 r"[A-Za-z_][\w \t\*]*?\b([A-Za-z_]\w*)\s*\(")
STATIC = re.compile(r"^static\b[\w \t\*]*?\b([A-Za-z_]\w*)\s*\(")
CALL = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
# One pass over the text, as the compiler's lexer reads it: whichever of
# a comment, a string or a character constant opens first is the one
# that is open (a "//" inside a string is not a comment, a quote inside a
# comment opens no string).
TOKEN = re.compile(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|'
                   r"'(?:\\.|[^'\\\n])*'", re.S)


def strip(text):
    """text with every comment a space (its newlines kept, so that lines
    stay lines) and every string and character constant empty."""
    def blank(m):
        t = m.group(0)
        if t[0] == "/":
            return "\n" * t.count("\n") or " "
        return t[0] * 2
    return TOKEN.sub(blank, text)


def read(root, dirs):
    files = {}
    for d in dirs:
        top = os.path.join(root, d)
        for dirpath, _, names in os.walk(top):
            for n in sorted(names):
                if n.endswith(".c"):
                    p = os.path.join(dirpath, n)
                    with open(p, encoding="utf-8", errors="replace") as f:
                        files[os.path.relpath(p, root)] = strip(f.read())
    return files


def definitions(text, rx=None):
    """The functions text defines: public ones (rx None), or those rx
    matches (STATIC)."""
    out, lines = set(), text.split("\n")
    for i, line in enumerate(lines):
        m = (rx or DEF).match(line)
        if not m:
            continue
        rest = "\n".join(lines[i:i + 6])
        brace, semi = rest.find("{"), rest.find(";")
        if brace >= 0 and (semi < 0 or brace < semi):
            out.add(m.group(1))
    return out


def graph(files):
    owner, twice = {}, set()
    for f, text in files.items():
        for name in definitions(text):
            if name in owner:
                twice.add(name)   # alternatives (cuda_backend/cuda_none)
            owner.setdefault(name, f)
    for name in twice:
        del owner[name]
    edges = {f: {} for f in files}
    for f, text in files.items():
        own = definitions(text, STATIC)   # a call to these stays here
        for m in CALL.finditer(text):
            if m.group(1) in own:
                continue
            g = owner.get(m.group(1))
            if g is not None and g != f:
                edges[f].setdefault(g, m.group(1))
    return edges


def components(edges):
    """Tarjan's strongly connected components, iteratively."""
    index, low, on, stack, out, n = {}, {}, set(), [], [], [0]
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = n[0]
        n[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = n[0]
                    n[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
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
    return out


# the folders whose public functions carry their file's name as prefix
PREFIXED = ("daemon",)


def misnamed(files):
    """(file, function) for each public function of a PREFIXED folder
    whose name does not start with its file's name and "_" (main
    excepted)."""
    out = []
    for f, text in sorted(files.items()):
        if not set(f.split(os.sep)[:-1]) & set(PREFIXED):
            continue
        stem = os.path.basename(f)[:-2]
        for name in sorted(definitions(text)):
            if name != "main" and not name.startswith(stem + "_"):
                out.append((f, name))
    return out


DTOR = re.compile(r"^(?!static\b)[\w \t\*]*?\bvoid\s+"
                  r"(\w+_(?:free|close|destroy|release))\s*\(([^)]*)\)",
                  re.M)


def dangling(files):
    """(file, function) for each public destructor whose parameters have
    no T ** (the pointer it frees, to be nulled); the C API's gnmr_*
    functions excepted."""
    out = []
    for f, text in sorted(files.items()):
        for m in DTOR.finditer(text):
            name = m.group(1)
            if not text[m.end():].lstrip().startswith("{"):
                continue  # a declaration
            if name.startswith("gnmr_") and not name.startswith("gnmr__"):
                continue
            if m.group(2).strip() in ("", "void"):
                continue  # a reference count's release: no pointer
            if "**" not in m.group(2):
                out.append((f, name))
    return out


MAX_LINES = 100
ANY_DEF = re.compile(r"^(?!typedef\b)(?!extern\b)(?!return\b)"
                     r"[A-Za-z_][\w \t\*]*?\b([A-Za-z_]\w*)\s*\(")


def long_functions(files, limit=MAX_LINES):
    """(file, function, lines) for each function, static or not, whose
    definition (from its first line to the "}" at column 0 that ends it)
    is longer than limit lines."""
    out = []
    for f, text in sorted(files.items()):
        lines = text.split("\n")
        i = 0
        while i < len(lines):
            m = ANY_DEF.match(lines[i])
            if not m:
                i += 1
                continue
            j = i  # the line that opens the body, before any ";"
            while j < len(lines) and "{" not in lines[j] and \
                    ";" not in lines[j]:
                j += 1
            if j >= len(lines) or "{" not in lines[j] or \
                    ";" in lines[j].split("{")[0]:
                i += 1
                continue
            k = j
            while k < len(lines) and lines[k].rstrip() != "}":
                k += 1
            if k - i + 1 > limit:
                out.append((f, m.group(1), k - i + 1))
            i = k + 1
    return out


MAX_FILE_LINES = 700
PY_DIR = os.path.join("python", "gnmr")


def python_sizes(root, limit=MAX_LINES, file_limit=MAX_FILE_LINES):
    """The Python package's sizes, as C's (issue 63): (file, function,
    lines) for each function or method longer than limit lines, and
    (file, None, lines) for each module longer than file_limit."""
    import ast
    out = []
    base = os.path.join(root, PY_DIR)
    for d, _, names in sorted(os.walk(base)):
        for n in sorted(names):
            if not n.endswith(".py"):
                continue
            path = os.path.join(d, n)
            rel = os.path.relpath(path, root)
            with open(path) as f:
                text = f.read()
            if text.count("\n") > file_limit:
                out.append((rel, None, text.count("\n")))
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n_lines = node.end_lineno - node.lineno + 1
                    if n_lines > limit:
                        out.append((rel, node.name, n_lines))
    return out


def main(argv):
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
    dirs = argv or DIRS
    files = read(root, dirs)
    names = misnamed(files)
    for f, name in names:
        print(f"layers: {f} defines {name}(), whose prefix is not "
              f"{os.path.basename(f)[:-2]}_")
    dtors = dangling(files)
    for f, name in dtors:
        print(f"layers: {f} defines {name}(), a destructor that takes no "
              "T ** to null (or a *_clear of what a struct holds)")
    longs = long_functions(files)
    for f, name, n in longs:
        print(f"layers: {f} defines {name}() in {n} lines, more than "
              f"{MAX_LINES}: split it into named phases")
    if not argv:   # the tree itself: the Python package's sizes too
        for f, name, n in python_sizes(root):
            longs.append((f, name, n))
            print(f"layers: {f} has {n} lines, more than {MAX_FILE_LINES}: "
                  "split it along its concerns" if name is None else
                  f"layers: {f} defines {name}() in {n} lines, more than "
                  f"{MAX_LINES}: split it into named phases")
    edges = graph(files)
    bad = components(edges)
    for comp in bad:
        print("layers: these files call each other in a circle:")
        for f in comp:
            for g, fn in sorted(edges[f].items()):
                if g in comp:
                    print(f"  {f} -> {g} ({fn})")
    if not bad:
        print(f"layers: {len(edges)} files, no circle")
    if not names:
        print("layers: every public function of "
              f"{', '.join(d + '/' for d in PREFIXED)} is named after "
              "its file")
    if not dtors:
        print("layers: every destructor takes T ** and nulls it")
    if not longs:
        print(f"layers: no function is longer than {MAX_LINES} lines, no "
              f"module of {PY_DIR} longer than {MAX_FILE_LINES}")
    return 1 if bad or names or dtors or longs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
