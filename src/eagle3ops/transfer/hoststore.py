"""What a host's Docker engine holds: its image store kind and the chain ids of every layer prefix it has."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from eagle3ops.commands import transfer as tc
from eagle3ops.transfer.archive import SCAFFOLD_LABEL
from eagle3ops.transfer.errors import TransferError
from eagle3ops.transfer.local import chain_ids, is_containerd_store


@dataclass(frozen=True)
class HostStore:
    """What a host's engine holds.

    Attributes:
        kind: ``classic`` (layer store: thin ``docker save`` archives) or ``containerd`` (containerd image store:
            thin OCI layouts; image ids are manifest digests).
        driver: storage driver name (``overlay2``, ``overlayfs``...).
        server_version: Docker server version.
        chain_ids: chain ids of every layer prefix of every image on the host (on the containerd store: of every
            image ``docker image ls`` lists, i.e. whose content is complete).
        image_ids: ids of the images on the host (config digests on the classic store, manifest digests on the
            containerd store).
        scaffolds: scaffold image id → the image id it was made for (left by interrupted pushes).
        arch: the engine's machine (``docker info``'s ``Architecture``, ``uname -m``'s words: ``x86_64``);
            ``""`` when the engine does not say.
    """

    kind: str
    driver: str
    server_version: str
    chain_ids: frozenset[str]
    image_ids: frozenset[str]
    scaffolds: dict[str, str] = field(default_factory=dict)
    arch: str = ""


def inspect_host(remote) -> HostStore:
    """Ask a host which image store it runs and which layers (as chain ids) it holds.

    One SSH command (:func:`eagle3ops.commands.transfer.inventory`): ``docker info``, then ``docker image inspect`` of every image
    (id, ``RootFS.Layers`` and the scaffold label).

    Args:
        remote: an :class:`eagle3ops.remote.Remote`.

    Raises:
        eagle3ops.remote.RemoteError: the host or its engine does not answer.
    """
    host = remote.host
    # check=False: an image deleted between `ls` and `inspect` makes inspect exit 1 but print all the others.
    r = remote.run(tc.inventory(host), timeout=120, check=False)
    head, sep, rest = r.stdout.partition(tc.INVENTORY_SEPARATOR + "\n")
    if r.exited == tc.INVENTORY_NO_ENGINE or not sep:
        raise TransferError(f"{host.name}: the Docker engine at {host.docker_host or 'the default socket'} does not "
                            f"answer `docker info` as {host.user or 'the SSH user'}: {r.stderr.strip()[-300:]} "
                            f"(check docker_host in the inventory and that the user may use the socket)")
    info = json.loads(head)
    kind = "containerd" if is_containerd_store(info) else "classic"
    ids: set[str] = set()
    chains: set[str] = set()
    scaffolds: dict[str, str] = {}
    for line in rest.splitlines():
        iid, _, tail = line.strip().partition("\t")
        if not iid:
            continue
        ids.add(iid)
        layers, _, labels = tail.partition("\t")
        if layers and layers != "null":
            chains.update(chain_ids(json.loads(layers)))
        target = (json.loads(labels) or {}).get(SCAFFOLD_LABEL) if labels and labels != "null" else None
        if target:
            scaffolds[iid] = target
    return HostStore(kind=kind, driver=str(info.get("Driver")), server_version=str(info.get("ServerVersion")),
                     chain_ids=frozenset(chains), image_ids=frozenset(ids), scaffolds=scaffolds,
                     arch=str(info.get("Architecture") or ""))


def host_has_zstd(remote) -> bool:
    """Whether ``zstd`` is on the host's PATH (needed to send zstd streams)."""
    return remote.run(tc.has_zstd(), check=False, timeout=30).ok
