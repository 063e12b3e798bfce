"""Suite-wide settings: Hypothesis checks behaviour, not speed (speed goes in benchmarks), so no deadline."""

from hypothesis import HealthCheck, settings

settings.register_profile("episodepipes", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("episodepipes")
