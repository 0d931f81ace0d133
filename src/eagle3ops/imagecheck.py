"""Which checks and probes of the patched pipeline image run at build time and which on the target host; the checks.

A pipeline image is inspected in two places (Dockerfile, patch step; ``eagle3ops probe HOST``). Five of the steps
below are checks (nothing of vLLM or speculators runs, ``import`` only imports the patched modules); ``probes`` runs
the patched code on tiny models and compares its behaviour with a reference (the project's vocabulary, see
ARCHITECTURE.md "Conventions"). The label and the lists here name all six ``checks`` for short:

==========  ====================================================================  =============
check       what                                                                  needs
==========  ====================================================================  =============
pins        the profile's pinned versions are installed (``patch apply``)         --
apply       the series applies strictly: -p1, zero fuzz, series order             --
compile     every patched ``.py`` file byte-compiles                              --
import      every patched module imports                                          torch (vLLM's stack)
manifest    the installed patched files are byte-identical to the apply manifest  --
probes      each applied patch's behavioural probe (tiny models on vLLM engines)  a vLLM engine
==========  ====================================================================  =============

Only ``probes`` needs an engine. Whether the base can start one is a fact of the base, measured once by
``images/pipeline/check-base.py`` (vLLM's own platform resolution: ``current_platform.is_unspecified()`` on the
CUDA build without a GPU, i.e. what makes an engine fail with "Failed to infer device type"; no error is caught to
decide it). :func:`plan` turns those facts and the build's choices into two lists, ``build`` and ``host``;
:func:`verified_label` writes them as the image label ``io.eagle3ops.verified`` (``build:pins,apply,...;host:probes``)
and :func:`parse_verified` reads it back. The driver plans before the build (labels must be known then: see
:func:`eagle3ops.images.base_facts`); a build by hand plans inside the build from the same facts
(``/opt/eagle3ops/base.json``), the same way.

In the image: ``python3 -m eagle3ops.imagecheck build ...`` runs the engine-free checks after ``patch apply`` and
writes ``/opt/eagle3ops/checks.json`` (the plan, the facts, each check's result); ``wants probes`` tells the
Dockerfile whether the probes run now. The deferred probes run on the host from :mod:`eagle3ops.hostprobe`
(``python3 -m eagle3ops.hostprobe`` in a container of the image, started by ``eagle3ops probe HOST``).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: every check, in the order they run
CHECKS = ("pins", "apply", "compile", "import", "manifest", "probes")
#: checks that need a running vLLM engine (deferred to the host when the base cannot start one)
ENGINE_CHECKS = ("probes",)
#: ``engine_checks`` choices: decide from the base's facts, force at build, force to the host
ENGINE_MODES = ("auto", "build", "host")
BASE_FACTS = Path(os.environ.get("EAGLE3OPS_BASE_FACTS", "/opt/eagle3ops/base.json"))
CHECKS_RECORD = Path(os.environ.get("EAGLE3OPS_CHECKS_RECORD", "/opt/eagle3ops/checks.json"))


#: The import check's result when it runs in the probe step (``patch probe --import-check``) instead.
IMPORT_IN_PROBES = "in the probe step's process, before the probes (patch probe --import-check)"


class CheckError(Exception):
    """A bad plan request or a failed check; the message names the check, the file and the fix."""


def plan(facts: dict[str, Any], verify: str = "probes", engine_checks: str = "auto") -> dict[str, list[str]]:
    """Split :data:`CHECKS` between build time and the target host.

    Args:
        facts: the base's facts from ``images/pipeline/check-base.py`` (keys ``imports``, ``engine``, ``reason``).
        verify: the build's ``VERIFY`` mode; ``apply-only`` runs no probes anywhere (fast dev rebuilds).
        engine_checks: ``auto`` (probes at build when ``facts["engine"]``, else on the host), ``build`` or ``host``.

    Returns:
        ``{"build": [...], "host": [...]}`` in :data:`CHECKS` order. ``import`` is left out when the base cannot
        import vLLM's stack (``facts["imports"]`` false: the torch-less test stand-ins).

    Raises:
        CheckError: unknown ``engine_checks``.
    """
    if engine_checks not in ENGINE_MODES:
        raise CheckError(f"engine checks must be one of {', '.join(ENGINE_MODES)}, got {engine_checks!r}")
    build = ["pins", "apply", "compile"] + (["import"] if facts.get("imports") else []) + ["manifest"]
    host: list[str] = []
    if verify != "apply-only":
        at_build = engine_checks == "build" or (engine_checks == "auto" and bool(facts.get("engine")))
        (build if at_build else host).extend(ENGINE_CHECKS)
    return {"build": build, "host": host}


def verified_label(p: dict[str, list[str]]) -> str:
    """The ``io.eagle3ops.verified`` label value: ``build:<checks>`` plus ``;host:<checks>`` when some are deferred."""
    return f"build:{','.join(p['build'])}" + (f";host:{','.join(p['host'])}" if p["host"] else "")


def parse_verified(label: str | None) -> dict[str, list[str]]:
    """Read an ``io.eagle3ops.verified`` label back into ``{"build": [...], "host": [...]}``.

    Labels of images built before the split (``probes``, ``probes-fresh``, ``apply-only``) read as everything at
    build time. Raises CheckError for any other text (the label names no known checks).
    """
    if not label:
        return {"build": [], "host": []}
    if label in ("probes", "probes-fresh"):
        return {"build": ["pins", "apply", "probes"], "host": []}
    if label == "apply-only":
        return {"build": ["pins", "apply"], "host": []}
    out: dict[str, list[str]] = {"build": [], "host": []}
    for part in label.split(";"):
        where, _, names = part.partition(":")
        if where not in out or not names:
            raise CheckError(f"label io.eagle3ops.verified={label!r}: expected build:<checks>[;host:<checks>]")
        out[where] = names.split(",")
        unknown = set(out[where]) - set(CHECKS)
        if unknown:
            raise CheckError(f"label io.eagle3ops.verified={label!r}: unknown checks {sorted(unknown)}")
    return out


def run_static(package: str, checks: Sequence[str]) -> dict[str, str]:
    """Run the engine-free checks among ``checks`` (compile, import, manifest) on ``package``'s applied series.

    ``pins`` and ``apply`` are done by ``eagle3ops patch apply`` before (reported as done). Reads the manifest that
    apply wrote next to the package.

    Returns:
        ``{check: one-line detail}`` for each check run.

    Raises:
        CheckError: a patched file does not compile / a patched module does not import / a file differs from the
        manifest (the message names the file and what to do).
    """
    from eagle3ops.patches.apply import file_sha256, read_manifest
    from eagle3ops.patches.installed import find_dist

    dist = find_dist(package)
    manifest = read_manifest(dist.site_dir, package)
    files = sorted(manifest.get("files_sha256", {}))
    out: dict[str, str] = {}
    for c in ("pins", "apply"):
        if c in checks:
            out[c] = f"{manifest['pin']} series {manifest['series_dir']}: {len(manifest['patches'])} patch(es)"
    if "compile" in checks:
        for f in files:
            if f.endswith(".py"):
                path = dist.site_dir / f
                try:
                    compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
                except SyntaxError as e:
                    raise CheckError(f"compile: patched file {path} does not compile: {e}; fix the patch that "
                                     f"touches {f}") from None
        out["compile"] = f"{sum(f.endswith('.py') for f in files)} patched file(s) compile"
    if "import" in checks:
        from eagle3ops.patches.apply import import_patched
        from eagle3ops.patches.errors import PatchToolError

        try:
            n, secs = import_patched(dist.site_dir, package)
        except PatchToolError as e:
            raise CheckError(str(e)) from None
        out["import"] = f"{n} patched module(s) import ({secs:.1f} s)"
    if "manifest" in checks:
        changed = [f for f in files if file_sha256(dist.site_dir / f) != manifest["files_sha256"][f]]
        if changed:
            raise CheckError(f"manifest: {', '.join(changed)} in {dist.site_dir} differ from the apply manifest; "
                             f"re-run eagle3ops patch apply")
        out["manifest"] = f"{len(files)} file(s) match the manifest"
    return out


def _split(value: str) -> list[str] | None:
    if value == "auto":
        return None
    return [] if value == "none" else [c for c in value.split(",") if c]


def build_cmd(argv: Sequence[str]) -> int:
    """``build --profile P --verify V --probes-module M --engine-checks auto|build|host --build-checks L|auto
    --host-checks L|none|auto``: run the engine-free checks of the plan, write :data:`CHECKS_RECORD`."""
    args = _opts(argv, ("--profile", "--verify", "--probes-module", "--engine-checks", "--build-checks",
                        "--host-checks"))
    facts = json.loads(BASE_FACTS.read_text())
    build, host = _split(args["--build-checks"]), _split(args["--host-checks"])
    if build is None or host is None:
        p = plan(facts, args["--verify"], args["--engine-checks"])
        build, host = (p["build"] if build is None else build), (p["host"] if host is None else host)
        how = "decided in the build from " + str(BASE_FACTS)
    else:
        how = "passed by eagle3ops.images (decided before the build from the same facts)"
    unknown = (set(build) | set(host)) - set(CHECKS)
    if unknown:
        raise CheckError(f"unknown checks {sorted(unknown)} (known: {', '.join(CHECKS)})")
    if "probes" in build and not facts.get("engine") and args["--probes-module"] == "eagle3ops.patches.probes":
        raise CheckError(f"BUILD_CHECKS asks for the probes at build time, but this base cannot start a vLLM engine "
                         f"({facts.get('reason')}); build with engine checks 'auto' or 'host' (they then run on the "
                         f"target host: eagle3ops probe HOST)")
    from eagle3ops.patches.series import find_patches_dir, load_profiles

    prof = load_profiles(find_patches_dir(None)).get(args["--profile"])
    # With the probes at build the import check runs in the probe step's process (patch probe --import-check,
    # before any probe): it imports the same patched stack (torch, vLLM, speculators), which a process of its own
    # here would import a second time (~6-9 s on 2 cores).
    in_probes = "probes" in build and "import" in build
    results: dict[str, dict[str, str]] = {}
    for s in prof.load():
        results[s.package] = run_static(s.package, [c for c in build if not (in_probes and c == "import")])
        if in_probes:
            results[s.package]["import"] = IMPORT_IN_PROBES
        for c, detail in results[s.package].items():
            print(f"check {c:8s} {s.package}: {detail}")
    record = {"build": build, "host": host, "how": how, "verify": args["--verify"],
              "probes_module": args["--probes-module"], "profile": args["--profile"], "results": results,
              "engine": {k: facts.get(k) for k in ("engine", "imports", "platform", "reason")},
              "interpreter": facts.get("executable")}
    CHECKS_RECORD.parent.mkdir(parents=True, exist_ok=True)
    CHECKS_RECORD.write_text(json.dumps(record, indent=2) + "\n")
    print(summary(record))
    return 0


def summary(record: dict[str, Any]) -> str:
    """One line: which checks ran at build, which are deferred to the host, and why."""
    host = ",".join(record["host"]) or "none"
    return (f"checks at build: {','.join(record['build'])}; deferred to the host: {host} "
            f"(engine here: {record['engine'].get('reason')})")


def _opts(argv: Sequence[str], names: Sequence[str]) -> dict[str, str]:
    args = dict(zip(argv[::2], argv[1::2]))
    missing = [n for n in names if n not in args]
    if missing or len(argv) % 2:
        raise CheckError(f"usage: python3 -m eagle3ops.imagecheck build {' '.join(n + ' VALUE' for n in names)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: ``build ...``, ``wants CHECK`` (exit 0 when CHECK runs at build), ``summary``. (The deferred
    probes run from ``python3 -m eagle3ops.hostprobe``, no longer from a ``host`` command here.)"""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print(__doc__)
        return 2
    cmd, rest = argv[0], argv[1:]
    try:
        if cmd == "build":
            return build_cmd(rest)
        if cmd == "wants":
            return 0 if rest and rest[0] in json.loads(CHECKS_RECORD.read_text())["build"] else 1
        if cmd == "summary":
            print(summary(json.loads(CHECKS_RECORD.read_text())))
            return 0
    except CheckError as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    print(f"unknown command {cmd!r} (build, wants, summary; the host's probes: python3 -m eagle3ops.hostprobe)",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
