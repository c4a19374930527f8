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


_RACER = '''
import os, sys, threading
from . import helper  # a relative import: fails when a spawn child re-runs this file by path
from steptp.runner.worker import IsolatedRunner

def main():
    errors = []
    def one(i):
        r = IsolatedRunner(timeout_s=60)
        try:
            assert r.call(os.getpid) > 0
        except Exception as e:
            errors.append(f"{type(e).__name__}: {e}")
        finally:
            r.close()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(helper.VALUE, len(errors), errors[:2])
    return 1 if errors else 0

if __name__ == "__main__":
    sys.exit(main())
'''


def test_workers_started_from_many_threads_under_python_m(tmp_path):
    """Seen on an H200 node: 8 reference threads of `python -m steptp.gpu.run` starting
    workers at once; two children re-ran run.py by path (its relative imports failed: "worker
    process crashed"). Worker starts are serialised around __main__; the old code failed about
    one run in three of this."""
    import os
    import subprocess
    import sys

    pkg = tmp_path / "racepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helper.py").write_text("VALUE = 7\n")
    (pkg / "racer.py").write_text(_RACER)
    env = {**os.environ, "PYTHONPATH": str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    for _ in range(3):
        r = subprocess.run([sys.executable, "-m", "racepkg.racer"], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0 and r.stdout.startswith("7 0"), r.stdout + r.stderr
