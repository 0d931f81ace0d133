"""The pure parts: which retained releases a plan may create, and what each needs on the host (the
sandbox test is tests/test_fallback_creatable.py)."""

from __future__ import annotations

from eagle3ops.config.fallbacks import candidates, fallbacks_from, history_entries, needs, rollback_target

H = history_entries('{"release": 1}\n{"release": 2}\n{"release": 3}\n{"release": 3, "failed": "gate"}\ncut{\n'
                    '{"release": 4}\n')


def test_history_skips_cut_lines_and_fallbacks_skip_failed_releases():
    assert [e["release"] for e in H] == [1, 2, 3, 3, 4]
    assert fallbacks_from(H, {1, 2, 3, 4}, 4) == [2, 1], "3 failed its gate last; 4 is the one that failed now"
    assert fallbacks_from(H, {1, 4}, 4) == [1], "only retained releases"


def test_window_release_and_rollback_candidates():
    kept = {1, 2, 3, 4}
    assert candidates("window", 4, H, kept) == [(2, "a fallback if the gate fails"), (1, "a fallback if the gate fails")]
    assert candidates("release", 4, H, kept)[0] == (4, "a fallback if the gate fails"), "the current one first"
    assert candidates("rollback", 4, H, kept) == [(2, "the rollback target"), (4, "a fallback if the gate fails"),
                                                  (1, "a fallback if the gate fails")]
    assert candidates("rollback", 4, H, kept, to_release=1)[0] == (1, "the rollback target")
    assert candidates("window", None, [], set()) == []


def test_needs_reads_the_image_id_and_bind_sources():
    rec = {"container": {"ImageId": "sha256:abc", "Config": {"Image": "vllm:1"},
                         "HostConfig": {"Binds": ["/models/x:/m:ro", "named-volume:/cache"],
                                        "Mounts": [{"Type": "bind", "Source": "/etc/keys"},
                                                   {"Type": "volume", "Source": "v"}]}}}
    assert needs(rec) == ("sha256:abc", "vllm:1", ["/models/x", "/etc/keys"])
    assert needs({"spec": {"image": "vllm:0", "volumes": {"/m": {"bind": "/m"}}}, "image_id": "sha256:0"}) == \
        ("sha256:0", "vllm:0", ["/m"])
    assert needs({"process": {"argv": ["vllm"]}}) == (None, None, [])


# --- a plain `rollback` returns to the release production last kept ---------------------------------------------
# Each history below is what the supervisor writes (Releases.set_current / mark_gate / mark_failed) for the case
# named; release 1 and 2 were kept by production before it.

def _target(entries, current, retained=frozenset(range(1, 8)), **kw):
    return rollback_target(entries, set(retained), current, **kw)


def test_after_a_gates_rollback_the_rejected_release_is_passed_over():
    """The gate measured 3 while live and rejected it; serving went back to 2. The old rule (the release live before
    the current one) brought back 3, the change that failed."""
    h = [{"release": 1}, {"release": 2}, {"release": 3, "measured": True},
         {"release": 3, "gate": "rollback", "why": "x0.81 (x0.75 to x0.88)"}, {"release": 2}]
    target, why = _target(h, 2)
    assert target == 1, why
    assert why == ("the release production kept live before release 2; passed over: 3 (rejected by a gate "
                   "(rollback: x0.81 (x0.75 to x0.88)))")
    assert fallbacks_from(h, set(range(1, 8)), 2) == [1], "an automatic rollback never picks it either"
    # with nothing kept before: refused, naming the fix and the rejected release; --to still reaches it, named
    h1 = [{"release": 1}, {"release": 2, "measured": True}, {"release": 2, "gate": "rollback", "why": "slower"},
          {"release": 1}]
    target, why = _target(h1, 1)
    assert target is None and "2 (rejected by a gate (rollback: slower))" in why and why.endswith("--to N")
    assert _target(h1, 1, to_release=2) == (2, "named with --to; rejected by a gate (rollback: slower)")
    # a verdict other than keep (undecided, error) leaves it measured only: passed over all the same
    h2 = h[:3] + [{"release": 3, "gate": "undecided", "why": "interval spans 1"}, {"release": 2}]
    assert _target(h2, 2)[0] == 1 and "3 (live only while a gate measured it (undecided: interval spans 1))" \
        in _target(h2, 2)[1]


def test_after_a_gates_keep_the_kept_release_is_current_and_the_one_before_it_is_the_target():
    h = [{"release": 1}, {"release": 2}, {"release": 3, "measured": True}, {"release": 3, "gate": "keep", "why": ""}]
    assert _target(h, 3) == (2, "the release production kept live before release 3")
    # its supervisor died while measuring (no verdict): the measured release is not kept; the target is 2
    target, why = _target(h[:3], 3)
    assert target == 2 and "release 3, serving now, is live only while a gate measured it" in why


def test_after_a_failed_release_the_release_that_failed_never_counts():
    """Release 3 failed its health gate when started (never live); serving went back to 2. A live release that
    failed a window's health gate (2 below) is passed over until it is live again."""
    h = [{"release": 1}, {"release": 2}, {"release": 2}]
    assert _target(h, 2) == (1, "the release production kept live before release 2")
    assert _target(h, 2, to_release=3)[1].startswith("named with --to; never live")
    failed = [{"release": 1}, {"release": 2}, {"release": 2, "failed": "gate: 500"}, {"release": 1}]
    target, why = _target(failed, 1)
    assert target is None and "2 (failed its health gate while live (gate: 500))" in why


def test_after_a_candidates_job_neither_candidates_nor_the_confirmation_count():
    """Candidates 3 and 4 and the control release 5 are never live; the chosen candidate, 6, was live while it was
    confirmed afresh. Rejected: back to 2, target 1; kept: target 2."""
    h = [{"release": 1}, {"release": 2}, {"release": 6, "measured": True}]
    rejected = h + [{"release": 6, "gate": "rollback", "why": "x0.9"}, {"release": 2}]
    assert _target(rejected, 2)[0] == 1 and "passed over: 6 (rejected" in _target(rejected, 2)[1]
    assert _target(h + [{"release": 6, "gate": "keep"}], 6)[0] == 2
    assert candidates("rollback", 2, rejected, set(range(1, 8)))[0] == (1, "the rollback target")


def test_releases_record_the_gates_disposition(tmp_path):
    """The supervisor's writers produce what the rule reads: a measured switch, the gate's verdict, the return."""
    from eagle3ops.supervisor.releases import Releases

    rel = Releases(tmp_path)
    for _ in range(3):
        rel.add_process({"argv": ["vllm"], "environ": [], "cwd": "/", "uid": "0"}, "w")
    rel.set_current(1)
    rel.set_current(2)
    rel.set_current(3, measured=True)
    rel.mark_gate(3, "rollback", "slower")
    rel.set_current(2)
    assert rel.history() == [1, 2, 3, 2] and not rel.is_marked_failed(3)
    assert rel.rollback_target(2)[0] == 1 and rel.fallbacks(2) == [1]
    # a long reason keeps its head (the verdict and its figures), cut at the end
    rel.mark_gate(3, "undecided", "output tokens/s x0.788 to x1.204 " + "x" * 400)
    assert rel.rollback_target(2)[1].count("(undecided: output tokens/s x0.788 to x1.204 ") == 1
