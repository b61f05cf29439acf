"""`web_server`: the real web process as `make run` serves it (gunicorn with config/gunicorn.py), bound to this
run's test databases, started once for the module that asks for it."""
import pytest

from tests.faults.servers import (
    child_environment,
    free_port,
    run_database_env,
    wait_http,
    wait_web_workers,
    web_child,
)


def start_web(root, **extra):
    env = child_environment(secret_dir=str(root / "secrets"), REDIS_URL="redis://127.0.0.1:1/0",
                            DJANGO_STATIC_ROOT=str(root / "static"), **{**run_database_env(), **extra})
    port = free_port()
    web = web_child(env, port, root).start()
    try:
        wait_http(port, 90, web.proc)
        wait_web_workers(web)
    except BaseException:
        web.stop()
        raise
    return port, web


@pytest.fixture(scope="module")
def web_server(django_db_setup, tmp_path_factory):
    port, web = start_web(tmp_path_factory.mktemp("web-server"))
    try:
        yield port
    finally:
        web.stop()
