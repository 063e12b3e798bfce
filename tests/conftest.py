"""Suite-wide settings and the S3 and GCS fixtures. Hypothesis checks behaviour, not speed (speed goes in benchmarks),
so no deadline; the moto server and the GCS emulator are imported only by the tests that use them."""

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("episodepipes", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("episodepipes")


@pytest.fixture(scope="module")
def moto():
    """A real S3 server (moto) on 127.0.0.1, one per test module that asks for it."""
    from s3server import MotoS3

    server = MotoS3()
    yield server
    server.close()


@pytest.fixture
def proxy(moto, monkeypatch):  # noqa: ANN001
    """A fault-injecting, byte-counting proxy in front of ``moto``, with only the standard AWS environment set."""
    from s3server import FaultProxy, s3_env

    p = FaultProxy(moto.endpoint)
    for k, v in s3_env(p.endpoint).items():  # only the standard environment, as a user would set it
        monkeypatch.setenv(k, v)
    yield p
    p.close()


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    """A real GCS emulator (fake-gcs-server) on 127.0.0.1 behind `gcsserver.SignedPutShim`, one per test module."""
    from gcsserver import FakeGCS, SignedPutShim, service_account_file

    server = FakeGCS()
    shim = SignedPutShim(server.endpoint)
    server.shim = shim
    server.credentials, server.private_key = service_account_file(tmp_path_factory.mktemp("gcs-credentials"))
    yield server
    shim.close()
    server.close()


@pytest.fixture
def gcs_proxy(gcs, monkeypatch):  # noqa: ANN001
    """A byte-counting proxy in front of ``gcs``, with only the standard GCS environment set."""
    from gcsserver import gcs_env
    from s3server import FaultProxy

    p = FaultProxy(gcs.shim.endpoint)
    for k in [k for k in os.environ if k.startswith(("GOOGLE_", "AWS_")) or k == "STORAGE_EMULATOR_HOST"]:
        monkeypatch.delenv(k)
    for k, v in gcs_env(p.endpoint, gcs.credentials).items():
        monkeypatch.setenv(k, v)
    yield p
    p.close()


@pytest.fixture(scope="session")
def shard_folder(tmp_path_factory):
    """The one shard-folder factory: ``shard_folder(name, **make_shards_options)`` writes synthetic episodes as a
    fresh shard folder under a new temporary ``name`` folder and returns its path. A module's ``shards`` fixture
    calls it with the shape it needs; every call writes a new folder, so a test that damages its copy harms no
    other module."""
    from helpers import make_shards

    def make(name: str = "shards", **options):  # noqa: ANN202
        return make_shards(tmp_path_factory.mktemp(name) / "s", **options)

    return make


def _group(nodeid: str) -> str:
    """A test's xdist work unit: its file, and for tests/ddp its folder, so the DDP fit of tests/ddp/conftest.py
    (session scoped, shared by test_ddp_fit and test_ddp_s3) is still launched once per suite."""
    file = nodeid.split("::", 1)[0]
    return "tests/ddp" if file.startswith("tests/ddp/") else file


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):  # noqa: ANN201
    """`make test` (``-n 2 --dist loadfile``) sends xdist workers a whole file at a time, as `_group` says: a module's
    fixtures (moto, the GCS emulator, Slurm, Ray) start once, on one worker. (xdist's ``xdist_group`` marks would
    say the same, but with pytest 9.2 ``loadgroup`` ignores them: its node id suffix no longer takes.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Files(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

    return Files(config, log)
