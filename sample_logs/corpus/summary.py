#!/usr/bin/env python3
"""Summarise the corpus from its labels.json files: cases, deaths and run time per version, and
per death kind what each version really did (deaths seen / cases, the labels they got).

    python sample_logs/corpus/summary.py [--kinds] [--readme]

--readme rewrites the two generated tables in README.md (between the COUNTS and KINDS markers).
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def load():
    out = collections.defaultdict(list)
    for f in sorted((HERE / "cases").glob("*/*/labels.json")):
        d = json.loads(f.read_text())
        out[d["version"]].append(d)
    return out


def vkey(v):
    return tuple(int(x) for x in v.split("."))


def main():
    if "--readme" in sys.argv:
        import contextlib, io, re
        readme = HERE / "README.md"
        text = readme.read_text()
        for marker, args in (("COUNTS", []), ("KINDS", ["--kinds-only"])):
            buf = io.StringIO()
            saved = sys.argv
            sys.argv = [saved[0]] + args
            with contextlib.redirect_stdout(buf):
                main()
            sys.argv = saved
            text = re.sub(r"<!-- %s -->.*?<!-- /%s -->" % (marker, marker),
                          lambda m: "<!-- %s -->\n%s<!-- /%s -->" % (marker, buf.getvalue(), marker), text, flags=re.S)
        readme.write_text(text)
        return
    data = load()
    if "--kinds-only" in sys.argv:
        sys.argv.append("--kinds")
    else:
        _counts(data)
    if "--kinds" in sys.argv:
        _kinds(data)


def _counts(data):
    print("| version | cases | deaths | no-death cases | run time (s, sum of cases) |")
    print("| --- | --- | --- | --- | --- |")
    for v in sorted(data, key=vkey):
        cs = data[v]
        nd = sum(len(c["deaths"]) for c in cs)
        zero = sum(1 for c in cs if not c["deaths"])
        rt = sum(c.get("runtime_s") or 0 for c in cs)
        print("| %s | %d | %d | %d | %.0f |" % (v, len(cs), nd, zero, rt))


def _kinds(data):
    if True:
        print()
        kinds = collections.OrderedDict()
        for v in sorted(data, key=vkey):
            for c in data[v]:
                k = c["factors"]["death"]
                row = kinds.setdefault(k, {})
                deaths = collections.Counter("%s/%s" % (d["cause"], d["detail"]) for d in c["deaths"])
                s = row.setdefault(v, [0, 0, collections.Counter()])
                s[0] += 1
                s[1] += 1 if c["deaths"] else 0
                s[2].update(deaths)
        vs = sorted(data, key=vkey)
        print("| kind | " + " | ".join(vs) + " |")
        print("| --- |" + " --- |" * len(vs))
        for k, row in kinds.items():
            cells = []
            for v in vs:
                if v not in row:
                    cells.append("")
                    continue
                n, nd, cnt = row[v]
                cells.append("%d/%d" % (nd, n) + ("" if not cnt else " " + ", ".join(
                    "%s×%d" % (lab, m) if m > 1 else lab for lab, m in cnt.most_common())))
            print("| %s | %s |" % (k, " | ".join(cells)))


if __name__ == "__main__":
    main()
