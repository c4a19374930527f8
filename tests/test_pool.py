"""The worker pool (issue 35): one process-wide worker per kind, restarted when dead."""

from __future__ import annotations

import os

from steptp.runner import pool


def test_shared_worker_is_one_per_kind_and_restarts_when_dead():
    a = pool.shared("test-pool", 30.0)
    try:
        assert pool.shared("test-pool") is a and a.timeout_s == 30.0
        assert pool.shared("test-pool-other") is not a
        pid = a.call(os.getpid)
        assert pid != os.getpid() and a.pid == pid
        os.kill(pid, 9)  # the worker dies outside any call
        a._proc.join(5)
        again = pool.shared("test-pool", 20.0)
        assert again is a and again.timeout_s == 20.0
        new_pid = again.call(os.getpid)
        assert new_pid not in (pid, os.getpid())
        again.close()  # a closed worker starts again when next used
        assert pool.shared("test-pool").call(os.getpid) not in (pid, new_pid)
    finally:
        pool.close_all()
    assert a.pid is None
