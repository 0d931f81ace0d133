"""The weights transfer's host commands (the rented-host lifecycle), as argv lists (pure, no I/O).

A host's weights manifest (``<state_dir>/weights/manifest.txt``) is one line per regular file of ``model_path``:
``<sha256> <bytes> <mtime seconds> <relative path>``, names in C order, after a header line
``# eagle3ops weights manifest v1``. The serving host's first window records it (:func:`record_detached`, detached:
hashing a large model takes minutes and must not hold the window); a later look re-verifies it cheaply by size and
mtime (:func:`stat_listing`) and hashes only the files whose size or mtime changed (:func:`hash_files`).

A file is copied from one host into another through the driver: :func:`read_from` on the source (``tail -c +N``: the
bytes from offset N) piped into :func:`receive_file` on the destination, which appends them to ``<file>.part`` (a
partly copied file continues, never restarts), then checks size and sha256 on the receiving host and only then
renames it over ``<file>``.
"""

from __future__ import annotations

from eagle3ops.commands.types import Change, Read

#: The manifest's first line (its format's name and version).
MANIFEST_HEADER = "# eagle3ops weights manifest v1"
#: Suffix of a file being received.
PART = ".part"

#: ``record DIR OUT``: hash every regular file of DIR (no ``*.part``) into OUT (written beside, then renamed).
RECORD_SH = r'''set -eu
dir=$1; out=$2; tmp="$out.tmp.$$"
mkdir -p "$(dirname "$out")"
cd "$dir"
{ echo "# eagle3ops weights manifest v1"
  find . -type f ! -name '*.part' -printf '%P\n' | LC_ALL=C sort | while IFS= read -r f; do
    s=$(stat -c '%s %Y' -- "$f"); h=$(sha256sum < "$f" | cut -c1-64); printf '%s %s %s\n' "$h" "$s" "$f"
  done; } > "$tmp"
mv -f "$tmp" "$out"
'''

#: ``receive DIR REL SIZE SHA256 OFFSET``: append stdin to DIR/REL.part (which must hold OFFSET bytes), then verify.
#: Exit 4: the partial file does not hold OFFSET bytes (another copy ran: plan again); 3: the size differs after the
#: stream (cut: resume); 5: sha256 differs (the partial file is removed: the next copy starts the file again).
RECEIVE_SH = r'''set -eu
dir=$1; rel=$2; size=$3; sha=$4; off=$5
f="$dir/$rel"; part="$f.part"
mkdir -p "$(dirname "$f")"
if [ "$off" = 0 ]; then : > "$part"; fi
have=$(stat -c %s -- "$part" 2>/dev/null || echo 0)
if [ "$have" != "$off" ]; then echo "$part holds $have bytes, the plan expected $off" >&2; exit 4; fi
cat >> "$part"
got=$(stat -c %s -- "$part")
if [ "$got" != "$size" ]; then echo "$part holds $got bytes after the stream, expected $size" >&2; exit 3; fi
h=$(sha256sum < "$part" | cut -c1-64)
if [ "$h" != "$sha" ]; then rm -f -- "$part"; echo "$rel: sha256 $h on arrival, the source's manifest says $sha" >&2; exit 5; fi
mv -f -- "$part" "$f"
echo "$h"
'''

#: ``hash DIR REL...``: ``<sha256> <rel>`` of each named file.
HASH_SH = r'''set -eu
dir=$1; shift; cd "$dir"
for f in "$@"; do h=$(sha256sum < "$f" | cut -c1-64); printf '%s %s\n' "$h" "$f"; done
'''


def manifest_path(state_dir: str) -> str:
    """Where a host keeps its weights manifest."""
    return f"{state_dir}/weights/manifest.txt"


def stat_listing(model_dir: str) -> Read:
    """``<bytes> <mtime> <relative path>`` of every regular file under ``model_dir`` (``*.part`` included: the
    resume offsets); exit 1 and nothing on stdout when the directory is missing (GNU ``find``)."""
    return Read(["find", model_dir, "-type", "f", "-printf", "%s %T@ %P\\n"])


def hash_files(model_dir: str, rels: list[str]) -> Read:
    """sha256 of the files ``rels`` under ``model_dir`` on the host (:data:`HASH_SH`)."""
    return Read(["sh", "-c", HASH_SH, "e3-weights-hash", model_dir, *rels])


def record(model_dir: str, out: str) -> Change:
    """Hash every file of ``model_dir`` into the manifest ``out`` (:data:`RECORD_SH`), waited for."""
    return Change(["sh", "-c", RECORD_SH, "e3-weights-record", model_dir, out])


def record_detached(model_dir: str, out: str, log: str) -> Change:
    """:func:`record`, detached (``setsid nohup``, output to ``log``): started by a window, it outlives the SSH
    session and does not hold the window."""
    return Change(["sh", "-c", 'mkdir -p "$(dirname "$3")" && s=$1 && shift && setsid nohup sh -c "$s" '
                   'e3-weights-record "$@" >"$3" 2>&1 </dev/null &', "e3-weights-record", RECORD_SH,
                   model_dir, out, log])


def read_from(path: str, offset: int) -> Read:
    """The bytes of ``path`` from ``offset`` on, to stdout (``tail -c +N``)."""
    return Read(["tail", "-c", f"+{int(offset) + 1}", "--", path])


def receive_file(model_dir: str, rel: str, size: int, sha256: str, offset: int) -> Change:
    """Append stdin to ``model_dir/rel.part`` from ``offset``, verify size and sha256 there, rename into place
    (:data:`RECEIVE_SH`; its exit codes are the refusals)."""
    return Change(["sh", "-c", RECEIVE_SH, "e3-weights-receive", model_dir, rel, str(int(size)), sha256,
                   str(int(offset))])
