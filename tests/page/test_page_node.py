"""The page's text and state functions under node's own test runner (tests/page/node/*.test.mjs),
no browser: the modules as the page runs them, their `ft/NAME` imports resolved as its import map
does (tests/page/node/resolve.mjs). One pytest test runs them all, so `make test` does."""
import shutil
import subprocess

from helpers import ROOT

NODE_TESTS = ROOT / "tests" / "page" / "node"


def test_the_page_functions_under_node():
    node = shutil.which("node")
    assert node, "node (20 or later) is needed for tests/page/node: apt-get install nodejs"
    r = subprocess.run([node, "--import", "./tests/page/node/register.mjs", "--test", str(NODE_TESTS)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "# fail 0" in r.stdout and "# pass 0" not in r.stdout, r.stdout[-2000:]
