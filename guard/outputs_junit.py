"""The guard's JUnit XML: one <testsuite> per approval, one <testcase> per case (classname: the approval, name:
the case), in the common form CI systems read (the Jenkins/Ant JUnit schema's elements and attributes).

regressed and incorrect are <failure> (type: the verdict, message: the compact diff); inconclusive is an
<error> (the case could not be judged: type inconclusive, message with its reason); pass and improved carry
the diff in <system-out>. Text goes through ElementTree, which escapes it; characters XML 1.0 cannot carry
are replaced first, so a hostile case name cannot break the file.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

from guard.outputs import ApprovalResult, GuardReport, diff_text
from guard.verdict import CaseVerdict, Verdict

# Outside XML 1.0's Char production: C0 controls but tab, LF, CR; lone surrogates; U+FFFE and U+FFFF.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _text(value: object) -> str:
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))


def _seconds(result: ApprovalResult) -> float:
    return result.seconds or 0.0


def _testcase(suite: ET.Element, result: ApprovalResult, verdict: CaseVerdict) -> None:
    share = _seconds(result) / max(1, len(result.verdicts))
    case = ET.SubElement(suite, "testcase", classname=_text(result.approval), name=_text(verdict.case),
                         time=f"{share:.3f}")
    message = _text(diff_text(result, verdict))
    body = _text("\n".join([verdict.message, *(f"environment: {c}" for c in verdict.environment_changes)]))
    if verdict.verdict in (Verdict.REGRESSED, Verdict.INCORRECT):
        ET.SubElement(case, "failure", message=message, type=verdict.verdict.value).text = body
    elif verdict.verdict is Verdict.INCONCLUSIVE:
        kind = f"inconclusive:{verdict.reason.value}" if verdict.reason else "inconclusive"
        ET.SubElement(case, "error", message=message, type=kind).text = body
    else:
        ET.SubElement(case, "system-out").text = message


def junit_tree(report: GuardReport) -> ET.ElementTree:
    counts = report.counts()
    root = ET.Element("testsuites", name="kernel-referee guard", tests=str(len(report.verdicts)),
                      failures=str(counts["regressed"] + counts["incorrect"]), errors=str(counts["inconclusive"]),
                      time=f"{sum(_seconds(r) for r in report.results):.3f}")
    for result in report.results:
        kinds = [v.verdict for v in result.verdicts]
        suite = ET.SubElement(root, "testsuite", name=_text(result.approval), tests=str(len(kinds)),
                              failures=str(sum(k in (Verdict.REGRESSED, Verdict.INCORRECT) for k in kinds)),
                              errors=str(kinds.count(Verdict.INCONCLUSIVE)), skipped="0",
                              time=f"{_seconds(result):.3f}", timestamp=report.time[:19],
                              hostname=_text(result.node or "localhost"))
        properties = ET.SubElement(suite, "properties")
        for change in result.environment_changes:
            ET.SubElement(properties, "property", name="environment_change", value=_text(change))
        for label, per_case in result.shape_waived.items():  # yardstick timings taken past their launches' shape
            for case_name, reasons in per_case.items():
                ET.SubElement(properties, "property", name="shape_waived",
                              value=_text(f"the {label}'s on {case_name} in {len(reasons)} round(s): {reasons[0]}"))
        if result.fingerprint and result.fingerprint.gpu:
            ET.SubElement(properties, "property", name="gpu", value=_text(result.fingerprint.gpu))
        for verdict in result.verdicts:
            _testcase(suite, result, verdict)
        # The Ant schema requires both, empty or not.
        ET.SubElement(suite, "system-out").text = _text(f"{result.approval}: " + ", ".join(v.value for v in kinds))
        ET.SubElement(suite, "system-err").text = ""
    ET.indent(root)
    return ET.ElementTree(root)


def write_junit(report: GuardReport, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    junit_tree(report).write(path, encoding="utf-8", xml_declaration=True)
    return path
