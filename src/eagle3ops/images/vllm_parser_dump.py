"""In-image script (run as ``python3 -c <this file's text>`` in a serving image; it imports nothing of eagle3ops):
dump the image's own ``vllm serve`` argument parser as JSON and parse a command line with it.

Reads ``{"argv": [...]}`` on standard input (the serving command line: ``vllm serve MODEL --flag ...``; values
never travel on the command line, where the host's process list would show them). Builds the parser exactly as
``vllm serve`` does (``vllm.entrypoints.cli.serve.ServeSubcommand.subparser_init`` on a ``FlexibleArgumentParser``,
the same in vLLM 0.16 and 0.32), parses the words after ``serve`` with it and runs the subcommand's ``validate``.
Prints one JSON object on standard output::

    {"schema": 1, "vllm": "0.32.0+cpu",
     "options": [{"flags": ["--block-size"], "dest": "block_size", "default": null, "nargs": null,
                  "type": "int", "choices": null, "action": "_StoreAction"}, ...],
     "parse": {"ok": false, "error": "unrecognized arguments: --foo"}}

``parse`` is null when no argv was given. Parsed values are not printed (they may hold an API key).
"""

import argparse
import contextlib
import io
import json
import os
import re
import sys


def _plain(value):
    """``value`` as JSON can hold it; anything else as its repr without memory addresses (stable across runs)."""
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return re.sub(r" at 0x[0-9a-f]+", "", repr(value))


def _option(action):
    type_ = action.type
    return {"flags": list(action.option_strings), "dest": action.dest, "default": _plain(action.default),
            "nargs": _plain(action.nargs), "type": getattr(type_, "__name__", None) if type_ else None,
            "choices": _plain(sorted(map(str, action.choices))) if action.choices else None,
            "action": type(action).__name__}


def main():
    request = json.loads(sys.stdin.read() or "{}")
    argv = request.get("argv")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    import vllm
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    top = FlexibleArgumentParser(prog="vllm")
    sub = ServeSubcommand()
    serve = sub.subparser_init(top.add_subparsers(dest="subparser"))
    options = sorted((_option(a) for a in serve._actions if a.option_strings), key=lambda o: o["flags"])
    parse = None
    if argv is not None:
        words = list(argv)
        if "serve" in words[:3]:
            words = words[words.index("serve") + 1:]
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                args = top.parse_args(["serve", *words])
                sub.validate(args)
            parse = {"ok": True, "error": None}
        except SystemExit:
            lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
            parse = {"ok": False, "error": (lines[-1] if lines else "argument parser exited")[-2000:]}
        except Exception as exc:  # the subcommand's validate, or a parser that raises instead of exiting
            parse = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[-2000:]}
    version = getattr(vllm, "__version__", None)
    print(json.dumps({"schema": 1, "vllm": version, "options": options, "parse": parse}))


main()
