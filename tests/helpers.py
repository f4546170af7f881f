"""The names tests imported from here before tests/support held them; new code imports from tests/support."""
from tests.support.handbuilt import bare_server  # noqa: F401
from tests.support.processes import (  # noqa: F401
    ROOT,
    Processes,
    app_path,
    ctl,
    free_port,
    resize,
    run_cli,
    run_in_fresh_process,
    status,
    wait_for,
)
