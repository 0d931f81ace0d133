"""Issue 26 kind 10, the pure parts: which retained releases a plan may create, and what each needs on the host (the
sandbox test is tests/test_fallback_creatable.py)."""

from __future__ import annotations

from eagle3ops.config.fallbacks import candidates, fallbacks_from, history_entries, needs

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
