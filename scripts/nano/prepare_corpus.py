#!/usr/bin/env python3
"""Build the nano-model corpus from Debian's `bible-kjv-text` package (KJV text, public domain).

Steps (all local, no network except `apt-get download` of two Debian packages):
  1. `apt-get download bible-kjv bible-kjv-text` into a temp dir and unpack them with `dpkg -x`
     (no root needed, nothing is installed system-wide);
  2. dump every verse with the package's own `bible` program (`bible -f gen1:1-rev22:21`);
  3. group verses into chapters (one document per chapter) and assign the split:
     every 40th chapter (global chapter index % 40 == 17) is held out, the rest is train;
  4. write data/nano/kjv.jsonl.gz: one JSON object per chapter
     {"book": ..., "chapter": n, "split": "train"|"heldout", "verses": [...]}.

Use --from-dump FILE to skip steps 1-2 when a dump (`Ge1:1 In the beginning ...` lines) exists.
"""
import argparse
import gzip
import json
import os
import re
import subprocess
import tempfile

# Book abbreviations as printed by `bible -f`, in canonical order, with full names.
BOOKS = [
    ("Ge", "Genesis"), ("Exo", "Exodus"), ("Lev", "Leviticus"), ("Num", "Numbers"),
    ("Deu", "Deuteronomy"), ("Josh", "Joshua"), ("Jdgs", "Judges"), ("Ruth", "Ruth"),
    ("1Sm", "1 Samuel"), ("2Sm", "2 Samuel"), ("1Ki", "1 Kings"), ("2Ki", "2 Kings"),
    ("1Chr", "1 Chronicles"), ("2Chr", "2 Chronicles"), ("Ezra", "Ezra"), ("Neh", "Nehemiah"),
    ("Est", "Esther"), ("Job", "Job"), ("Psa", "Psalms"), ("Prv", "Proverbs"),
    ("Eccl", "Ecclesiastes"), ("SSol", "Song of Solomon"), ("Isa", "Isaiah"), ("Jer", "Jeremiah"),
    ("Lam", "Lamentations"), ("Eze", "Ezekiel"), ("Dan", "Daniel"), ("Hos", "Hosea"),
    ("Joel", "Joel"), ("Amos", "Amos"), ("Obad", "Obadiah"), ("Jonah", "Jonah"), ("Mic", "Micah"),
    ("Nahum", "Nahum"), ("Hab", "Habakkuk"), ("Zep", "Zephaniah"), ("Hag", "Haggai"),
    ("Zec", "Zechariah"), ("Mal", "Malachi"), ("Mat", "Matthew"), ("Mark", "Mark"), ("Luke", "Luke"),
    ("John", "John"), ("Acts", "Acts"), ("Rom", "Romans"), ("1Cor", "1 Corinthians"),
    ("2Cor", "2 Corinthians"), ("Gal", "Galatians"), ("Eph", "Ephesians"), ("Phi", "Philippians"),
    ("Col", "Colossians"), ("1Th", "1 Thessalonians"), ("2Th", "2 Thessalonians"),
    ("1Tim", "1 Timothy"), ("2Tim", "2 Timothy"), ("Titus", "Titus"), ("Phmn", "Philemon"),
    ("Heb", "Hebrews"), ("Jas", "James"), ("1Pet", "1 Peter"), ("2Pet", "2 Peter"), ("1Jn", "1 John"),
    ("2Jn", "2 John"), ("3Jn", "3 John"), ("Jude", "Jude"), ("Rev", "Revelation"),
]
ABBR = dict(BOOKS)
HELDOUT_EVERY, HELDOUT_OFFSET = 40, 17
LINE = re.compile(r"^([1-3]?[A-Za-z]+)(\d+):(\d+) (.*)$")


def dump_with_package(workdir):
    subprocess.run(["apt-get", "download", "bible-kjv", "bible-kjv-text"], cwd=workdir, check=True)
    root = os.path.join(workdir, "root")
    for f in sorted(os.listdir(workdir)):
        if f.endswith(".deb"):
            subprocess.run(["dpkg", "-x", os.path.join(workdir, f), root], check=True)
    out = subprocess.run([os.path.join(root, "usr/bin/bible"), "-f", "-p", os.path.join(root, "usr/lib"),
                          "gen1:1-rev22:21"], check=True, capture_output=True, text=True)
    return out.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--from-dump", help="existing `bible -f` dump")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "../../data/nano/kjv.jsonl.gz"))
    a = ap.parse_args()
    if a.from_dump:
        text = open(a.from_dump, encoding="utf-8").read()
    else:
        with tempfile.TemporaryDirectory() as d:
            text = dump_with_package(d)
    chapters = []
    for line in text.splitlines():
        line = line.rstrip()
        if not line:
            continue
        m = LINE.match(line)
        if not m:
            raise SystemExit(f"unparsed line: {line[:80]!r}")
        book, ch, _v, verse = ABBR[m.group(1)], int(m.group(2)), int(m.group(3)), m.group(4).strip()
        verse = re.sub(r"\s+", " ", verse)
        if not chapters or chapters[-1]["book"] != book or chapters[-1]["chapter"] != ch:
            chapters.append({"book": book, "chapter": ch, "verses": []})
        chapters[-1]["verses"].append(verse)
    for i, c in enumerate(chapters):
        c["split"] = "heldout" if i % HELDOUT_EVERY == HELDOUT_OFFSET else "train"
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    # mtime=0 keeps the gzip byte-reproducible
    with open(a.out, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, compresslevel=9) as f:
        for c in chapters:
            f.write((json.dumps(c, ensure_ascii=False) + "\n").encode("utf-8"))
    nv = sum(len(c["verses"]) for c in chapters)
    nh = sum(c["split"] == "heldout" for c in chapters)
    print(f"{len(chapters)} chapters, {nv} verses, {nh} held-out chapters -> {a.out}")


if __name__ == "__main__":
    main()
