"""What the isolation corpus's clients share (tests/e2b/sdk_isolation.py,
tests/opensandbox/sdk_isolation.py, tests/isolation/mcp_pairs.py; the corpus is
tests/tests/isolation.rs, the probe tests/isolation/scan.py): the manifest the Rust side
wrote (ISO_MANIFEST), the shell command that runs a probe, and the probe's report line,
printed as `RESULT <label> <json>` for the Rust side to judge.

A client outside tests/isolation puts this directory on sys.path to import it.
"""

import json
import os
import shlex

REPORTS = ("ISO-PLANTED ", "ISO-VERDICT ")


def manifest():
    with open(os.environ["ISO_MANIFEST"]) as f:
        return json.load(f)


def command(code, mark):
    """`python3 -c CODE MARK`, quoted for a shell."""
    return "python3 -c " + shlex.quote(code) + " " + shlex.quote(mark)


def report(text):
    """The JSON of the first `ISO-PLANTED`/`ISO-VERDICT` line of `text`, or None."""
    for line in text.splitlines():
        for key in REPORTS:
            if line.startswith(key):
                return line[len(key):]
    return None


def result(label, text):
    """Prints the report in a run's output as a RESULT; raises when there is none."""
    found = report(text)
    if found is None:
        raise AssertionError(f"{label}: no report in its output:\n{text[-4000:]}")
    print("RESULT", label, found, flush=True)
