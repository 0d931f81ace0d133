"""Image transfer over SSH: only the layers a host lacks, verified, with bounded waits, to many hosts at once.

``eagle3ops push IMAGE HOST [HOST...]`` moves an image from the build engine to each host's Docker engine with
nothing but ``docker`` and ``sshd`` on the host (no registry, no helper image).

How one push works (:func:`~eagle3ops.transfer.pusher.push`):

1. **Local inventory** — ``docker image inspect`` on the build engine gives the image id (``sha256:`` of the config)
   and the diff ids (``RootFS.Layers``). Chain ids follow the OCI image spec (config.md, "Layer ChainID"):
   ``ChainID(L0) = DiffID(L0)``, ``ChainID(L0..n) = sha256(ChainID(L0..n-1) + " " + DiffID(Ln))``.
2. **Remote inventory** — over SSH, ``docker info`` (which image store: the classic layer store, e.g. overlay2, or
   the containerd image store, whose ``DriverStatus`` names ``io.containerd.snapshotter.v1``) and
   ``docker image inspect`` of every image on the host give the set of chain ids the host holds. A layer at position
   i is present when the chain id of the image's first i+1 layers is (Docker's classic ``docker load`` looks layers
   up by chain id: moby ``image/tarexport/load.go``).
3. **Thin archive** — generated on the fly and streamed into ``docker load`` on the host, without the layers the
   host holds. Classic store: a ``docker save``-format tar (``manifest.json``, the config, ``<chainid>/layer.tar``
   only for the missing layers; measured on Docker 20.10: FACTS.md). containerd store: containerd's importer refuses
   such a tar (``failed to resolve layers``), so an OCI image layout is sent instead (``index.json``, a manifest
   naming the layers uncompressed, the config, and blobs only for the missing layers); its unpacker skips layers
   whose snapshot exists (measured on Docker 26.1.5 + containerd 1.7.24:
   :mod:`~eagle3ops.transfer.archive`). If the host held a left-out layer only under another blob digest (a
   registry pull keeps compressed blobs), the image loads and runs but ``docker image ls`` leaves it out; the push
   then sends those blobs in a second archive (mode ``thin+fill``).
4. **Verify** — ``docker image inspect`` on the host must give the expected id and diff ids; "every layer pushed
   but the image is not there" is an error. What "image id" means differs by store and the result says which id
   was compared (:func:`~eagle3ops.transfer.pusher.expected_host_id`): the config digest on the classic store, the
   manifest digest on the containerd store (the manifest this push generated, naming the config digest).

Layer bytes come from the build engine's classic layer store directly when it is readable
(:class:`~eagle3ops.transfer.sources.StoreLayerSource`: the layer's ``tar-split.json.gz`` reassembled with the files of its overlay2 ``diff``
directory, byte-identical to ``docker save``'s layer tar — the digest is checked while streaming), else from
``docker save`` extracted into a private temporary directory after every member passed path-escape checks
(:class:`~eagle3ops.transfer.sources.SaveLayerSource`).

Large pushes are cut into chunks of about :data:`~eagle3ops.transfer.limits.CHUNK_BYTES`: every chunk but the last is loaded as a *scaffold*
image (a minimal config whose ``rootfs.diff_ids`` are a prefix of the image's, labelled
``eagle3ops.scaffold-for=<image id>``), so a broken transfer resumes after the last chunk the host registered;
scaffolds are removed once the image is verified.

Waits are bounded: a stream that moves no byte for ``stall_s`` seconds is killed and reported as stalled; ``docker
load`` after the stream ends gets a deadline proportional to the bytes sent. Broken or stalled transfers are retried
(tenacity, exponential back-off), each attempt re-reading the host's inventory.

Bulk stream: an OpenSSH ``ssh`` subprocess using the inventory's port, user, identity, ssh_config and known_hosts
with ``StrictHostKeyChecking yes`` on every hop, ``ProxyJump`` bastions included (a generated ``-F`` config:
:func:`~eagle3ops.transfer.sshconfig.ssh_client_config`) (measured 125 MB/s vs 76 MB/s for a paramiko channel into ``cat >/dev/null`` on
this machine; ``benchmarks/push-transfer/push_stream.py`` re-measures); small archives go over the already-open paramiko
connection to save the second handshake. Compression (zstd, multi-threaded; gzip when the host has no ``zstd``,
which ``docker load`` reads natively) is chosen per push by measurement: the link rate (a probe of random bytes) and
the compressor's rate and ratio on a sample of the data; used only if it cuts the predicted time.

Modules, one job each (imports run downwards only):

=================  ==============================================================================================
``errors``         the errors; :class:`TransientTransferError` marks what a retry may fix
``limits``         sizes and waits (chunk size, stall time, small-archive and compression thresholds)
``local``          the image on the build engine: id, diff ids, chain ids; classic vs containerd store detection
``tarsafe``        tar members that cannot escape, files opened below a directory without following symlinks
``sources``        layer bytes: the classic store read directly, or ``docker save`` extracted safely
``archive``        the archive formats (``docker save`` for classic, OCI layout for containerd), scaffolds (pure)
``hoststore``      what a host's engine holds (one SSH round trip)
``sshconfig``      the OpenSSH client config of the bulk path (strict host keys on every hop)
``streams``        byte streams into a remote command: OpenSSH subprocess or paramiko channel
``compression``    codec chosen by measurement; each layer compressed once for all hosts
``plan``           the host's facts (reads) and the pure plan of one host's push (parts, compression, tags)
``pusher``         push to one host (carry the plan out: stream, verify, retry) and fan-out to many
``cli``            ``eagle3ops push``
=================  ==============================================================================================

This package exports the push API; tests and benchmarks that reach into the parts import the module concerned.
"""

from eagle3ops.transfer.errors import (LayerDigestMismatch, StreamStalled, TransferError, TransientTransferError,
                                       UnsafeArchive, VerifyFailed)
from eagle3ops.transfer.local import LocalImage, chain_ids, inspect_local
from eagle3ops.transfer.pusher import Progress, PushGroupResult, PushOptions, PushResult, push, push_many

__all__ = [
    "LayerDigestMismatch", "LocalImage", "Progress", "PushGroupResult", "PushOptions", "PushResult", "StreamStalled",
    "TransferError", "TransientTransferError", "UnsafeArchive", "VerifyFailed", "chain_ids", "inspect_local", "push",
    "push_many",
]
