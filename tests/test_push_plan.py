"""``push`` is planned before it runs: read-only host facts → a pure :class:`PushPlan` (which layers the
host lacks, in which parts, compression, tags, scaffolds) → execution; ``push --dry-run`` prints the plan and
carries it out on a dry executor (reads run, changes recorded). No host is contacted here: the facts are given,
and the layer source is an in-memory stand-in for the build engine's layer store."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from eagle3ops.commands import docker as dk
from eagle3ops.commands import transfer as tc
from eagle3ops.commands.types import Change, Read
from eagle3ops.config import load_inventory
from eagle3ops.executor import Local
from eagle3ops.remote import render
from eagle3ops.transfer.errors import TransferError
from eagle3ops.transfer.hoststore import HostStore
from eagle3ops.transfer.local import LocalImage, chain_ids
from eagle3ops.transfer.plan import HostFacts, PushOptions, expected_host_id, plan_push
from eagle3ops.transfer.pusher import PushResult, execute
from eagle3ops.transfer.sources import LayerSource

REPO = Path(__file__).resolve().parents[1]
SIZES = (3000, 5000, 7000)


class MemorySource(LayerSource):
    """Stand-in for the build engine's layer store: three layers of fixed bytes held in memory."""

    kind = "memory"

    def __init__(self):
        self.layers = [bytes([i + 1]) * n for i, n in enumerate(SIZES)]
        diff_ids = tuple("sha256:" + hashlib.sha256(b).hexdigest() for b in self.layers)
        self.config = json.dumps({"rootfs": {"type": "layers", "diff_ids": list(diff_ids)}}).encode()
        super().__init__(LocalImage(ref="app:1", id="sha256:" + hashlib.sha256(self.config).hexdigest(),
                                    diff_ids=diff_ids, repo_tags=("app:1", "app:latest")))

    def config_bytes(self) -> bytes:
        return self.config

    def layer_size(self, i: int) -> int:
        return len(self.layers[i])

    def _raw_layer(self, i: int) -> Iterator[bytes]:
        yield self.layers[i]


@pytest.fixture
def host():
    return load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")


def _store(src: LayerSource, held: int = 0, *, image: bool = False, scaffolds: dict | None = None,
           kind: str = "classic") -> HostStore:
    chains = frozenset(chain_ids(src.image.diff_ids)[:held])
    ids = {src.image.id} if image else set()
    return HostStore(kind, "overlay2", "20.10", chains, frozenset(ids), scaffolds or {})


def test_a_host_holding_the_first_layer_gets_the_other_two_in_one_part(host):
    src = MemorySource()
    plan = plan_push(host, src, HostFacts(_store(src, held=1)), PushOptions())
    assert plan.action == "load" and plan.mode == "thin"
    assert [p.include for p in plan.parts] == [(1, 2)] and plan.layer_bytes == SIZES[1] + SIZES[2]
    assert plan.compression == "none"  # below the size worth measuring the link for
    assert plan.load == tc.load(host) and isinstance(plan.load, Change)
    assert plan.commands(host) == [tc.load(host)] and plan.scaffolds == ()
    assert plan.lines(host)[1:] == [render(tc.load(host))] and "2 layer(s)" in plan.summary()


def test_chunks_become_scaffold_parts_removed_at_the_end(host):
    src = MemorySource()
    plan = plan_push(host, src, HostFacts(_store(src)), PushOptions(chunk_bytes=4000))
    assert [(p.include, p.scaffold) for p in plan.parts] == [((0, 1), True), ((2,), False)]
    scaffold_id = plan.parts[0].host_id(src.image.diff_ids)
    assert plan.scaffolds == (scaffold_id,)
    assert plan.commands(host) == [tc.load(host), tc.load(host), dk.rmi(host, scaffold_id)]


def test_an_image_already_there_is_present_or_only_tagged(host):
    src = MemorySource()
    expect, kind = expected_host_id(src, _store(src))
    assert (expect, kind) == (src.image.id, "config digest")
    store = _store(src, held=3, image=True, scaffolds={"sha256:old": src.image.id, "sha256:other": "sha256:x"})
    both = HostFacts(store, {"app:1": expect, "app:latest": expect})
    present = plan_push(host, src, both, PushOptions())
    assert present.action == "present" and present.parts == () and present.missing_tags == ()
    assert present.commands(host) == [dk.rmi(host, "sha256:old")]  # only this image's leftover scaffold
    one = plan_push(host, src, HostFacts(store, {"app:1": expect, "app:latest": ""}), PushOptions())
    assert one.action == "tag" and one.commands(host)[0] == dk.tag(host, expect, "app:latest")


def test_bad_choices_are_refused_while_planning(host):
    src = MemorySource()
    with pytest.raises(TransferError, match="no `zstd`"):
        plan_push(host, src, HostFacts(_store(src), has_zstd=False), PushOptions(compression="zstd"))
    with pytest.raises(TransferError, match="--containerd refuse"):
        plan_push(host, src, HostFacts(_store(src, kind="containerd")), PushOptions(containerd="refuse"))
    zstd = plan_push(host, src, HostFacts(_store(src), has_zstd=True), PushOptions(compression="zstd"))
    assert zstd.load == tc.load(host, "zstd")


class DryHost(Local):
    """Stand-in for the SSH executor of a host: a dry :class:`Local` whose reads are answered from a dict (the
    verification's ``docker image inspect``), never run."""

    def __init__(self, host, answers: dict[str, str]):
        super().__init__(dry_run=True, echo=None)
        self.host, self.answers, self.lines = host, answers, []
        self.echo = self.lines.append

    def run(self, argv, **kw):
        if self._record(argv):
            return super().run(argv, **kw)  # a change: recorded, not run
        assert isinstance(argv, Read), argv
        out = self.answers[render(argv)]
        return type("R", (), {"stdout": out, "exited": 0, "ok": True})()

    def record_stream(self, argv, note=""):
        self._record(argv)
        if note:
            self.echo(f"#   {note}")


def test_a_dry_run_carries_the_plan_out_recording_changes_and_running_reads(host):
    src = MemorySource()
    from eagle3ops.transfer.compression import Encoders

    load_plan = plan_push(host, src, HostFacts(_store(src, held=1)), PushOptions(dry_run=True))
    r = DryHost(host, {})
    res = PushResult(host.name)
    execute(r, load_plan, HostFacts(_store(src, held=1)), Encoders(src), PushOptions(dry_run=True), res)
    assert res.status == "dry-run" and res.layers_sent == 2 and r.changes == [render(tc.load(host))]
    assert any("layers [1, 2]" in line for line in r.lines)

    expect = src.image.id
    facts = HostFacts(_store(src, held=3, image=True), {"app:1": expect, "app:latest": expect})
    answers = {render(tc.image_id_and_layers(host, t)): f"{expect} {json.dumps(list(src.image.diff_ids))}"
               for t in src.image.repo_tags}
    r = DryHost(host, answers)
    res = PushResult(host.name)
    execute(r, plan_push(host, src, facts, PushOptions(dry_run=True)), facts, Encoders(src),
            PushOptions(dry_run=True), res)
    assert res.status == "dry-run" and r.changes == [] and r.history == list(answers)  # verified by reads only
