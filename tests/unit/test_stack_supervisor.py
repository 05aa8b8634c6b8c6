"""The embedded stack's supervisor: a crashing pool process backs off, and the back-off resets after a healthy run.

Real child processes (a shell script that counts its runs in a file), the real supervisor thread."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from crewwork.cli import stack as stack_mod
from crewwork.cli.stack import ManagedProcess, Stack


def test_restart_backoff_resets_after_a_healthy_interval(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stack_mod, "RESTART_BACKOFF_S", (0.1, 0.2, 0.4, 0.8, 1.6))
    runs = tmp_path / "runs"
    # Runs 1-5 crash at once; run 6 stays up for 2 s (longer than the healthy interval), then crashes; the rest crash
    # at once again.
    script = tmp_path / "pool.sh"
    script.write_text(
        f"n=$(($(cat {runs} 2>/dev/null || echo 0) + 1)); echo $n > {runs}\n"
        'if [ "$n" -eq 6 ]; then sleep 2; fi\nexit 3\n'
    )
    said: list[str] = []
    st = Stack(data_dir=tmp_path, healthy_after_s=1.5, on_event=said.append)
    st.processes.append(ManagedProcess("agent-0", ["sh", str(script)], {}, tmp_path / "agent.log"))
    st.processes[0].start()
    import threading

    st._supervisor = threading.Thread(target=st._supervise, daemon=True)
    st._supervisor.start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(said) < 8:
            time.sleep(0.1)
    finally:
        st._stop.set()
        st._supervisor.join(5)
        for p in st.processes:
            p.stop(1)
    delays = [float(m.group(1)) for line in said if (m := re.search(r"restarting in ([0-9.]+)s", line))]
    assert len(delays) >= 8, said
    # Crashing on start: the delay grows to the ceiling ...
    assert delays[:5] == [0.1, 0.2, 0.4, 0.8, 1.6], said
    # ... the 6th run was healthy, so its exit starts again from the shortest delay, and the series grows again.
    assert delays[5:8] == [0.1, 0.2, 0.4], said
