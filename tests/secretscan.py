"""Shared by the tests that plant secrets in serving's command line and environment: find every file under some
folders that holds one of the planted values, and check the files allowed to hold them (the release records
``rollback`` needs) are private.

Planted values, one per form, so that a leak names its form: :data:`PLANTED` (flag → value, environment name →
value). ``ORG_TOKEN`` stands for a name only the inventory lists (``secret_env``)."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path

#: The key serving requires: given as ``--api-key K`` and as ``--api-key=K`` (the same value: vLLM takes one key).
API_KEY = "sk-planted-apikey-3141"
HF_FLAG = "hf_planted_flag_2718"
VLLM_ENV = "sk-planted-vllm-env-1618"
HF_ENV = "hf_planted_env_1414"
ORG_ENV = "planted-org-token-1732"
#: The name of a secret only the inventory knows of (``secret_env``).
ORG_NAME = "ORG_TOKEN"
PLANTED = {"--api-key": API_KEY, "--hf-token": HF_FLAG, "VLLM_API_KEY": VLLM_ENV, "HF_TOKEN": HF_ENV,
           ORG_NAME: ORG_ENV}


def planted_args() -> list[str]:
    """Serving flags that carry secrets, in both forms: ``--api-key K --api-key=K --hf-token T``."""
    return ["--api-key", API_KEY, f"--api-key={API_KEY}", "--hf-token", HF_FLAG]


def planted_env() -> dict[str, str]:
    """Serving environment with secrets: vLLM's, Hugging Face's and one only the inventory names."""
    return {"VLLM_API_KEY": VLLM_ENV, "HF_TOKEN": HF_ENV, ORG_NAME: ORG_ENV}


def leaks(text: str | bytes) -> list[str]:
    """Which planted forms ``text`` holds (by the flag or name they were planted under)."""
    b = text.encode(errors="surrogateescape") if isinstance(text, str) else text
    return [form for form, value in PLANTED.items() if value.encode() in b]


def scan(roots: Iterable[Path], allowed: Callable[[Path], bool] = lambda p: False) -> dict[str, list[str]]:
    """Every regular file under ``roots`` holding a planted value, except those ``allowed`` accepts, with the
    forms it holds: ``{path: [form, ...]}`` (empty: no leak)."""
    found: dict[str, list[str]] = {}
    for root in roots:
        for p in sorted(Path(root).rglob("*")) if Path(root).is_dir() else [Path(root)]:
            if p.is_symlink() or not p.is_file() or allowed(p):
                continue
            hit = leaks(p.read_bytes())
            if hit:
                found[str(p)] = hit
    return found


def release_record(p: Path) -> bool:
    """Whether ``p`` is one of the records that restore and ``rollback`` recreate serving from, the only files
    allowed to hold serving's secrets (docs/guarantees.md): a retained release (``<state_dir>/releases/NNNN.json``), a
    window's record of the serving container (``windows/<id>/serving-inspect.json``) and of the serving process or
    unit (``windows/<id>/process/{,next.,...}cmdline.nul``, ``environ.nul``, ``unit.show``, ``unit.argv.json``,
    ``{,next.}unit.dropin``)."""
    return (p.parent.name == "releases" and p.suffix == ".json" and p.stem.isdigit()) or \
        p.name == "serving-inspect.json" or \
        (p.parent.name == "process" and p.name.endswith(("cmdline.nul", "environ.nul", "unit.show", "unit.argv.json",
                                                         "unit.dropin")))


def scan_with_records(roots: Iterable[Path], also: Callable[[Path], bool] = lambda p: False,
                      ) -> tuple[dict[str, list[str]], list[Path]]:
    """``scan(roots)`` with the release records (``release_record``) allowed, and the records it let through, so
    the caller checks their mode and owner: ``(found, records)``; ``also`` allows further files (serving's own
    log), which are not counted as records."""
    records: list[Path] = []

    def allowed(p: Path) -> bool:
        if release_record(p):
            records.append(p)
            return True
        return also(p)

    return scan(roots, allowed=allowed), records


def private(p: Path, owners: Iterable[int] | None = None) -> str | None:
    """None when ``p`` is readable by its owner only (mode 0600) and owned by one of ``owners`` (uids; default:
    this user); else what is wrong."""
    st = p.stat()
    owners = {os.getuid()} if owners is None else set(owners)
    if stat.S_IMODE(st.st_mode) != 0o600:
        return f"{p}: mode {oct(stat.S_IMODE(st.st_mode))}, not 0600"
    if st.st_uid not in owners:
        return f"{p}: owner uid {st.st_uid}, not one of {sorted(owners)}"
    return None
