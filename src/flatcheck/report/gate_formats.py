"""A gate's outcome as a rich table, JUnit XML (one testcase per rule) and Markdown.

The Markdown fits GitHub's $GITHUB_STEP_SUMMARY; the JUnit file is what CI test-report
widgets read: failures are <failure>, skipped and tolerated-inconclusive rules <skipped>.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from rich.table import Table

from .render import fmt, fmt_pm

_STYLE = {"pass": "green", "fail": "bold red", "inconclusive": "yellow", "skipped": "dim"}


def _ci(c) -> str:
    """The interval the verdict used. A relative rule's is of value − threshold, whose error
    is the comparison's (a paired difference, the baseline's error scaled by the margin), so
    it is shown as such and not as an interval of the value."""
    if c.ci is None:
        return "—"
    if c.bound.relative and c.threshold is not None:
        return f"value − threshold ∈ [{fmt(c.ci[0] - c.threshold)}, {fmt(c.ci[1] - c.threshold)}]"
    return f"[{fmt(c.ci[0])}, {fmt(c.ci[1])}]"


def _verdict(c) -> str:
    if c.verdict == "inconclusive":
        return f"inconclusive → {'fail' if c.failed else 'pass'}"
    return c.verdict


def rules_heading(outcome) -> str:
    """The verdict line printed above `rules_table`, as a line of its own: a table's title
    wraps at the table's width, not the console's."""
    status = "[green]PASSED[/]" if outcome.passed else "[bold red]FAILED[/]"
    skipped = outcome.skip_words()
    status += f" · [yellow]{skipped}[/]" if skipped else ""
    return f"gate {status} · confidence {outcome.confidence:g}"


def rules_table(outcome) -> Table:
    table = Table()
    for col, just in (("rule", "left"), ("value ± stderr", "right"), ("CI", "right"), ("threshold", "right"),
                      ("verdict", "left"), ("note", "left")):
        # fold, never cut: a rule or field name cut to "gini.detai…" in an 80-column CI log
        # cannot be told from its neighbours
        table.add_column(col, justify=just, overflow="fold")
    for c in outcome.checks:
        table.add_row(c.bound.name, fmt_pm(c.value, c.value_stderr), _ci(c), fmt(c.threshold),
                      f"[{_STYLE[c.verdict]}]{_verdict(c)}[/]", c.message)
    return table


def _tally(outcome) -> str:
    """One outcome per rule, so the counts add up to the rules: an inconclusive rule is counted
    once, with what its policy made of it."""
    n = outcome.counts()
    held = sum(c.failed for c in outcome.checks if c.verdict == "inconclusive")
    return (f"{n['pass']} passed · {n['fail']} failed · {n['inconclusive']} inconclusive ({held} counted as "
            f"failed) · {n['skipped']} skipped")


def junit_xml(outcome, suite: str = "flatcheck gate") -> str:
    counts = outcome.counts()
    failures = sum(1 for c in outcome.checks if c.failed)
    skipped = len(outcome.checks) - failures - counts["pass"]
    seconds = f"{float(outcome.report.meta.get('seconds', 0.0)):.3f}"
    root = ET.Element("testsuites", name=suite, tests=str(len(outcome.checks)), failures=str(failures),
                      errors="0", skipped=str(skipped), time=seconds)
    ts = ET.SubElement(root, "testsuite", name=suite, tests=str(len(outcome.checks)), failures=str(failures),
                       errors="0", skipped=str(skipped), time=seconds)
    # the verdict in words: a pass with relative rules left undecided says so
    ET.SubElement(ET.SubElement(ts, "properties"), "property", name="verdict", value=outcome.verdict)
    for c in outcome.checks:
        tc = ET.SubElement(ts, "testcase", classname=f"flatcheck.gate.{c.bound.probe}", name=c.bound.name, time="0")
        detail = (f"value {fmt_pm(c.value, c.value_stderr)}, CI {_ci(c)}, threshold {fmt(c.threshold)}"
                  + (f", baseline {fmt(c.baseline)}" if c.baseline is not None else "")
                  + (f", reruns {c.reruns}" if c.reruns else ""))
        if c.failed:
            el = ET.SubElement(tc, "failure", message=f"{c.verdict}: {c.message}".strip(": "), type=c.verdict)
            el.text = detail
        elif c.verdict in ("inconclusive", "skipped"):
            ET.SubElement(tc, "skipped", message=f"{c.verdict}: {c.message}".strip(": "))
        ET.SubElement(tc, "system-out").text = detail
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


SHA_SHOWN = 12  # hex digits of a checkpoint's sha256 in a summary heading


def checkpoint_words(meta) -> str:
    """`name (sha256 1a2b3c4d5e6f)` of a report's checkpoint; the model source's weights without one."""
    ck = (meta or {}).get("checkpoint")
    if not isinstance(ck, dict) or not isinstance(ck.get("path"), str):
        return "the model source's own weights"
    sha = ck.get("sha256")
    return f"{Path(ck['path']).name} (sha256 {sha[:SHA_SHOWN]})" if isinstance(sha, str) else Path(ck["path"]).name


def markdown(outcome, title: str = "flatcheck gate") -> str:
    """GitHub's step summary is shared by every step of a job and the gate appends to it: the
    heading names the checkpoint (file and sha256 prefix) and the baseline, and each rule
    shows the baseline's value, so that runs appended one after another are told apart."""
    skipped = outcome.skip_words()
    head = ("❌ failed" if not outcome.passed else "⚠️ passed" if skipped else "✅ passed") \
        + (f", {skipped}" if skipped else "")
    against = f" vs {outcome.baseline}" if outcome.baseline else " (no baseline)"
    lines = [f"### {title}: {head} · {checkpoint_words(outcome.report.meta)}{against}", "",
             _tally(outcome) + f" · confidence {outcome.confidence:g}", "",
             "| rule | value ± stderr | CI | threshold | baseline | verdict |", "|---|---:|---:|---:|---:|---|"]
    for c in outcome.checks:
        icon = "❌" if c.failed else {"pass": "✅", "inconclusive": "⚠️", "skipped": "⏭️"}.get(c.verdict, "")
        note = f" ({c.message})" if c.message else ""
        cells = [c.bound.name, fmt_pm(c.value, c.value_stderr), _ci(c), fmt(c.threshold),
                 fmt(c.baseline), f"{icon} {_verdict(c)}{note}"]
        lines.append("| " + " | ".join(x.replace("|", "\\|") for x in cells) + " |")
    return "\n".join(lines) + "\n"
