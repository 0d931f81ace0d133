"""A purged sandbox's host-side root is renamed aside at once and deleted in the background (pure: temporary
directories stand for ``/var/lib/eagle3ops-sandbox/<name>``; no daemon is started)."""

from __future__ import annotations

import os
from pathlib import Path

from eagle3ops_dev.sandbox.purge import PURGING_PREFIX, purge_root


def _tree(root: Path, n: int = 200) -> None:
    for i in range(n):
        d = root / "docker" / f"snap{i % 10}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}").write_text("x")


def test_the_name_is_free_at_once_and_the_tree_goes_in_the_background(tmp_path: Path) -> None:
    root = tmp_path / "pytest-ctrd2"
    _tree(root)
    # a left-over of a process that died mid-delete (no such pid), and one of a live process (pid 1): only the first
    # is this purge's to delete
    dead = tmp_path / f"{PURGING_PREFIX}pytest-ctrd2-{2 ** 22 + 7}-1"
    live = tmp_path / f"{PURGING_PREFIX}pytest-ctrd2-1-2"
    for d in (dead, live):
        _tree(d, 20)
    t = purge_root(root)
    assert not root.exists()  # the next `up` of this name starts from nothing, whatever the thread has done yet
    assert t.daemon is False  # the interpreter waits for it at exit: nothing left half-deleted by a clean exit
    t.join(60)
    assert not t.is_alive()
    assert sorted(p.name for p in tmp_path.iterdir()) == [live.name]
    assert not Path(f"/proc/{2 ** 22 + 7}").exists() and os.getpid() != 1
