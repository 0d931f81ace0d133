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


def _groups_of(items: list[rg.Item]) -> list[list[int]]:
    pos = {i.id: n for n, i in enumerate(items)}
    return [[pos[x] for x in ("a:0", "b:7", "c:3", "d:9", "g:2")], [pos["e:1"], pos["f:4"]]]


def test_train_holds_samples_out_by_the_content_keys_prepare_writes():
    """Stage train's held-out samples (the offline estimate's) group by the keys each prepared sample carries; a
    run prepared before samples carried keys stays split by index, as it was trained."""
    from eagle3ops.stages import contentsplit as cs
    from eagle3ops.stages import trainplan

    items = _items()
    content = [[cs.content_key(c) for r, c in i.turns if r == "user"] for i in items]
    n = len(items)
    for seed in range(12):
        held = trainplan.held_out_indices(n, 0.3, seed, content)
        assert 0 < len(held) < n
        for group in _groups_of(items):
            assert len({i in held for i in group}) == 1, (seed, group, sorted(held))
    samples = [{"i": k, "content": c} for k, c in enumerate(content)]
    assert trainplan.held_out_of(samples, 0.3, 5) == trainplan.held_out_indices(n, 0.3, 5, content)
    del samples[3]["content"]
    assert trainplan.held_out_of(samples, 0.3, 5) == trainplan.held_out_indices(n, 0.3, 5)
    # at least one group held, never every group; a single group is never held out (nothing left to train)
    assert trainplan.held_out_indices(n, 1e-9, 0, content) and trainplan.held_out_indices(n, 0.0, 0, content) == set()
    assert len(trainplan.held_out_indices(n, 0.999, 0, content)) < n
    assert trainplan.held_out_indices(3, 0.5, 0, [["k"], ["k"], ["k"]]) == set()


def test_groups_are_transitive_and_named_by_their_smallest_key():
    from eagle3ops.stages import contentsplit as cs

    assert cs.normalize("  Ｈi \n\tTHERE ") == "hi there" and cs.content_key("Hi there") == cs.content_key("hi  there")
    g = cs.content_groups([["x", "y"], ["z"], ["y", "z"], [], ["w"]], ["A", "B", "C", "D", "E"], keyed=True)
    assert g.canonical == ("x", "x", "x", "id:D", "w")
    rec = g.record()
    assert (rec["groups"], rec["duplicate_conversations"], rec["largest_group"]) == (3, 2, 3)
    assert rec["examples"] == [["A", "B", "C"]]
    with pytest.raises(ValueError, match="fraction"):
        cs.held_out_groups(g, 1.0, "s")


def test_the_train_manifest_says_how_its_held_out_samples_were_split():
    from eagle3ops.stages import trainplan

    keyed = [{"content": ["a"]}, {"content": ["a", "b"]}, {"content": ["c"]}]
    rec = trainplan.held_out_split(keyed)
    assert rec["by"] == "content" and (rec["groups"], rec["duplicate_conversations"]) == (2, 1)
    assert trainplan.held_out_split([*keyed, {}])["by"] == "index"


def test_past_an_index_boundary_a_row_repeating_the_pool_is_left_out() -> None:
    """``held_out_past``: a row past the boundary that repeats (after normalization, at any position, or through
    another row past the boundary) a user turn of a row below it is left out and counted; the rest are held out, in
    file order (the split the GPU head benchmarks draw their held-out ShareGPT V3 prompts from)."""
    from eagle3ops.stages.contentsplit import held_out_past

    rows = [(0, ["hi"]), (1, ["q", "Give me 50 examples"]),  # the pool
            (2, ["HI "]), (3, ["new one"]), (4, ["other", "give me 50  examples"]), (5, ["fresh", "Other"]),
            (6, ["last"])]
    held, repeating, groups = held_out_past(rows, 2)
    assert held == [3, 6] and repeating == [2, 4, 5]  # 2 repeats "hi", 4 a later turn, 5 through 4
    assert groups.record()["groups"] == 4 and groups.ids[4] == "4"
    assert held_out_past(rows, 0)[:2] == (list(range(7)), [])  # no pool: every row held out, none repeats it
    assert held_out_past(rows, 7)[:2] == ([], [])  # nothing past the boundary
