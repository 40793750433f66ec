"""`python -m rankpack.backend.kubernetes.launcher EXIT_FILE -- MPIRUN ARGS...`

The detached launcher of a simulation: it runs mpirun and, when mpirun ends, writes its
exit code to EXIT_FILE (on the case volume, atomically). The operator starts simulations
through it so that they outlive the operator: killed at any moment, a restarted operator
adopts the simulation and learns how it ended from EXIT_FILE (`KubernetesBackend.adopt`).
No shell: the argv is passed through unchanged.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: launcher EXIT_FILE -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    exit_file = Path(argv[0])
    child = subprocess.Popen(argv[2:])

    def forward(sig: int, _frame: object) -> None:
        child.send_signal(sig)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    code = child.wait()
    tmp = exit_file.with_name(exit_file.name + ".tmp")
    tmp.write_text(f"{code}\n")
    os.replace(tmp, exit_file)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
