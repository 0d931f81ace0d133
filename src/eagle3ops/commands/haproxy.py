"""HAProxy's runtime API as command lines: the commands a serving group's balancer sends, and the client that sends
them from a host's shell.

The runtime API (HAProxy 2.x management guide, "Unix Socket commands") takes one command per connection in its
non-interactive mode: the client writes the command and a newline, HAProxy answers and closes. The commands used:
``show servers state BACKEND`` (each server's operational and administrative state, a space-separated table under a
``# be_id be_name srv_id srv_name ...`` header), ``show stat`` (CSV under ``# pxname,svname,...``; ``scur`` is a
server's current sessions) and ``set server BACKEND/SERVER state ready|drain|maint`` (empty answer on success).

On a host the client is :data:`CLIENT`, a standard-library Python program run as ``python3 -c`` (``socat`` is not on
every host): it sends each command on a connection of its own and prints the answers as one JSON list of strings.
"""

from __future__ import annotations

from eagle3ops.commands.types import Change, Read
from eagle3ops.config.groups import HAPROXY_NAME

#: Server states ``set server ... state`` takes.
SET_STATES = ("ready", "drain", "maint")

#: The host-side client: argv[1] the runtime API (a unix socket path, or HOST:PORT), argv[2] seconds per exchange,
#: argv[3:] one command each; prints a JSON list of the answers. Exits 1 naming the address when it cannot connect.
CLIENT = """import json, socket, sys
addr, timeout = sys.argv[1], float(sys.argv[2])
answers = []
for command in sys.argv[3:]:
    if addr.startswith("/"):
        s, target = socket.socket(socket.AF_UNIX), addr
    else:
        h, _, p = addr.rpartition(":")
        h = h.strip("[]")
        s, target = socket.socket(socket.AF_INET6 if ":" in h else socket.AF_INET), (h, int(p))
    s.settimeout(timeout)
    try:
        s.connect(target)
        s.sendall(command.encode() + b"\\n")
        chunks = []
        while True:
            d = s.recv(65536)
            if not d:
                break
            chunks.append(d)
    except OSError as e:
        sys.exit(f"HAProxy runtime API {addr}: {e}")
    finally:
        s.close()
    answers.append(b"".join(chunks).decode("utf-8", "replace"))
print(json.dumps(answers))
"""


def _name(value: str, what: str) -> str:
    if not HAPROXY_NAME.match(value):
        raise ValueError(f"{what} {value!r} is not an HAProxy name (letters, digits and -_.: only)")
    return value


def show_servers_state(backend: str) -> str:
    """``show servers state BACKEND``: one row per server of ``backend``.

    Raises:
        ValueError: ``backend`` is not an HAProxy name.
    """
    return f"show servers state {_name(backend, 'backend')}"


def show_stat() -> str:
    """``show stat``: the statistics CSV of every proxy and server (``scur``: current sessions)."""
    return "show stat"


def set_server_state(backend: str, server: str, state: str) -> str:
    """``set server BACKEND/SERVER state STATE`` (``ready``, ``drain`` or ``maint``).

    Raises:
        ValueError: a name that is not an HAProxy name, or another state.
    """
    if state not in SET_STATES:
        raise ValueError(f"state {state!r}: one of {', '.join(SET_STATES)}")
    return f"set server {_name(backend, 'backend')}/{_name(server, 'server')} state {state}"


def runtime_api(endpoint: str, commands: list[str], timeout_s: float, python: str = "python3") -> Read | Change:
    """The host-side client (:data:`CLIENT`) sending ``commands`` to the runtime API at ``endpoint`` (a unix socket
    path or ``HOST:PORT``), ``timeout_s`` seconds per exchange; prints a JSON list of the answers.

    A :class:`Read` when every command is a ``show``, else a :class:`Change` (a dry run then does not send it).
    """
    argv = [python, "-c", CLIENT, endpoint, f"{timeout_s:g}", *commands]
    return Read(argv) if all(c.startswith("show ") for c in commands) else Change(argv)


__all__ = ["CLIENT", "SET_STATES", "runtime_api", "set_server_state", "show_servers_state", "show_stat"]
