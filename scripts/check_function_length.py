#!/usr/bin/env python3
"""Fails when a C++ function is longer than STYLE.md allows (120 lines), outside the kernels'
inner loops listed in scripts/function_length_allowlist.txt.

A function's length is the number of lines from the first line of its definition (the first
token after the previous declaration, so `template <...>` and the return type count) to its
closing brace, comments and blank lines inside included; a constructor's initializer list is
part of it. Lambdas and local classes count toward the function that holds them. Namespace-
scope lambdas (`auto f = [...](...) {...};`) are functions; braced data (`const T kTable[] =
{...};`, `int x_{0};`) is not.

Scanned: src/, include/, bench/ and python/src/ (every .h/.cc/.cu/.cuh/.cpp/.hpp file), unit
tests beside the sources included. Not scanned: tests/ (cross-layer test drivers whose long
TEST bodies are tables of cases; they are held to the limit by review, not by this check).

How it reads C++: a token scanner that drops comments, string and character literals (raw
strings too), digit separators and preprocessor lines, then matches braces, knowing namespace,
`extern "C"`, class/struct/union/enum bodies and function bodies apart. It does not expand
macros: a macro that opens a brace it does not close confuses it (none does in this tree).

The allowlist holds one entry a line: `PATH NAME MAX_LINES REASON...` (`#` starts a comment).
NAME is the function's qualified name as this script prints it; MAX_LINES caps the entry so an
allowed function cannot keep growing; the reason is required. An entry that no longer matches
a function over 120 lines fails the check too (delete it: the list may only shrink).

Usage: scripts/check_function_length.py [ROOT] [--allowlist FILE] [--max-lines N] [--list]
  exit 0 clean, 1 with one line per violation, 2 on a usage or allowlist error.
  --list prints every function over the limit, allowed or not, longest first.
"""
import argparse
import pathlib
import re
import sys

MAX_LINES = 120
SCANNED_DIRS = ("src", "include", "bench", "python/src")
SUFFIXES = (".h", ".cc", ".cu", ".cuh", ".cpp", ".hpp")

IDENT_START = re.compile(r"[A-Za-z_]")
IDENT = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
PP_NUMBER = re.compile(r"\.?[0-9](?:[eEpP][+-]|[0-9A-Za-z_.']|'(?=[0-9A-Za-z]))*")
RAW_STRING = re.compile(r'(?:u8|u|U|L)?R"([^()\\ ]{0,16})\(')
STRING_PREFIX = re.compile(r"(?:u8|u|U|L)?[\"']")
PUNCT2 = ("::", "->", "==", "!=", "<=", ">=", "&&", "||", "<<", "+=", "-=", "*=", "/=", "|=",
          "&=", "^=", "%=")


class Token:
    __slots__ = ("kind", "text", "line")

    def __init__(self, kind, text, line):
        self.kind = kind  # "id", "num", "str", "punct"
        self.text = text
        self.line = line

    def __repr__(self):
        return f"{self.kind}:{self.text}@{self.line}"


def tokenize(text):
    """Significant tokens of a C++ file: no comments, no preprocessor lines, literals folded."""
    tokens = []
    i, n, line = 0, len(text), 1
    at_line_start = True  # only whitespace so far on this line
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
            at_line_start = True
            continue
        if c in " \t\r\f\v":
            i += 1
            continue
        if c == "#" and at_line_start:  # preprocessor directive, with its continuation lines
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    line += 1
                    i += 2
                    continue
                if text.startswith("/*", i):  # a block comment may span lines
                    end = text.find("*/", i + 2)
                    end = n if end < 0 else end + 2
                    line += text.count("\n", i, end)
                    i = end
                    continue
                i += 1
            continue
        at_line_start = False
        if text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            line += text.count("\n", i, end)
            i = end
            continue
        m = RAW_STRING.match(text, i)
        if m:
            close = ")" + m.group(1) + '"'
            end = text.find(close, m.end())
            end = n if end < 0 else end + len(close)
            tokens.append(Token("str", "R\"\"", line))
            line += text.count("\n", i, end)
            i = end
            continue
        m = STRING_PREFIX.match(text, i)
        if m:
            quote = text[m.end() - 1]
            j = m.end()
            while j < n and text[j] != quote and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            tokens.append(Token("str", quote * 2, line))
            i = j + 1
            continue
        if IDENT_START.match(c):
            m = IDENT.match(text, i)
            tokens.append(Token("id", m.group(0), line))
            i = m.end()
            continue
        m = PP_NUMBER.match(text, i)
        if m:
            tokens.append(Token("num", m.group(0), line))
            i = m.end()
            continue
        two = text[i:i + 2]
        if two in PUNCT2:
            tokens.append(Token("punct", two, line))
            i += 2
            continue
        tokens.append(Token("punct", c, line))
        i += 1
    return tokens


def skip_template_heads(header):
    """The header without leading `template <...>` clauses (angle brackets matched)."""
    k = 0
    while k + 1 < len(header) and header[k].text == "template" and header[k + 1].text == "<":
        depth, k = 0, k + 1
        while k < len(header):
            t = header[k].text
            if t == "<":
                depth += 1
            elif t == ">":
                depth -= 1
            elif t == ">>":
                depth -= 2
            k += 1
            if depth <= 0:
                break
    return header[k:]


def top_level_assign(header):
    """Index of a `=` outside (), [] and template arguments, not part of `operator=`; or -1."""
    depth = 0
    for k, t in enumerate(header):
        if t.text in ("(", "["):
            depth += 1
        elif t.text in (")", "]"):
            depth -= 1
        elif t.text == "=" and depth == 0 and not (k > 0 and header[k - 1].text == "operator"):
            return k
    return -1


def classify(header):
    """What a `{` opened after these tokens (at namespace or class scope) is."""
    texts = [t.text for t in header]
    if "namespace" in texts:
        return "namespace"
    if len(header) >= 2 and texts[0] == "extern" and header[1].kind == "str":
        return "namespace"
    rest = skip_template_heads(header)
    for t in rest:
        if t.text == "(":
            break
        if t.text in ("class", "struct", "union", "enum"):
            return "class" if t.text != "enum" else "data"
    eq = top_level_assign(rest)
    if eq >= 0:
        after = rest[eq + 1:]
        if after and after[0].text == "[" and any(t.text == "(" for t in after) or \
                after and after[0].text == "[" and after[-1].text == "]":
            return "function"  # a lambda bound at namespace or class scope
        return "data"
    if any(t.text == "(" for t in rest):
        return "function"
    return "data"


def function_name(header):
    """`Ns::Class::Method`, `operator==`, `TEST(Suite,Name)`: the name before the parameters."""
    rest = skip_template_heads(header)
    eq = top_level_assign(rest)
    if eq >= 0:  # a lambda: the variable's name
        ids = [t.text for t in rest[:eq] if t.kind == "id"]
        return ids[-1] if ids else "<lambda>"
    for k, t in enumerate(rest):
        if t.text != "(":
            continue
        j = k - 1
        parts = []
        if j >= 0 and rest[j].kind != "id" and j >= 1 and rest[j - 1].text == "operator":
            parts = ["operator" + rest[j].text]
            j -= 2
        elif j >= 0 and rest[j].kind == "id":
            parts = [rest[j].text]
            j -= 1
        else:
            continue
        while j >= 1 and rest[j].text == "::" and rest[j - 1].kind == "id":
            parts.insert(0, rest[j - 1].text)
            j -= 2
        while j >= 1 and rest[j].text == "~" and not parts[0].startswith("~"):
            parts[0] = "~" + parts[0]
            j -= 1
        name = "::".join(parts)
        if len(parts) == 1 and re.fullmatch(r"[A-Z][A-Z0-9_]+", name):  # a macro: TEST(Suite, Name)
            depth, args = 0, []
            for u in rest[k:]:
                depth += u.text == "("
                depth -= u.text == ")"
                args.append(u.text)
                if depth == 0:
                    break
            name += "".join(args)
        return name
    return "<unnamed>"


def find_functions(text):
    """(name, first_line, last_line) for every function defined at namespace or class scope."""
    tokens = tokenize(text)
    found = []
    scopes = []  # kinds of the open braces: namespace, class, function, data, block
    stmt_start = 0  # first token of the current declaration at namespace or class scope
    pending = None  # (name, first_line) of a function whose braces are not all closed yet
    i = 0
    while i < len(tokens):
        t = tokens[i]
        in_body = any(s in ("function", "data", "block") for s in scopes)
        if in_body:
            if t.text == "{":
                scopes.append("block")
            elif t.text == "}":
                kind = scopes.pop()
                if kind == "function" and not any(
                        s in ("function", "data", "block") for s in scopes):
                    nxt = tokens[i + 1].text if i + 1 < len(tokens) else ""
                    if nxt in (",", "{"):  # constructor initializer list goes on: a_{1}, b_{2}
                        pass
                    else:
                        found.append((pending[0], pending[1], t.line))
                        pending = None
                        stmt_start = i + 1
                elif kind == "data" and not any(
                        s in ("function", "data", "block") for s in scopes):
                    stmt_start = i + 1
            i += 1
            continue
        # At namespace or class scope.
        if t.text == ";":
            stmt_start = i + 1
        elif t.text in ("public", "private", "protected") and i + 1 < len(tokens) and \
                tokens[i + 1].text == ":" and scopes and scopes[-1] == "class":
            stmt_start = i + 2
            i += 1
        elif t.text == "{":
            if pending is not None:  # the next brace of a constructor's initializer list
                scopes.append("function")
            else:
                header = tokens[stmt_start:i]
                kind = classify(header)
                if kind == "function":
                    start = header[0].line if header else t.line
                    pending = (function_name(header), start)
                scopes.append(kind)
                if kind in ("namespace", "class"):
                    stmt_start = i + 1
        elif t.text == "}":
            if scopes:
                scopes.pop()
            stmt_start = i + 1
        i += 1
    if pending is not None:  # unbalanced file: report to the end rather than drop it
        found.append((pending[0], pending[1], tokens[-1].line if tokens else pending[1]))
    return found


def read_allowlist(path):
    entries = {}
    errors = []
    if path is None or not path.exists():
        return entries, errors
    for no, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split(None, 3)
        if len(parts) < 4 or not parts[2].isdigit():
            errors.append(f"{path}:{no}: expected 'PATH NAME MAX_LINES REASON', got {raw!r}")
            continue
        entries[(parts[0], parts[1])] = (int(parts[2]), parts[3], no)
    return entries, errors


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", nargs="?", default=pathlib.Path(__file__).resolve().parent.parent,
                    type=pathlib.Path)
    ap.add_argument("--allowlist", type=pathlib.Path, default=None,
                    help="default: ROOT/scripts/function_length_allowlist.txt")
    ap.add_argument("--max-lines", type=int, default=MAX_LINES)
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()
    root = args.root
    allowlist = args.allowlist or root / "scripts" / "function_length_allowlist.txt"
    entries, problems = read_allowlist(allowlist)
    if problems:
        print("\n".join(problems))
        return 2
    files = sorted(p for d in SCANNED_DIRS if (root / d).is_dir() for p in (root / d).rglob("*")
                   if p.suffix in SUFFIXES and p.is_file())
    if not files:
        print(f"check_function_length: no sources under {root}/{{{','.join(SCANNED_DIRS)}}}",
              file=sys.stderr)
        return 2
    long_functions = []
    for f in files:
        rel = f.relative_to(root).as_posix()
        for name, first, last in find_functions(f.read_text(encoding="utf-8", errors="replace")):
            lines = last - first + 1
            if lines > args.max_lines:
                long_functions.append((rel, name, first, lines))
    if args.list:
        for rel, name, first, lines in sorted(long_functions, key=lambda x: -x[3]):
            print(f"{lines:5d}  {rel}:{first}  {name}")
        return 0
    used = set()
    for rel, name, first, lines in long_functions:
        entry = entries.get((rel, name))
        if entry is None:
            problems.append(f"{rel}:{first}: function '{name}' is {lines} lines, expected at most "
                            f"{args.max_lines} (split it into named steps; STYLE.md)")
        elif lines > entry[0]:
            problems.append(f"{rel}:{first}: function '{name}' is {lines} lines, expected at most "
                            f"{entry[0]} (its allowlist cap, {allowlist.name}:{entry[2]})")
            used.add((rel, name))
        else:
            used.add((rel, name))
    for key, (cap, reason, no) in sorted(entries.items(), key=lambda kv: kv[1][2]):
        if key not in used:
            problems.append(f"{allowlist.name}:{no}: '{key[0]} {key[1]}' is not a function over "
                            f"{args.max_lines} lines any more (delete the entry)")
    for p in problems:
        print(p)
    print(f"check_function_length: {len(files)} files, {len(long_functions)} function(s) over "
          f"{args.max_lines} lines, {len(long_functions) - len(used)} not allowed, "
          f"{len(problems)} problem(s)", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
