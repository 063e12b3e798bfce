import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = '''
from pathlib import Path

from episodepipes.sharding.formats.readers import Format
from episodepipes.sharding.formats.synthetic import SyntheticReader


class PlugReader(SyntheticReader):
    """Defined here, so a job process can only unpickle or build it by importing this module."""


def make(root):
    return PlugReader(num_episodes=int((Path(root) / "count.txt").read_text()), length=3, height=16, width=16)


FORMAT = Format("plug", make, detect=lambda root: (Path(root) / "count.txt").is_file())
'''


def _plugin(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "myplug.py").write_text(PLUGIN)
    info = lib / "myplug-0.1.dist-info"  # what pip installs for a package that declares the entry point
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: myplug\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[episodepipes.formats]\nplug = myplug:FORMAT\n")
    src = tmp_path / "src"
    src.mkdir()
    (src / "count.txt").write_text("5")
    return lib, src


def _cli(lib, *argv):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(lib), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "shard.py"), *map(str, argv)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def _files(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


def test_format_module_factory_across_two_jobs_equals_one_job(tmp_path):
    lib, src = _plugin(tmp_path)
    common = ["--format", "myplug:make", "--shard-size", "10kB", "--workers", "2"]
    one = _cli(lib, "write", src, tmp_path / "one", *common)
    assert one.returncode == 0 and "wrote 5 episodes" in one.stdout, one.stderr
    for i in (0, 1):
        job = _cli(lib, "write", src, tmp_path / "two", *common, "--num-jobs", "2", "--job-index", i)
        assert job.returncode == 0, job.stderr
    assert _cli(lib, "merge", tmp_path / "two", "--repack").returncode == 0
    assert _files(tmp_path / "two") == _files(tmp_path / "one")
    bad = _cli(tmp_path, "write", src, tmp_path / "x", "--format", "myplug:make")  # not on PYTHONPATH
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "PYTHONPATH" in bad.stderr, bad.stderr


def test_entry_point_formats_are_listed_chosen_by_name_and_detected(tmp_path):
    lib, src = _plugin(tmp_path)
    helptext = _cli(lib, "write", "--help")
    assert "raw, plug, or module:factory" in " ".join(helptext.stdout.split())
    named = _cli(lib, "write", src, tmp_path / "a", "--format", "plug", "--workers", "1")
    assert named.returncode == 0 and "wrote 5 episodes" in named.stdout, named.stderr
    detected = _cli(lib, "write", src, tmp_path / "b", "--workers", "1")  # --format auto
    assert detected.returncode == 0, detected.stderr
    assert _files(tmp_path / "a") == _files(tmp_path / "b")
