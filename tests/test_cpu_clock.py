"""The benchmarks' CPU reading: another process's CPU time on its own clock."""

import subprocess
import sys
import time

import psutil
import pytest

from ipyparallel_broadcast.tools.bench import cpu_seconds

pytestmark = pytest.mark.cluster  # a child process, no cluster

# burns 0.3 s of CPU in a thread that then ends, says so, and waits for stdin
CHILD = """
import sys, threading, time
def burn():
    end = time.thread_time() + 0.3
    while time.thread_time() < end:
        pass
t = threading.Thread(target=burn); t.start(); t.join()
print("done", flush=True)
sys.stdin.read()
"""


def test_cpu_seconds_reads_a_process_clock_with_its_ended_threads():
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "done"
        proc = psutil.Process(child.pid)
        seconds = cpu_seconds([proc])
        ticks = sum(proc.cpu_times()[:2])
        assert seconds >= 0.3  # the ended thread's time is in it
        assert abs(seconds - ticks) < 0.05  # psutil's 10 ms ticks of the same time
        assert seconds != round(seconds, 2) or cpu_seconds([proc]) != round(cpu_seconds([proc]), 2)  # not ticks
    finally:
        child.stdin.close()
        child.wait()
    assert cpu_seconds([proc]) == 0.0  # a process gone counts nothing


def test_cpu_seconds_of_this_process_is_its_process_time():
    before = time.process_time()
    seconds = cpu_seconds([psutil.Process()])
    after = time.process_time()
    assert before <= seconds <= after
