"""Table-driven tests for the suffix index. Each row states the tempting wrong answer."""

from __future__ import annotations

import pytest

from engine.methods.ssr.suffix_index import SuffixIndex

# (sources in priority order, cursors, context, min_match, max_tokens, expected (source, start, length, tokens) or None)
ROWS = [
    # plain match: suffix [2, 3] occurs in d at 1..2, proposes what follows.
    ({"d": [1, 2, 3, 4, 5]}, {}, [9, 2, 3], 2, 8, ("d", 3, 2, [4, 5])),
    # longest match wins: [7, 2, 3] matches at the second occurrence (length 3), not the first
    # occurrence of [2, 3] (length 2). Tempting wrong: start 3 (first occurrence).
    ({"d": [1, 2, 3, 4, 7, 2, 3, 6]}, {}, [7, 2, 3], 2, 8, ("d", 7, 3, [6])),
    # too short: min_match 3 but only [2, 3] matches. Tempting wrong: propose [4] anyway.
    ({"d": [1, 2, 3, 4]}, {}, [9, 2, 3], 3, 8, None),
    # match at the very end proposes nothing. Tempting wrong: an empty proposal reported as a match.
    ({"d": [5, 2, 3]}, {}, [2, 3], 2, 8, None),
    # max_tokens caps the proposal. Tempting wrong: the whole rest of the draft.
    ({"d": [2, 3, 4, 5, 6, 7]}, {}, [2, 3], 2, 2, ("d", 2, 2, [4, 5])),
    # stop tokens end a proposal before them. Tempting wrong: proposing the end-of-sequence token.
    ({"d": [2, 3, 4, 0, 5]}, {}, [2, 3], 2, 8, ("d", 2, 2, [4])),
    # a stop token right after the match: no proposal from that occurrence.
    ({"d": [2, 3, 0, 5]}, {}, [2, 3], 2, 8, None),
    # equal length in two sources: the source listed first wins (newest draft).
    # Tempting wrong: the earlier-created source, or the one with the longer continuation.
    ({"new": [2, 3, 8], "old": [2, 3, 4, 5]}, {}, [2, 3], 2, 8, ("new", 2, 2, [8])),
    # a longer match in a later-listed source still beats a shorter one in an earlier source.
    ({"new": [2, 3, 8], "old": [1, 2, 3, 4]}, {}, [1, 2, 3], 2, 8, ("old", 3, 3, [4])),
    # within a source, equal length: the first occurrence at or after the cursor.
    # Tempting wrong: the first occurrence overall (start 2), which re-reads what was used.
    ({"d": [2, 3, 4, 2, 3, 5]}, {"d": 3}, [2, 3], 2, 8, ("d", 5, 2, [5])),
    # no occurrence after the cursor: fall back to the earliest.
    ({"d": [2, 3, 4, 9, 9]}, {"d": 4}, [2, 3], 2, 8, ("d", 2, 2, [4, 9, 9])),
    # the context itself as a source: an earlier occurrence in it counts (repetition).
    # Tempting wrong: matching the suffix against itself (nothing follows it).
    ({"answer": [1, 2, 3, 4, 1, 2, 3]}, {}, [1, 2, 3, 4, 1, 2, 3], 2, 8, ("answer", 3, 3, [4, 1, 2, 3])),
    # context shorter than min_match: no lookup at all.
    ({"d": [1, 2, 3]}, {}, [2], 2, 8, None),
    # the match extends back only as far as the context and source agree: length 2, not 3.
    ({"d": [9, 2, 3, 4]}, {}, [8, 2, 3], 2, 8, ("d", 3, 2, [4])),
]


@pytest.mark.parametrize("sources, cursors, context, min_match, max_tokens, expected", ROWS)
def test_lookup(sources, cursors, context, min_match, max_tokens, expected):
    idx = SuffixIndex(min_match=min_match)
    for name, toks in sources.items():
        idx.extend(name, toks)
    for name, pos in cursors.items():
        idx.advance(name, pos)
    m = idx.lookup(context, list(sources), max_tokens, stop=frozenset({0}))
    got = None if m is None else (m.source, m.start, m.length, m.tokens)
    assert got == expected


def test_incremental_extend_equals_bulk():
    """Indexing a source token by token finds the same matches as indexing it at once."""
    seq = [1, 2, 3, 1, 2, 4, 1, 2, 3, 5]
    bulk, inc = SuffixIndex(2), SuffixIndex(2)
    bulk.extend("d", seq)
    for t in seq:
        inc.extend("d", [t])
    for ctx in ([1, 2], [2, 3], [9, 1, 2, 3], [2, 4]):
        assert bulk.lookup(ctx, ["d"], 5) == inc.lookup(ctx, ["d"], 5)


def test_min_match_must_be_positive():
    with pytest.raises(ValueError, match="min_match"):
        SuffixIndex(0)


def test_spec_factor_caps_a_proposal_by_its_match_length():
    from engine.methods.ssr.proposers import SuffixProposer

    idx = SuffixIndex(2)
    idx.extend("d", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    capped = SuffixProposer(idx, ["d"], frozenset(), spec_factor=1.5).propose([9, 2, 3], 8)
    assert capped.tokens == [4, 5, 6] and capped.match_len == 2  # 1.5 x 2 = 3 tokens, not 7
    free = SuffixProposer(idx, ["d"], frozenset()).propose([9, 2, 3], 8)
    assert free.tokens == [4, 5, 6, 7, 8, 9]
