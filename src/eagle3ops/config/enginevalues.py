"""Inventory values the container engine cannot represent, refused when the inventory is loaded.

eagle3ops hands inventory values to Docker in forms the engine parses: bind mounts as ``HOST:CONTAINER[:OPTS]``
(``docker run --volume``, the Engine API's ``HostConfig.Binds``: split at ``:``), environment variables as
``NAME=VALUE`` strings (``Config.Env``), container names checked against Docker's ``[a-zA-Z0-9][a-zA-Z0-9_.-]+``
(moby ``daemon/names.go``, ``RestrictedNameChars``). A value that does not fit would otherwise fail late, at the
first container a window starts (preflight's throwaway stage container, whose error names the ``stage_*`` keys), or
be silently cut. Each validator here raises :class:`ValueError` with what is wrong and the fix; pydantic puts the
key (``hosts.H.model_path``, ``hosts.H.serving.env.NAME``, ``hosts.H.serving.volumes.0``) in front of it
(:func:`eagle3ops.config.base.format_validation_error`).

Rules (each mirrors what the engine, or the kernel's ``execve``, does with the value):

- a host path mounted into a container (``model_path``, ``data_dir``, ``state_dir``, ``serving.api_key_file``, the
  socket of ``docker_host``): no ``:`` (the bind would split there) and no control character (NUL cannot be passed
  at all; a newline or CR breaks the line-based host commands and logs that name the path);
- ``serving.volumes``: ``HOST:CONTAINER[:OPTS]``, host side an absolute path or a volume name, container side an
  absolute path, options from Docker's list (``ro``, ``rw``, ``z``, ``Z``, propagation, ``nocopy``, ...), no control
  character;
- environment names: not empty, no ``=`` and no NUL (``NAME=VALUE`` is split at the first ``=``); values: no NUL
  (``execve`` cuts the string there) and no newline or CR (an env file, ``/proc/PID/environ`` readers and entrypoint
  scripts that ``export`` them take one variable per line);
- ``secret_env`` names: shell names (letters, digits, ``_``), so that ``NAME=VALUE`` is found inside a shell
  command line too (:mod:`eagle3ops.redact`);
- container names (``serving.container``, and the ``<compose_project>-<compose_service>-1`` name a Compose service's
  container gets): Docker's pattern, at least two characters;
- CPU sets (``serving.cpuset_cpus``): Docker's ``--cpuset-cpus`` list, ``N`` or ``N-M`` items joined by ``,``
  (moby ``pkg/parsers.ParseUintList``: no spaces, a range's start not above its end).
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

#: moby ``daemon/names``: ``RestrictedNameChars`` + ``RestrictedNamePattern`` (the leading ``/`` is Docker's own).
CONTAINER_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]+")
#: Bind options ``docker run --volume`` takes (comma-separated): access, SELinux label, propagation, copy, consistency.
BIND_OPTIONS = frozenset({"ro", "rw", "z", "Z", "shared", "rshared", "slave", "rslave", "private", "rprivate",
                          "nocopy", "consistent", "cached", "delegated"})
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _control(value: str) -> str | None:
    """A readable name of the first control character in ``value``, or None."""
    m = _CONTROL.search(value)
    if m is None:
        return None
    names = {"\x00": "a NUL byte", "\n": "a newline", "\r": "a carriage return", "\t": "a tab"}
    return f"{names.get(m.group(), f'the control character {m.group()!r}')} at character {m.start() + 1}"


def host_path(value: str) -> str:
    """Check a host path that eagle3ops bind-mounts into containers (``-v PATH:...``).

    Raises:
        ValueError: a ``:`` in it (the bind would split there) or a control character.
    """
    if ":" in value:
        raise ValueError(f"{value!r} contains ':', which Docker cannot bind-mount (a bind is HOST:CONTAINER[:OPTS], "
                         f"split at ':'); move or symlink the directory to a path without ':' and write that path")
    bad = _control(value)
    if bad:
        raise ValueError(f"{value!r} contains {bad}; write the path without control characters (rename the "
                         f"directory if it has one)")
    return value


def bind(value: str) -> str:
    """Check a ``HOST:CONTAINER[:OPTS]`` bind of ``serving.volumes``.

    Raises:
        ValueError: not two or three ``:``-separated parts, a relative container path, a host side that is neither
            an absolute path nor a volume name, an unknown option, or a control character.
    """
    bad = _control(value)
    if bad:
        raise ValueError(f"{value!r} contains {bad}; write the bind without control characters")
    parts = value.split(":")
    fix = "write HOST_PATH:CONTAINER_PATH or HOST_PATH:CONTAINER_PATH:ro, with no ':' inside either path"
    if len(parts) not in (2, 3) or not all(parts[:2]):
        raise ValueError(f"{value!r} is not HOST:CONTAINER[:OPTS] (Docker splits a bind at ':'); {fix}")
    src, dst = parts[0], parts[1]
    if not dst.startswith("/"):
        raise ValueError(f"{value!r}: the container path {dst!r} is not absolute; {fix}")
    if not src.startswith("/") and not CONTAINER_NAME.fullmatch(src):
        raise ValueError(f"{value!r}: the host side {src!r} is neither an absolute path nor a volume name; {fix}")
    if len(parts) == 3:
        unknown = [o for o in parts[2].split(",") if o not in BIND_OPTIONS]
        if unknown:
            raise ValueError(f"{value!r}: unknown bind option(s) {unknown} (Docker takes {', '.join(sorted(BIND_OPTIONS))}"
                             f"); {fix}")
    return value


def env_name(value: str) -> str:
    """Check an environment variable's name.

    Raises:
        ValueError: empty, or holding ``=`` or a control character.
    """
    if not value or "=" in value or _CONTROL.search(value):
        raise ValueError(f"environment variable name {value!r}: a name must be non-empty, without '=' or control "
                         f"characters (the engine stores NAME=VALUE and splits at the first '='); rename it")
    return value


def env_value(value: str) -> str:
    """Check an environment variable's value.

    Raises:
        ValueError: a NUL byte (``execve`` cuts the value there), a newline or a carriage return.
    """
    for ch, what, why in (("\x00", "a NUL byte", "no process environment can hold it (the value ends there)"),
                          ("\n", "a newline", "env files and /proc/PID/environ readers take one variable per line"),
                          ("\r", "a carriage return", "env files and shells treat it as a line end")):
        if ch in value:
            raise ValueError(f"the value contains {what} at character {value.index(ch) + 1}: {why}; write it on "
                             f"one line (e.g. base64-encode it, or mount it as a file)")
    return value


def container_name(value: str) -> str:
    """Check a container name as Docker does.

    Raises:
        ValueError: not ``[a-zA-Z0-9][a-zA-Z0-9_.-]+``.
    """
    if not CONTAINER_NAME.fullmatch(value):
        raise ValueError(f"{value!r} is not a name Docker accepts (only [a-zA-Z0-9][a-zA-Z0-9_.-]+: letters, digits, "
                         f"'_', '.', '-', at least two characters, starting with a letter or digit); rename the "
                         f"serving container and write its name here")
    return value


_CPU_ITEM = re.compile(r"(\d+)(?:-(\d+))?")


def cpu_ids(value: str) -> frozenset[int]:
    """The CPU ids of a list in Docker's ``--cpuset-cpus`` form (``0-3,6``; moby ``pkg/parsers.ParseUintList``).

    Raises:
        ValueError: an item that is not ``N`` or ``N-M``, a range whose start is above its end, or an empty list.
    """
    out: set[int] = set()
    for item in value.split(","):
        m = _CPU_ITEM.fullmatch(item)
        if m is None or (m.group(2) is not None and int(m.group(1)) > int(m.group(2))):
            raise ValueError(f"{value!r} is not a CPU list as `docker run --cpuset-cpus` takes it: {item!r} is not a "
                             f"CPU id or an ascending range; write ids and ranges joined by ',', no spaces, e.g. "
                             f"`0-3` or `0,2`")
        out.update(range(int(m.group(1)), int(m.group(2) or m.group(1)) + 1))
    return frozenset(out)


def cpu_set(value: str) -> str:
    """Check a ``--cpuset-cpus`` value (:func:`cpu_ids`); returns it unchanged."""
    cpu_ids(value)
    return value


HostPath = Annotated[str, AfterValidator(host_path)]
Bind = Annotated[str, AfterValidator(bind)]
EnvName = Annotated[str, AfterValidator(env_name)]


def secret_env_name(value: str) -> str:
    """Check the name of an environment variable listed as holding a secret (inventory ``secret_env``): a shell
    name, so that ``NAME=VALUE`` is found inside a shell command line too (:mod:`eagle3ops.redact`).

    Raises:
        ValueError: not letters, digits and ``_``, or starting with a digit.
    """
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):
        raise ValueError(f"{value!r} is not an environment variable name (letters, digits and `_`, not starting "
                         f"with a digit), e.g. `secret_env: [ORG_SERVING_TOKEN]`: fix or remove it")
    return value


SecretEnvName = Annotated[str, AfterValidator(secret_env_name)]
EnvValue = Annotated[str, AfterValidator(env_value)]
ContainerName = Annotated[str, AfterValidator(container_name)]
CpuSet = Annotated[str, AfterValidator(cpu_set)]

__all__ = ["Bind", "ContainerName", "CpuSet", "EnvName", "EnvValue", "HostPath", "SecretEnvName", "bind",
           "container_name", "cpu_ids", "cpu_set", "env_name", "env_value", "host_path", "secret_env_name"]
