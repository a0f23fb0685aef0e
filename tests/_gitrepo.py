"""A throw-away git repository, for tests of what the history records (commit, branch)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def git_repo(path: Path, branch: str = "main") -> str:
    """Make ``path`` a git repository on ``branch`` with one empty commit (a fixed
    identity, ``HOME`` beside it so no user config is read); returns the commit's sha."""
    path.mkdir(parents=True, exist_ok=True)
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "HOME": str(path.parent), "PATH": "/usr/bin:/bin:/usr/local/bin"}
    for args in (["init", "-q", "-b", branch], ["commit", "-q", "--allow-empty", "-m", "m"]):
        subprocess.run(["git", *args], cwd=path, check=True, env=env)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=path, capture_output=True, text=True, check=True,
                          env=env).stdout.strip()
