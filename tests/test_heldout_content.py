"""Held out by content: conversations that share any user turn (NFKC, casefold, whitespace collapsed) fall on one
side of every split, and the split's record counts them.

ShareGPT V3 repeats first turns word for word under other ids ("hi", "Give me 50 examples ...", a 645-character
exam question), so a split keyed by id or index put copies of a trained prompt on the held-out side. The items
here are built in the test (no server, no tokenizer): pure functions.
"""

from __future__ import annotations

import pytest

from eagle3ops.speculate import regenerate as rg


def _item(id_: str, *users: str) -> rg.Item:
    turns: list[tuple[str, str]] = []
    for u in users:
        turns += [("user", u), ("assistant", "")]
    return rg.Item(id_, tuple(turns))


#: Copies of one user turn under other ids, at other positions, in other case, width and spacing.
DUPLICATES = [
    _item("a:0", "hi"),
    _item("b:7", "Hi"),
    _item("c:3", "tell me a joke", "  HI \n"),  # the copy is this conversation's second user turn
    _item("d:9", "ｈｉ"),  # fullwidth: NFKC makes it "hi"
    _item("e:1", "Give me 50 examples of\tmetaphors"),
    _item("f:4", "something else first", "give me 50 examples of metaphors"),
    _item("g:2", "Tell me a joke"),  # joins c's group, and so a's: groups are transitive
]


def _items(n: int = 60) -> list[rg.Item]:
    return DUPLICATES + [_item(f"x:{i}", f"question number {i}") for i in range(n)]


@pytest.mark.xfail(strict=True, reason="splits are keyed by id: a copy of a trained user turn can be held out")
def test_duplicated_user_turns_under_other_ids_and_positions_fall_on_one_side():
    items = _items()
    group_of = {"a:0": 1, "b:7": 1, "c:3": 1, "d:9": 1, "g:2": 1, "e:1": 2, "f:4": 2}
    for salt in [f"salt-{k}" for k in range(12)]:
        train, held, record = rg.split_held_out(items, 0.5, salt)
        assert len(train) + len(held) == len(items)
        side = {i.id: "held" if i in held else "train" for i in items}
        for g in (1, 2):
            assert len({side[i] for i, k in group_of.items() if k == g}) == 1, (salt, g, side)
        content = record["content"]
        # 2 groups of copies (5 and 2 conversations): 5 conversations repeat a user turn of another one
        assert content["groups"] == len(items) - 5
        assert content["groups_with_duplicates"] == 2 and content["conversations_in_duplicate_groups"] == 7
        assert content["duplicate_conversations"] == 5
