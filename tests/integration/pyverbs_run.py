# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
"""Runs named tests of rdma-core's pyverbs test suite and reports each one.

Usage: /usr/bin/python3 pyverbs_run.py TESTS_DIR DEVICE [--survey | --list] TEST_ID...

TESTS_DIR is a copy of rdma-core's python tests (the directory holding
run_tests.py, base.py and the test_*.py files, already gunzipped); DEVICE is
passed to them as --dev. A TEST_ID is module.Class.method, e.g.
test_device.DeviceTest.test_query_device, or a whole module or class
(test_pd, test_qp.QPTest).

The suite is loaded exactly as its own run_tests.py loads it (the package
`tests` from TESTS_DIR/__init__.py, arguments through args_parser), then the
named tests run under unittest, verbose, with test ids rather than
docstrings. At the end one line per test: "PASS ID", "FAIL ID",
"ERROR ID" or "SKIP ID: reason", then the counts.

Exit status: 0 when every named test ran and passed; 1 when any failed,
errored, was skipped or could not be loaded. With --survey, 0 whatever the
results (for classifying a whole module). With --list, prints the id of
every test the names cover (without the leading "tests.") and runs nothing.
"""
import os
import sys
import unittest
from importlib.machinery import SourceFileLoader


class RecordingResult(unittest.TextTestResult):
    """A TextTestResult that also remembers the outcome of every test."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.outcomes = []  # (id, status, detail)

    def addSuccess(self, test):
        super().addSuccess(test)
        self.outcomes.append((test.id(), 'PASS', ''))

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self.outcomes.append((test.id(), 'FAIL', ''))

    def addError(self, test, err):
        super().addError(test, err)
        self.outcomes.append((test.id(), 'ERROR', ''))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self.outcomes.append((test.id(), 'SKIP', reason))

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self.outcomes.append((test.id(), 'XFAIL', ''))

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self.outcomes.append((test.id(), 'XPASS', ''))


def main(argv):
    survey = '--survey' in argv
    list_only = '--list' in argv
    argv = [a for a in argv if a not in ('--survey', '--list')]
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    tests_dir, device, names = os.path.abspath(argv[0]), argv[1], argv[2:]

    # As run_tests.py: its directory first on the path, the package `tests`
    # loaded from __init__.py (which imports every test_*.py), then the
    # suite's own argument parser, which the test cases read when created.
    sys.path.insert(0, tests_dir)
    from args_parser import parser
    SourceFileLoader('tests', os.path.join(tests_dir, '__init__.py')).load_module()
    sys.argv = [os.path.join(tests_dir, 'run_tests.py'), '--dev', device]
    parser.parse_args()

    loader = unittest.TestLoader()
    suite = unittest.TestSuite()
    for name in names:
        full = name if name.startswith('tests.') else 'tests.' + name
        suite.addTests(loader.loadTestsFromName(full))
    if list_only:
        def ids(s):
            for t in s:
                if isinstance(t, unittest.TestSuite):
                    yield from ids(t)
                else:
                    yield t.id()
        for test_id in ids(suite):
            print(test_id[len('tests.'):] if test_id.startswith('tests.') else test_id)
        return 0
    runner = unittest.TextTestRunner(verbosity=2, descriptions=False,
                                     resultclass=RecordingResult, stream=sys.stdout)
    result = runner.run(suite)

    counts = {}
    print('\nper-test results:')
    for test_id, status, detail in result.outcomes:
        counts[status] = counts.get(status, 0) + 1
        short = test_id[len('tests.'):] if test_id.startswith('tests.') else test_id
        print(f'{status} {short}' + (f': {detail}' if detail else ''))
    print(', '.join(f'{counts.get(s, 0)} {s.lower()}'
                    for s in ('PASS', 'FAIL', 'ERROR', 'SKIP', 'XFAIL', 'XPASS')))
    if survey:
        return 0
    bad = sum(counts.get(s, 0) for s in ('FAIL', 'ERROR', 'SKIP', 'XFAIL', 'XPASS'))
    return 0 if bad == 0 and result.testsRun > 0 else 1


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
