"""dsv4attn.__version__ is the project version: CMakeLists.txt's project() line, which the
library (dsv4::version()), `dsv4 --version` and the wheel's metadata also follow."""
import os
import re

import dsv4attn


def test_version_is_the_project_version():
    cmake = open(os.path.join(os.path.dirname(__file__), "..", "..", "CMakeLists.txt")).read()
    want = re.search(r"project\(dsv4attn VERSION ([0-9.]+)", cmake).group(1)
    assert dsv4attn.__version__ == want
    assert dsv4attn._C.__version__ == want
