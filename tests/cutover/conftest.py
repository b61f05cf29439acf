from tests.crash.conftest import child_env, run_child  # noqa: F401,E402 (fixtures re-exported)
