#!/usr/bin/python3
"""Checks that no production function is longer than 120 lines.

Production code: the C and C++ files git tracks under daemon/, client/,
common/, ipc/, gpu/ and tools/. A function's length runs from the first
line of its signature to its closing brace; lambdas and local classes count
as part of the function around them. Braces are matched after comments,
string and character literals and preprocessor lines are blanked out.

  scripts/check-function-length.py            lists those over the limit, exit 1
  scripts/check-function-length.py --top 20   the 20 longest, exit 0
"""
import re
import subprocess
import sys

LIMIT = 120
ROOTS = ["daemon", "client", "common", "ipc", "gpu", "tools"]
NOT_A_FUNCTION = {"if", "for", "while", "switch", "catch", "return", "sizeof", "decltype",
                  "alignof", "static_assert", "defined"}


def blank(src):
    """`src` with comments, literals and preprocessor lines as spaces (newlines kept)."""
    out, i, n = [], 0, len(src)
    spaces = lambda text: re.sub(r"[^\n]", " ", text)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif src.startswith('R"', i) and re.match(r'R"([^(\s]*)\(', src[i:]):
            delim = re.match(r'R"([^(\s]*)\(', src[i:]).group(1)
            j = src.find(")" + delim + '"', i)
            j = n if j < 0 else j + len(delim) + 2
        elif c == '"' or (c == "'" and not (i > 0 and src[i - 1].isalnum())):
            j = i + 1
            while j < n and src[j] != c:
                j += 2 if src[j] == "\\" else 1
            j += 1
        elif c == "#" and (i == 0 or src[i - 1] == "\n"):
            j = i
            while True:
                k = src.find("\n", j)
                k = n if k < 0 else k
                if k > 0 and src[k - 1] == "\\":
                    j = k + 1
                    continue
                break
            j = k
        else:
            out.append(c)
            i += 1
            continue
        out.append(spaces(src[i:j]))
        i = j
    return "".join(out)


def looks_like_function(head):
    """Whether the text before a `{` at namespace or class scope opens a function body."""
    h = re.sub(r"\s+", " ", head).strip()
    if h.startswith(("namespace", "class ", "struct ", "enum ", "union ", "extern ")):
        return False
    ends_like_signature = (
        re.search(r"\)\s*(const|override|final|noexcept|mutable|\s)*(->\s*[^{]+)?$", h)
        or re.search(r"\)\s*:\s*\w", h)  # a constructor's initializer list
        or re.search(r"\)\s*ABSL_\w+\(.*\)$", h))  # a thread-safety annotation
    if not ends_like_signature:
        return False
    name = re.search(r"([\w:~]+|operator\s*\S+)\s*\(", h)
    if name and name.group(1) in NOT_A_FUNCTION:
        return False
    # `auto x = [] {` or `int y = f(z) {`: an initializer, not a definition.
    before_paren = h.split("(")[0].replace("operator=", "").replace("==", "")
    return "=" not in before_paren


def function_lengths(path):
    """(lines, first line, signature) of every function defined in `path`."""
    s = blank(open(path, errors="replace").read())
    stack = []  # ("fn" | "scope" | "block", start offset)
    head_start = 0  # where the declaration being read at namespace/class scope began
    found = []
    for i, c in enumerate(s):
        in_function = any(kind == "fn" for kind, _ in stack)
        if c == "{":
            if in_function:
                stack.append(("block", i))
                continue
            head = s[head_start:i]
            if looks_like_function(head):
                stack.append(("fn", head_start + len(head) - len(head.lstrip())))
            else:
                stack.append(("scope", i))
            head_start = i + 1
        elif c == "}" and stack:
            kind, start = stack.pop()
            if kind == "fn":
                first = s.count("\n", 0, start) + 1
                last = s.count("\n", 0, i) + 1
                signature = re.sub(r"\s+", " ", s[start:start + 100]).strip()
                found.append((last - first + 1, first, signature))
            if not any(k == "fn" for k, _ in stack):
                head_start = i + 1
        elif c == ";" and not in_function:
            head_start = i + 1
    return found


def main():
    top = int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[1] == "--top" else 0
    files = subprocess.run(["git", "ls-files", "--"] + [f"{r}/*.{e}" for r in ROOTS
                                                         for e in ("cc", "h", "c", "cu")],
                           check=True, capture_output=True, text=True).stdout.split()
    lengths = []
    for path in files:
        lengths += [(n, path, line, sig) for n, line, sig in function_lengths(path)]
    lengths.sort(reverse=True)
    if top:
        for n, path, line, sig in lengths[:top]:
            print(f"{n:5d}  {path}:{line}  {sig[:70]}")
        return 0
    over = [x for x in lengths if x[0] > LIMIT]
    for n, path, line, sig in over:
        print(f"function over {LIMIT} lines ({n}): {path}:{line}  {sig[:70]}")
    if over:
        return 1
    print(f"function length: every function of {len(files)} production files "
          f"is at most {LIMIT} lines (longest {lengths[0][0] if lengths else 0})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
