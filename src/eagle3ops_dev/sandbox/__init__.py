"""The embedded sandbox host: an OpenSSH server on 127.0.0.1 and a Docker engine of its own, on this machine.

One job per module: :mod:`.host` (bring a named sandbox up or down, its paths and state), :mod:`.engines` (the
containerd-store engine's packages), :mod:`.keys` (its SSH keys and known_hosts), :mod:`.proc` (the error and local
process runner both use), :mod:`.cli` (``python -m eagle3ops_dev sandbox ...``). The module docs of :mod:`.host`
describe the layout.
"""

from eagle3ops_dev.sandbox.host import (
    ENGINES,
    EXEC_BASE,
    SANDBOX_BASE,
    USER,
    SandboxError,
    SandboxInfo,
    check_prerequisites,
    client_dir,
    down,
    info,
    name_of,
    repo_root,
    status,
    up,
    up_for,
)

__all__ = ["ENGINES", "EXEC_BASE", "SANDBOX_BASE", "USER", "SandboxError", "SandboxInfo", "check_prerequisites",
           "client_dir", "down", "info", "name_of", "repo_root", "status", "up", "up_for"]
