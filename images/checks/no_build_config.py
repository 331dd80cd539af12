"""Exit 1 if anything of a build's pip configuration stayed in the image: only empty mount points may remain.

    python /checks/no_build_config.py

A build here mounts this machine's pip configuration (CA certificate, local indexes) under /run/eksflow-build
for its RUN steps only (images.pipconf); none of it may ship.
"""

import os
import sys
from pathlib import Path

FOLDER = Path("/run/eksflow-build")
found = [str(p) for p in FOLDER.rglob("*") if p.is_file() and p.stat().st_size] if FOLDER.is_dir() else []
found += [name for name in ("PIP_CONFIG_FILE", "PIP_INDEX_URL", "PIP_CERT", "PIP_FIND_LINKS") if name in os.environ]
if Path("/etc/pip.conf").is_file() and Path("/etc/pip.conf").stat().st_size:
    found.append("/etc/pip.conf")
if found:
    sys.exit(f"the build's pip configuration stayed in the image: {', '.join(sorted(found))}")
