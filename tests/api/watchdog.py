"""The per-case watchdog of the Python suites (the gtest suites have tests/support/watchdog.cc).

A case that runs past its expected time is a hang until shown otherwise: the watchdog prints
`WATCHDOG: <case> still running after N s` and every thread's stack to stderr (again after each
further N), so a CI log says where it waits; a case that ends after a minute or more is named
with its time (`SLOW: <case> took N s`, which scripts/ctest.sh collects at the end of the run).

The expected time is PANDASTACK_WATCHDOG_SECONDS (default 180), or a case's own, given with
@expect_seconds(N) on the test method (a full template build, say).
"""
import faulthandler
import os
import sys
import threading
import time
import unittest

DEFAULT_SECONDS = float(os.environ.get("PANDASTACK_WATCHDOG_SECONDS", "180"))
SLOW_SECONDS = 60


def expect_seconds(n):
    """Marks a test method as expected to take up to `n` seconds (the watchdog names it after)."""
    def mark(f):
        f.expected_seconds = n
        return f
    return mark


class _Watch:
    def __init__(self):
        self.lock = threading.Lock()
        self.case = None
        self.started = 0.0
        self.limit = DEFAULT_SECONDS
        self.reports = 0
        t = threading.Thread(target=self._loop, name="watchdog", daemon=True)
        t.start()

    def start(self, test):
        method = getattr(test, getattr(test, "_testMethodName", ""), None)
        with self.lock:
            self.case = test.id()
            self.started = time.monotonic()
            self.limit = float(getattr(method, "expected_seconds", DEFAULT_SECONDS))
            self.reports = 0

    def stop(self, test):
        with self.lock:
            took = time.monotonic() - self.started
            self.case = None
        if took >= SLOW_SECONDS:
            sys.stderr.write(f"SLOW: {test.id()} took {took:.0f} s\n")
            sys.stderr.flush()

    def _loop(self):
        while True:
            time.sleep(1)
            with self.lock:
                if self.case is None:
                    continue
                ran = time.monotonic() - self.started
                if ran < self.limit * (self.reports + 1):
                    continue
                self.reports += 1
                case = self.case
            sys.stderr.write(f"WATCHDOG: {case} still running after {ran:.0f} s "
                             f"(expected within {self.limit:.0f} s); its threads:\n")
            sys.stderr.flush()
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)


def install():
    """Watches every case that unittest runs from now on in this process."""
    watch = _Watch()
    start, stop = unittest.TestResult.startTest, unittest.TestResult.stopTest

    def start_test(result, test):
        watch.start(test)
        start(result, test)

    def stop_test(result, test):
        stop(result, test)
        watch.stop(test)

    unittest.TestResult.startTest = start_test
    unittest.TestResult.stopTest = stop_test
