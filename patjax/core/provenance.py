"""What code a process runs: the git commit of the checkout and the files changed since it, and
its command line, recorded with every suite invocation (DIR/invocations.jsonl)."""

from __future__ import annotations

import os
import subprocess
import sys


def of_this_process() -> dict:
    """The code the invocation ran: git commit and files changed since it (if any)."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # patjax/core/ -> the checkout
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--", "patjax", "configs"],
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        return {}
    return {
        "git_commit": commit,
        "uncommitted_changes": [line[3:] for line in changed if line.strip()],
        "command": " ".join(sys.argv),
    }
