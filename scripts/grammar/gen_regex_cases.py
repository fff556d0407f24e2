#!/usr/bin/env python3
"""Write tests/data/grammar/regex_cases.json: patterns with candidate strings and Python `re`
verdicts, both full-match (the regex spec) and search (JSON Schema `pattern`). Python is the judge.
Patterns stay in the dialect subset where JavaScript and Python agree."""
import json, os, random, re

PATTERNS = [
    "abc", "a|b|cd", "(ab)*", "a+b?c*", "[a-c]{2,3}", "x{3}", "x{2,}", "[^a]b", "\\d+\\.\\d{2}",
    "\\w+@\\w+", "(foo|bar)+baz", "[0-9a-fA-F]{4}", "a.c", "(a|ab)(c|bcd)", "[\\-+]?\\d*", "(?:x|y)z",
    "\u00e9+", "[\u4e00-\u4e0f]{1,2}", "[^\\s]+", "a{0,2}b{1,2}", "(a*)*", "((a|b)c)?d", "\\$\\^\\.",
    "[\\]\\[]", "\\u0041+", "\\x41\\x42", "\\t\\n", "[a-z]*z", "(cat|dog)s?", "0|[1-9][0-9]*",
    "[.]", "\\S\\D\\W", "[^\\d\\s]", "(a|b|c|d|e)+f",
]
SEARCH = ["^ab", "b$", "^a.c$", "\\d", "x+y", "^(a|b)+$"]

def alphabet(p):
    chars = set(c for c in p if c not in "\\()[]{}|*+?^$") | set("abcxyz019 .-+@_\u00e9\u4e00")
    return sorted(chars)

def candidates(p, rng):
    al = alphabet(p)
    out = {"", "a", "ab", "abc", "xxx", "x", "1.23", "a@b", "foobaz", "barfoobaz", "\u00e9\u00e9", "\u4e00",
           "\t\n", "AB", "AAA", "$^.", "]", "[", "cats", "dog", "0", "10", "01", "abcd", "abcbcd", "d", "cd", "bcd"}
    for _ in range(60):
        out.add("".join(rng.choice(al) for _ in range(rng.randint(0, 6))))
    return sorted(out)

rng = random.Random(7)
cases = []
for p in PATTERNS + SEARCH:
    strings = candidates(p, rng)
    cases.append({
        "pattern": p,
        "strings": [{"s": s, "full": re.fullmatch(p, s) is not None, "search": re.search(p, s) is not None}
                    for s in strings],
    })
root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
json.dump(cases, open(os.path.join(root, "tests/data/grammar/regex_cases.json"), "w"), ensure_ascii=False, indent=0)
print(len(cases), "patterns", sum(len(c["strings"]) for c in cases), "strings")
