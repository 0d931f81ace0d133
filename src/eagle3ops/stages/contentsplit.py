"""Held out by content: the one grouping every held-out split uses (pure, stdlib only).

A split keyed by record id or index is not held out when the data repeats itself: ShareGPT V3 holds the same
first turn under many ids ("hi", "Give me 50 examples ...", a 645-character exam question), so about one prompt in
seven of a held-out sample equalled a trained user turn word for word. Here conversations are grouped first:

- each user turn is **normalized** (:func:`normalize`: Unicode NFKC, ``str.casefold``, runs of whitespace
  collapsed to one space, ends stripped) and named by :func:`content_key` (the first 16 hex digits of the
  normalized text's sha256);
- conversations sharing **any** key, at any position, are one group (union-find, transitive: A shares a turn with
  B and B with C puts A, B and C together);
- a group's **canonical key** is the smallest key in it; a conversation without a user turn is a group of its own,
  named by its id;
- a group goes to the held-out side when the first 8 bytes of ``sha256(salt + canonical key)`` fall below
  ``fraction`` of the range: stable across machines, runs and orders, and independent of the other groups
  (the rule of :func:`eagle3ops.speculate.prompts.split_by_id` and :func:`eagle3ops.stages.trainplan.held_out_indices`,
  applied to groups instead of ids).

Users: ``regenerate``'s held-out split (:func:`eagle3ops.speculate.regenerate.split_held_out`), stage ``prepare``
(each sample's keys in ``samples.jsonl``, the counts in its manifest), stage ``train``'s held-out samples and the
offline estimate (:func:`eagle3ops.stages.trainplan.held_out_indices`), the demo's gate prompts and the benchmarks
that hold ShareGPT V3 records out.
"""

from __future__ import annotations

import hashlib
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["KEY_HEX", "NORMALIZATION", "ContentGroups", "content_groups", "content_key", "held_out_groups",
           "held_out_past", "normalize"]

#: Hex digits of a content key (64 bits: a chance collision among a million turns is ~3e-8).
KEY_HEX = 16
#: What :func:`normalize` does, in words (recorded beside the counts).
NORMALIZATION = "Unicode NFKC, casefold, whitespace runs collapsed to one space, ends stripped"


def normalize(text: str) -> str:
    """``text`` as compared for held-out splits: NFKC (fullwidth and compatibility forms folded), casefolded,
    whitespace runs collapsed to one space, ends stripped (``"  Ｈi \\n there"`` → ``"hi there"``)."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def content_key(text: str) -> str:
    """The first :data:`KEY_HEX` hex digits of sha256 of :func:`normalize` (``text``) (UTF-8)."""
    return hashlib.sha256(normalize(text).encode("utf-8")).hexdigest()[:KEY_HEX]


@dataclass(frozen=True)
class ContentGroups:
    """Conversations grouped by shared user turns: ``canonical[i]`` is item ``i``'s group (the smallest content
    key in it, or ``id:<item id>`` for an item without user turns); ``ids`` the items' ids, in the same order."""

    canonical: tuple[str, ...]
    ids: tuple[str, ...]

    def members(self) -> dict[str, list[int]]:
        """Canonical key → indices of its items, in item order."""
        out: dict[str, list[int]] = {}
        for i, c in enumerate(self.canonical):
            out.setdefault(c, []).append(i)
        return out

    def record(self, examples: int = 5) -> dict[str, Any]:
        """Counts for a manifest: ``groups`` (distinct groups), ``groups_with_duplicates`` (groups of 2 or more
        conversations), ``conversations_in_duplicate_groups``, ``duplicate_conversations`` (conversations beyond
        the first of each group: what an id split could have put on the other side), ``largest_group``, and up to
        ``examples`` of the largest groups' ids (at most 5 ids each)."""
        members = self.members()
        dup = sorted((m for m in members.values() if len(m) > 1), key=lambda m: (-len(m), m[0]))
        return {"normalization": NORMALIZATION, "conversations": len(self.canonical), "groups": len(members),
                "groups_with_duplicates": len(dup), "conversations_in_duplicate_groups": sum(map(len, dup)),
                "duplicate_conversations": sum(len(m) - 1 for m in dup),
                "largest_group": max((len(m) for m in members.values()), default=0),
                "examples": [[self.ids[i] for i in m[:5]] for m in dup[:examples]]}


def content_groups(user_turns: Sequence[Sequence[str]], ids: Sequence[str] | None = None, *,
                   keyed: bool = False) -> ContentGroups:
    """Group conversations that share any normalized user turn (union-find over their content keys).

    Args:
        user_turns: per conversation, its user turns' texts (``keyed=False``) or their :func:`content_key`\\ s
            (``keyed=True``, e.g. the ``content`` field stage prepare writes per sample).
        ids: per conversation, its id (default: its index as text); names the groups of conversations without
            user turns and the manifest's examples.

    Returns:
        :class:`ContentGroups`, one canonical key per conversation.

    Raises:
        ValueError: ``ids`` is not as long as ``user_turns``.
    """
    ids = tuple(str(i) for i in (ids if ids is not None else range(len(user_turns))))
    if len(ids) != len(user_turns):
        raise ValueError(f"content_groups: {len(user_turns)} conversations but {len(ids)} ids")
    parent: dict[str, str] = {}

    def find(k: str) -> str:
        root = k
        while parent[root] != root:
            root = parent[root]
        while parent[k] != root:  # path compression
            parent[k], k = root, parent[k]
        return root

    keys: list[list[str]] = []
    for turns in user_turns:
        ks = [t if keyed else content_key(t) for t in turns]
        keys.append(ks)
        for k in ks:
            parent.setdefault(k, k)
        for k in ks[1:]:
            a, b = find(ks[0]), find(k)
            if a != b:  # the smaller key becomes the root: the root is the group's smallest key
                parent[max(a, b)] = min(a, b)
    return ContentGroups(tuple(find(ks[0]) if ks else f"id:{ids[n]}" for n, ks in enumerate(keys)), ids)


def held_out_groups(groups: ContentGroups, fraction: float, salt: str, *, at_least_one: bool = False
                    ) -> set[int]:
    """Indices of the conversations held out: every member of each group whose ``sha256(salt + canonical key)``
    (first 8 bytes, big-endian) falls below ``fraction * 2**64``. With ``at_least_one`` and ``fraction > 0``: when
    no group fell below, the group with the smallest hash is held out; when every group did, the one with the
    largest is trained (so neither side is empty where 2 or more groups exist). A single group is never held out
    under ``at_least_one`` (training would be left with nothing).

    Raises:
        ValueError: ``fraction`` not in [0, 1).
    """
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"held-out fraction {fraction}: must be at least 0 and below 1")
    members = groups.members()
    if fraction == 0 or not members:
        return set()
    h = {c: int.from_bytes(hashlib.sha256(f"{salt}{c}".encode()).digest()[:8], "big") for c in members}
    held = {c for c, v in h.items() if v < fraction * 2**64}
    if at_least_one and len(members) >= 2:
        if not held:
            held = {min(h, key=h.__getitem__)}
        if len(held) == len(members):
            held.discard(max(h, key=h.__getitem__))
    elif at_least_one:
        held = set()
    return {i for c in held for i in members[c]}


def held_out_past(rows: Sequence[tuple[int, Sequence[str]]], boundary: int) -> tuple[list[int], list[int],
                                                                                     ContentGroups]:
    """Split indexed conversations at an index ``boundary``, by content: the pool is every row below it; a row at or
    past it is held out unless it shares a normalized user turn with the pool (at any position, directly or through
    other rows, past the boundary too: the groups of :func:`content_groups`). A data file split by record index
    (ShareGPT V3's first 12,000 records trained, the rest held out) holds out copies of trained prompts otherwise.

    Args:
        rows: ``(index, user turns)`` per conversation, in file order; ``index`` names the row (its group id too).
        boundary: the first index past the pool.

    Returns:
        ``(held, repeating, groups)``: the indices held out and those left out for repeating the pool, each in the
        order of ``rows``, and the groups (:meth:`ContentGroups.record` gives the counts).
    """
    groups = content_groups([users for _i, users in rows], [str(i) for i, _u in rows])
    pool = {c for (i, _u), c in zip(rows, groups.canonical) if i < boundary}
    held, repeating = [], []
    for (i, _u), c in zip(rows, groups.canonical):
        if i >= boundary:
            (repeating if c in pool else held).append(i)
    return held, repeating, groups
