"""A vLLM upgrade's flag changes from both parsers (``eagle3ops.images.vllmflags``): the pure diff on small dumps,
then the two real images' dumps committed under tests/data/vllm-parser/ (written by scripts/vllm_parser_dumps.py,
which runs each image's own ``vllm serve`` parser)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3ops.images.vllmflags import FlagChange, argv_flags, diff_parsers, flag_report

DATA = Path(__file__).resolve().parent / "data" / "vllm-parser"


def _opt(flags: list[str], dest: str, default=None, type_="int", choices=None, nargs=None) -> dict:
    return {"flags": flags, "dest": dest, "default": default, "nargs": nargs, "type": type_, "choices": choices,
            "action": "_StoreAction"}


OLD = {"schema": 1, "vllm": "0.16.0", "options": [
    _opt(["--block-size"], "block_size", 16),
    _opt(["--disable-log-requests"], "disable_log_requests", False, None),
    _opt(["--max-model-len"], "max_model_len"),
    _opt(["--swap-space"], "swap_space", 4),
    _opt(["--task"], "task", "auto", "str", ["auto", "generate"]),
    _opt(["-O", "--compilation-config"], "compilation_config", "{}", "str"),
]}
NEW = {"schema": 1, "vllm": "0.32.0", "options": [
    _opt(["--block-size"], "block_size", None),
    _opt(["--enable-log-requests"], "disable_log_requests", True, None),
    _opt(["--max-model-len"], "max_model_len"),
    _opt(["--task"], "task", "auto", "str", ["auto", "generate", "embed"]),
    _opt(["-cc", "--compilation-config"], "compilation_config", "{}", "str"),
], "parse": {"ok": False, "error": "unrecognized arguments: --swap-space 8"}}


def test_the_diff_names_removed_renamed_and_redefaulted_flags() -> None:
    got = diff_parsers(OLD, NEW)
    assert got == [FlagChange("re-defaulted", "--block-size", 16, None),
                   FlagChange("renamed", "--disable-log-requests", ["--disable-log-requests"],
                              ["--enable-log-requests"]),
                   FlagChange("removed", "--swap-space")]
    # a choice added is not a change; a short alias changed is not one either (long flags are compared)
    assert [c.line() for c in got] == ["--block-size: default 16 -> None",
                                       "--disable-log-requests: renamed to --enable-log-requests",
                                       "--swap-space: removed"]
    narrowed = {**NEW, "options": [*NEW["options"][:3], _opt(["--task"], "task", "auto", "str", ["auto"])]}
    assert FlagChange("changed", "--task", "type 'str'", "type 'str'") not in diff_parsers(OLD, narrowed)
    assert [c.kind for c in diff_parsers(OLD, narrowed) if c.flag == "--task"] == ["changed"]
    with pytest.raises(ValueError, match="schema 2, expected 1: dump it again"):
        diff_parsers({**OLD, "schema": 2}, NEW)


def test_the_report_keeps_what_production_uses_and_the_new_parsers_verdict() -> None:
    argv = ["vllm", "serve", "/m", "--block_size=16", "--swap-space", "8", "--compilation-config.level", "0"]
    assert argv_flags(argv) == {"--block-size", "--swap-space", "--compilation-config"}
    rep = flag_report(OLD, NEW, argv)
    assert [c.flag for c in rep.used] == ["--block-size", "--swap-space"]
    assert rep.parse_ok is False and rep.lines() == [
        "vLLM flags 0.16.0 -> 0.32.0 (both parsers dumped from the images):",
        "  the new parser REFUSES production's command line: unrecognized arguments: --swap-space 8",
        "  used by production: --block-size: default 16 -> None",
        "  used by production: --swap-space: removed",
        "  all differences: 1 removed, 1 renamed, 1 re-defaulted, 0 changed"]
    assert json.loads(json.dumps(rep.as_dict()))["used"][1] == {"kind": "removed", "flag": "--swap-space",
                                                                 "old": None, "new": None}

