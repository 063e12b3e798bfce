"""`run_ranks` waits for every rank and reports each one's exit, on plain scripts (the DDP run is in tests/ddp)."""

import sys
import textwrap
import time

import pytest

from episodepipes.lightning_glue.launch import RanksFailed, check_ranks, run_ranks

SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    rank = int(os.environ["LOCAL_RANK"])
    print(f"rank {rank} of {os.environ['WORLD_SIZE']} at {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}")
    mode = sys.argv[1]
    if rank == 1 and mode == "abort":
        time.sleep(1)  # rank 0 is long gone
        print("gloo thread freed a tensor after finalize", flush=True)
        os.abort()
    if rank == 1 and mode == "hang":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as Lightning's handler does
        time.sleep(600)
""")


def _run(tmp_path, mode, **kw):
    script = tmp_path / "s.py"
    script.write_text(SCRIPT)
    return run_ranks([sys.executable, script, mode], nprocs=2, log_dir=tmp_path / "logs", **{"timeout": 60, **kw})


def test_every_rank_gets_the_rendezvous_environment_and_clean_exits_pass(tmp_path):
    exits = _run(tmp_path, "ok")
    check_ranks(exits)
    assert [e.rank for e in exits] == [0, 1] and all(e.ok for e in exits)
    assert "rank 1 of 2 at 127.0.0.1:" in (tmp_path / "logs" / "rank1.log").read_text()


def test_a_rank_killed_by_a_signal_after_rank0_exited_is_named_with_its_log(tmp_path):
    exits = _run(tmp_path, "abort")
    assert exits[0].ok and exits[1].returncode < 0
    with pytest.raises(RanksFailed, match="rank 1 was killed by SIGABRT") as e:
        check_ranks(exits)
    assert "gloo thread freed a tensor after finalize" in str(e.value)


def test_a_rank_that_outlives_the_deadline_is_stopped_and_reported(tmp_path):
    t0 = time.monotonic()
    exits = _run(tmp_path, "hang", timeout=2)
    assert time.monotonic() - t0 < 20
    assert exits[0].ok and exits[1].killed_by_us and exits[1].returncode == -9
    with pytest.raises(RanksFailed, match=r"rank 1 was killed by SIGKILL \(stopped by run_ranks\)"):
        check_ranks(exits)


def test_nprocs_is_checked(tmp_path):
    with pytest.raises(ValueError, match="nprocs=0"):
        run_ranks(["true"], nprocs=0, log_dir=tmp_path, timeout=1)
