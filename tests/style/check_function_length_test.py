#!/usr/bin/env python3
"""scripts/check_function_length.py must fail on a function over 120 lines, however its braces
are hidden (strings, comments, character literals, raw strings, initializer lists), and must
not count data tables, short functions or tests/: it runs the script on small trees written
here."""
import pathlib
import subprocess
import sys
import tempfile

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "check_function_length.py"


def body(n, indent="  "):
    """n lines of statements."""
    return "".join(f"{indent}x += {k};\n" for k in range(n))


def function(name, lines, head="int {name}(int x) {{\n"):
    """A function of exactly `lines` lines, signature and closing brace included."""
    return head.format(name=name) + body(lines - 2 - head.count("\n")) + "  return x;\n}\n"


def run(files, allowlist=None):
    with tempfile.TemporaryDirectory() as d:
        root = pathlib.Path(d)
        for rel, text in files.items():
            p = root / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
        cmd = [sys.executable, SCRIPT, root]
        if allowlist is not None:
            (root / "allow.txt").write_text(allowlist)
            cmd += ["--allowlist", root / "allow.txt"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        return r.returncode, r.stdout + r.stderr


TRICKY_SHORT = r'''#include <string>
#define OPEN {
namespace ns {
namespace {
const int kTable[] = {
''' + "".join(f"  {k},\n" for k in range(200)) + r'''};
}  // namespace
struct Holder {
  int value_{0};
  std::string s_ = "}}}";
  int Get() const { return value_; }
};
extern "C" {
int c_function(int x) { return x; }
}
Holder::Holder(int v) : value_{v}, s_{"{"} { value_ += 1'000'000; }
const auto kTwice = [](int x) { return 2 * x; };
int Braces(char c) {
  if (c == '{') return 1;  // {
  /* { { { */
  const char* raw = R"x({"a": {"b": }}})x";
  return raw[0] == '}' ? 2 : 3;
}
}  // namespace ns
'''


def cases():
    at_limit = function("AtLimit", 120)
    over = function("Over", 121)
    yield ("function of 120 lines accepted", {"src/a/ok.cc": at_limit + TRICKY_SHORT}, None,
           0, "0 function(s) over")
    yield ("function of 121 lines rejected", {"src/a/long.cc": over}, None,
           1, "src/a/long.cc:1: function 'Over' is 121 lines, expected at most 120")
    # After tables, literals, extern "C" and initializer lists the scan is back at file scope.
    line = TRICKY_SHORT.count("\n") + 1
    yield ("long function after tricky code", {"src/a/t.cc": TRICKY_SHORT + over}, None,
           1, f"src/a/t.cc:{line}: function 'Over' is 121 lines")
    # A closing brace in a string, a comment or a character literal must not end the function.
    hidden = ("int Hidden(int x) {\n  const char* s = \"}\";\n  // }\n  /* } */\n"
              "  char c = '}';\n  const char* r = R\"d(})d\";\n" + body(120) + "  return x;\n}\n")
    yield ("braces in literals and comments", {"include/moeshard/a/h.h": hidden}, None,
           1, "include/moeshard/a/h.h:1: function 'Hidden' is 128 lines")
    ctor = ("struct S { S(int); int a_; int b_; };\nS::S(int v)\n    : a_{v},\n      b_{v} {\n"
            + body(120) + "}\n")
    yield ("constructor with a braced initializer list", {"bench/c.cc": ctor}, None,
           1, "bench/c.cc:2: function 'S::S' is 124 lines")
    method = ("namespace n {\nclass C {\n public:\n  template <typename T>\n"
              "  T Method(T x) const {\n" + body(120) + "    return x;\n  }\n};\n}  // namespace n\n")
    yield ("method defined in its class", {"python/src/m.cc": method}, None,
           1, "python/src/m.cc:4: function 'Method' is 124 lines")
    test = "TEST(Suite, Name) {\n  int x = 0;\n" + body(120) + "}\n"
    yield ("a long TEST in a unit test beside the source", {"src/a/a_test.cc": test}, None,
           1, "function 'TEST(Suite,Name)' is 123 lines")
    lam = "const auto kLambda = [](int x) {\n" + body(120) + "  return x;\n};\n"
    yield ("a long lambda at namespace scope", {"src/a/l.cc": lam}, None,
           1, "function 'kLambda' is 123 lines")
    yield ("tests/ is not scanned", {"src/a/ok.cc": at_limit, "tests/t.cc": over}, None,
           0, "0 function(s) over")
    yield ("allowlisted function accepted", {"src/a/long.cc": over},
           "src/a/long.cc Over 130 an inner loop kept whole for the compiler\n",
           0, "1 function(s) over 120 lines, 0 not allowed")
    yield ("allowlisted function over its cap", {"src/a/long.cc": function("Over", 131)},
           "src/a/long.cc Over 130 an inner loop kept whole\n",
           1, "function 'Over' is 131 lines, expected at most 130 (its allowlist cap")
    yield ("stale allowlist entry", {"src/a/ok.cc": at_limit},
           "src/a/ok.cc AtLimit 130 was long once\n",
           1, "'src/a/ok.cc AtLimit' is not a function over 120 lines any more (delete the entry)")
    yield ("allowlist entry without a reason", {"src/a/long.cc": over},
           "src/a/long.cc Over 130\n", 2, "expected 'PATH NAME MAX_LINES REASON'")


def main():
    failures = 0
    for name, files, allowlist, want_rc, expected in cases():
        rc, out = run(files, allowlist)
        if rc != want_rc or expected not in out:
            print(f"FAIL {name}: rc {rc} (expected {want_rc}), expected a line with "
                  f"{expected!r}, got:\n{out}")
            failures += 1
        else:
            print(f"ok   {name}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
