"""The serve process raises its soft open-file limit toward --max-connections, and says so
when the hard limit is short. Each case runs in a child process: lowering a hard limit is
for good."""

import subprocess
import sys

CASE = """
import logging, resource, sys
from mlx_paged.server.open_files import raise_open_file_limit
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(levelname)s %(message)s")
resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, {hard}))
print("soft now", raise_open_file_limit({max_connections}))
"""


def run_case(soft: int, hard: int, max_connections: int) -> str:
    code = CASE.format(soft=soft, hard=hard, max_connections=max_connections)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_soft_limit_is_raised_for_the_connection_cap():
    out = run_case(256, 4096, 1000)
    assert "INFO raised the open-file limit from 256 to 1128 for --max-connections 1000" in out
    assert out.endswith("soft now 1128\n")


def test_a_short_hard_limit_is_raised_to_and_warned_about():
    out = run_case(256, 600, 1000)
    assert "raised the open-file limit from 256 to 600" in out
    assert "WARNING the open-file limit is 600: fewer than the 1128 that --max-connections" in out


def test_a_limit_already_high_enough_is_left_alone():
    out = run_case(2048, 4096, 512)
    assert out == "soft now 2048\n"
