"""A shard cut short in place while ``verify``, ``upgrade --crc`` or ``stats --recompute`` reads it (``cp`` over it,
``rsync --inplace``): the command ends in one line naming the shard, never SIGBUS (what a memory mapping gave)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from helpers import as_v1

# Cuts the shard short (to its first page) at the first crc32 the command computes, that is after its size was
# checked and while its bytes are being read: deterministic, where a truncate from outside would race the reads.
_CUT_WHILE_READING = """
import os, sys, zlib
try:
    from episodepipes.index import shardread
    shardread.CHUNK = 4096  # a small shard still takes several reads
except ImportError:  # the code before checked reads: it mapped the shard
    pass
shard = sys.argv[1]
crc32 = zlib.crc32

def cut_then_crc(*args):
    zlib.crc32 = crc32
    os.truncate(shard, 4096)
    return crc32(*args)

zlib.crc32 = cut_then_crc
from episodepipes.sharding.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("command,status", [(["verify"], 1), (["upgrade", "--crc"], 2), (["stats", "--recompute"], 2)])
def test_a_shard_cut_short_under_a_command_is_named_not_sigbus(shard_folder, command, status):
    root = shard_folder("cut", num_episodes=2, length=20, height=32, width=32, shard_size=1 << 30)
    if command[0] == "upgrade":
        as_v1(root)  # what upgrade --crc runs on
    shard = root / "shard-000000.tar"
    assert shard.stat().st_size > 3 * 4096
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_CUT_WHILE_READING), str(shard), command[0],
                           str(root), *command[1:]], capture_output=True, text=True, timeout=90, env=os.environ)
    assert proc.returncode == status, (proc.returncode, proc.stderr[-2000:])  # -7 would be SIGBUS
    assert str(shard) in proc.stderr and ("ends at byte 4096" in proc.stderr or "truncated" in proc.stderr), \
        proc.stderr
