"""``--format junit`` / ``--junit FILE``: one test case per worker death, for CI test-report pages.

Covers: the common JUnit XML shape that Jenkins, GitLab, GitHub test reporters and Azure read —
``<testsuites>`` holding one ``<testsuite name="kwdiag check">`` with ``tests``, ``failures``,
``errors``, ``skipped`` and ``time`` counts, and a ``<testcase classname="kwdiag.<cause>"
name="<worker> #<incarnation>: <cause>/<detail>">`` per death: a ``<failure message type>`` whose
text holds the verdict, evidence (file:line) and fix when the death fails the policy, ``<skipped>``
when the baseline knows it, nothing (a pass) when it is allowed or below the threshold. Each input
that could not be read is an ``<error>`` test case. With no deaths at all there is one passing test
case, since some consumers reject an empty suite.

All text is XML-escaped by ElementTree, and characters XML 1.0 cannot carry at all (C0 controls,
lone surrogates, U+FFFE/U+FFFF) are removed first.

Does not cover: JUnit features no consumer agrees on (properties, ``system-out`` per case).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from kwdiag.check import Outcome
from kwdiag.check.policy import BASELINED, FAIL
from kwdiag.escape import safe
from kwdiag.report.text import conf

_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def x(text: str, limit: int = 1000) -> str:
    """Text fit for an XML 1.0 document (ElementTree does the &<>\" escaping)."""
    return _NOT_XML.sub("\ufffd", safe(text, limit))


def _body(f) -> str:
    d = f.death
    lines = [f"{d.worker} #{d.incarnation}: {f.verdict} (severity {d.severity}, confidence {conf(d.confidence)}, "
             f"fingerprint {f.fingerprint})"]
    if d.summary:
        lines.append(d.summary)
    lines.append("")
    lines += [f"{e.file}:{e.line}: {safe(e.text)}" for e in d.evidence]
    if d.hints:
        lines.append("")
    lines += [f"fix ({h.runtime}): {h.text}" for h in d.hints]
    lines.append("")
    lines.append(f"why it fails: {f.reason}")
    return "\n".join(x(line, 2000) for line in lines)


def render_junit(outcome: Outcome) -> str:
    report = outcome.report
    root = ET.Element("testsuites", name="kwdiag check")
    suite = ET.SubElement(root, "testsuite", name="kwdiag check")
    tests = failures = skipped = errors = 0
    for f in outcome.findings:
        d = f.death
        tests += 1
        case = ET.SubElement(suite, "testcase", classname=f"kwdiag.{d.cause}",
                             name=x(f"{d.worker} #{d.incarnation}: {f.verdict}", 300), time="0")
        if f.status == FAIL:
            failures += 1
            first = d.hints[0].text if d.hints else (d.summary or f.verdict)
            failure = ET.SubElement(case, "failure", message=x(f"{f.verdict}: {first}", 500), type=f.verdict)
            failure.text = _body(f)
        elif f.status == BASELINED:
            skipped += 1
            ET.SubElement(case, "skipped", message=x(f"known {f.verdict} (baseline {f.fingerprint})", 500))
    for p in report.input_errors:
        tests += 1
        errors += 1
        case = ET.SubElement(suite, "testcase", classname="kwdiag.input", name=x(f"read {p.path}", 300), time="0")
        err = ET.SubElement(case, "error", message=x(p.message, 500), type="input-error")
        err.text = x(f"{p.path}: {p.message}")
    if tests == 0:
        tests = 1
        ET.SubElement(suite, "testcase", classname="kwdiag.check", name="no worker deaths", time="0")
    for el in (root, suite):
        el.set("tests", str(tests))
        el.set("failures", str(failures))
        el.set("errors", str(errors))
        el.set("skipped", str(skipped))
        el.set("time", "0")
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
