"""Suite-wide settings and the S3 fixtures. Hypothesis checks behaviour, not speed (speed goes in benchmarks), so
no deadline; the moto server is imported only by the tests that use it."""

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
