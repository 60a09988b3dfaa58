"""engine/core/block_manager.py on its own: a BlockManager over a BlockPool of a few 4-token
blocks, driven with sequences and segments as the scheduler and the runner would, and judged on
the block numbers, reference counts and counters it leaves behind."""
import pytest

from engine.core.block_manager import BlockManager
from engine.core.kv_cache import BlockPool, block_hashes
from engine.core.sequence import SamplingParams, Sequence
from engine.model.runner import Segment

BS = 4


def manager(blocks=8):
    return BlockManager(BlockPool(block_size=BS, num_blocks=blocks))


def seq(rid, ids, max_new_tokens=4):
    return Sequence(id=rid, source="load", prompt="", prompt_ids=list(ids),
                    params=SamplingParams(max_new_tokens=max_new_tokens))


def seg(s, start, n, draft=(), cached=True):
    return Segment(s, start, n, cached=cached, logits=True, draft=draft)


def prefilled(bm, s, limit=64):
    """`s` admitted and its whole prompt computed in one segment."""
    n = bm.allocate(s, limit)
    assert n == len(s.prompt_ids)
    bm.computed(seg(s, 0, n))
    return s


def refs(bm, blocks):
    return [bm.pool.ref[b] for b in blocks]


# ------------------------------------------------------------------ admission
def test_a_first_prompt_takes_fresh_blocks_in_order_and_counts_its_query():
    bm = manager()
    a = seq("a", range(10))
    assert bm.can_allocate(a, 64) and bm.used == 0          # asking takes nothing
    assert bm.allocate(a, 64) == 10
    assert a.block_table == [0, 1, 2] and refs(bm, [0, 1, 2]) == [1, 1, 1] and bm.used == 3
    assert (a.num_computed, a.cached_tokens, a.admitted_cached) == (0, 0, 0)
    assert (bm.queries, bm.hits) == (10, 0)


def test_a_chunk_limit_takes_only_the_blocks_of_the_first_chunk():
    bm = manager()
    a = seq("a", range(10))
    assert bm.allocate(a, 5) == 5                            # positions 0..4: two blocks
    assert a.block_table == [0, 1] and bm.used == 2
    assert bm.queries == 10                                  # the whole prompt was looked up


def test_no_blocks_free_means_nothing_is_taken():
    bm = manager(blocks=2)
    a = seq("a", range(10))                                  # three blocks' worth
    assert not bm.can_allocate(a, 64)
    assert bm.allocate(a, 64) is None
    assert a.block_table == [] and bm.used == 0 and len(bm.pool.free) == 2
    assert (bm.queries, bm.hits) == (0, 0)                   # counted only when admitted
    assert bm.allocate(a, 8) == 8 and a.block_table == [0, 1]   # a chunk that fits does


def test_a_shared_prefix_is_taken_from_the_cache_with_its_reference_counts():
    bm = manager()
    a = prefilled(bm, seq("a", range(10)))
    b = seq("b", [*range(8), 50, 51, 52])
    assert bm.can_allocate(b, 64)
    assert bm.allocate(b, 64) == 3                           # two blocks found, three tokens left
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] == 3
    assert refs(bm, a.block_table) == [2, 2, 1] and bm.shared == 2 and bm.used == 4
    assert (b.num_computed, b.cached_tokens, b.admitted_cached) == (8, 8, 8)
    assert (bm.queries, bm.hits) == (10 + 11, 8)


def test_a_prompt_wholly_cached_still_computes_its_last_token():
    """An 8-token prompt whose two blocks are cached takes only the first: its last token's
    logits are needed, so the block holding it is computed again."""
    bm = manager()
    a = prefilled(bm, seq("a", range(10)))
    b = seq("b", range(8))
    assert bm.allocate(b, 64) == 4
    assert b.block_table == [a.block_table[0], 3] and b.num_computed == 4
    assert (bm.queries, bm.hits) == (18, 4)


def test_prefix_caching_off_forgets_the_cache_and_finds_nothing():
    bm = manager()
    prefilled(bm, seq("a", range(10)))
    assert len(bm.pool.by_hash) == 2
    bm.configure(prefix_caching=False, cache_tokens=8 * BS)
    assert bm.pool.by_hash == {} and bm.pool.hash == [None] * 8
    b = seq("b", range(10))
    assert bm.allocate(b, 64) == 10 and b.block_table == [3, 4, 5] and b.num_computed == 0
    bm.computed(seg(b, 0, 10))
    assert bm.pool.by_hash == {}                             # and names nothing new
    assert (bm.queries, bm.hits) == (20, 0)


def test_reset_counters_zeroes_queries_and_hits_only():
    bm = manager()
    a = prefilled(bm, seq("a", range(10)))
    bm.allocate(seq("b", range(9)), 64)
    assert (bm.queries, bm.hits) == (19, 8)
    bm.reset_counters()
    assert (bm.queries, bm.hits) == (0, 0) and bm.used == 4 and len(bm.pool.by_hash) == 2
    bm.forget_hashes()
    assert bm.pool.by_hash == {} and a.block_table == [0, 1, 2]


# ------------------------------------------------------------------ running
def test_growth_takes_a_block_only_when_the_next_tokens_cross_into_it():
    bm = manager(blocks=4)
    a = prefilled(bm, seq("a", range(10)))                   # positions 0..9 in blocks 0, 1, 2
    a.output_ids.append(7)
    assert bm.can_append(a, 2)                               # positions 10, 11: block 2 has room
    bm.may_append(a, 2)
    assert a.block_table == [0, 1, 2] and bm.used == 3
    assert bm.can_append(a, 3)                               # position 12 needs the last free block
    bm.may_append(a, 3)
    assert a.block_table == [0, 1, 2, 3] and bm.used == 4
    assert bm.can_append(a, 6) and not bm.can_append(a, 7)   # 16 positions held; a 17th has no block


def test_computed_names_full_prompt_blocks_chunk_by_chunk():
    bm = manager()
    a = seq("a", range(10))
    hashes = block_hashes(list(range(10)), BS)
    assert bm.allocate(a, 3) == 3
    bm.computed(seg(a, 0, 3))
    assert a.num_computed == 3 and bm.pool.by_hash == {}     # block 0 not full yet
    bm.may_append(a, 3)
    bm.computed(seg(a, 3, 3))
    assert a.num_computed == 6 and bm.pool.by_hash == {hashes[0]: a.block_table[0]}
    bm.may_append(a, 4)
    bm.computed(seg(a, 6, 4))
    assert a.num_computed == 10 and a.block_table == [0, 1, 2]
    assert bm.pool.by_hash == {hashes[0]: 0, hashes[1]: 1}   # the third block is not full: no name


def test_output_tokens_are_never_named_and_an_uncached_segment_records_nothing():
    bm = manager()
    a = prefilled(bm, seq("a", range(6)))                    # block 0 named; block 1 half prompt
    a.output_ids += [1, 2]
    bm.may_append(a, 2)
    bm.computed(seg(a, 6, 2))                                # block 1 full now, of prompt and output
    assert a.num_computed == 8 and list(bm.pool.by_hash.values()) == [a.block_table[0]]
    bm.computed(seg(a, 0, 8, cached=False))                  # KV cache off: a recompute holds nothing
    assert a.num_computed == 8 and len(bm.pool.by_hash) == 1


def test_accepted_keeps_the_blocks_of_accepted_guesses_and_frees_the_rest():
    bm = manager()
    a = prefilled(bm, seq("a", range(10)))
    a.output_ids.append(1)                                   # 11 tokens; a decode of it and 5 guesses
    assert bm.can_append(a, 6)
    bm.may_append(a, 6)                                      # positions 10..15: block 3 taken
    assert a.block_table == [0, 1, 2, 3] and bm.used == 4
    guesses = seg(a, 10, 6, draft=(3, 4, 5, 6, 7))
    bm.computed(guesses)
    assert a.num_computed == 11                              # the guesses wait for verification
    bm.accepted(guesses, 1)
    assert a.num_computed == 12 and a.block_table == [0, 1, 2] and bm.used == 3
    assert bm.pool.ref[3] == 0 and 3 in bm.pool.free


def test_all_guesses_accepted_keep_every_block():
    bm = manager()
    a = prefilled(bm, seq("a", range(10)))
    a.output_ids.append(1)
    bm.may_append(a, 4)
    guesses = seg(a, 10, 4, draft=(3, 4, 5))
    bm.computed(guesses)
    bm.accepted(guesses, 3)
    assert a.num_computed == 14 and a.block_table == [0, 1, 2, 3] and bm.used == 4


def test_free_gives_back_only_its_own_reference_and_keeps_named_contents():
    bm = manager()
    a = prefilled(bm, seq("a", range(10)))
    b = seq("b", [*range(8), 9, 9])
    bm.allocate(b, 64)
    bm.free(a)
    assert (a.block_table, a.num_computed) == ([], 0)
    assert refs(bm, b.block_table) == [1, 1, 1] and bm.used == 3 and bm.shared == 0
    assert bm.pool.ref[2] == 0 and bm.cached_free == 0      # a's own third block: free, unnamed
    bm.free(b)
    assert bm.used == 0 and not any(bm.pool.ref) and bm.cached_free == 2
    c = seq("c", range(10))                                  # the named blocks are found again
    assert bm.allocate(c, 64) == 2 and c.block_table[:2] == [0, 1] and bm.used == 3


def test_freed_named_blocks_are_evicted_oldest_first():
    bm = manager(blocks=4)
    a = prefilled(bm, seq("a", range(9)))                    # blocks 0, 1 named, 2 not
    bm.free(a)
    b = seq("b", range(100, 108))                            # two fresh blocks: 3, then the oldest freed (0)
    assert bm.allocate(b, 64) == 8 and b.block_table == [3, 0]
    assert list(bm.pool.by_hash.values()) == [1]             # 0's name is gone with its contents
    c = seq("c", range(9))                                   # the chain broke at its start: no hit
    assert bm.allocate(c, 4) == 4 and c.num_computed == 0 and bm.hits == 0   # a hit would leave 1
    assert c.block_table == [1] and bm.pool.by_hash == {}   # the next oldest, evicted in turn


# ------------------------------------------------------------------ the budget
def test_configure_sets_the_budget_in_whole_blocks():
    bm = manager()
    bm.configure(prefix_caching=True, cache_tokens=17)
    assert bm.block_budget == 4 and bm.capacity == 8
    assert not bm.can_allocate(seq("a", range(17)), 64)      # five blocks
    assert bm.allocate(seq("a", range(16)), 64) == 16 and bm.used == 4
    assert not bm.can_allocate(seq("b", range(1)), 64)       # the budget, not the capacity, is full


def test_never_fits_weighs_prompt_and_output_against_the_budget():
    bm = manager()
    bm.configure(prefix_caching=True, cache_tokens=16)
    assert bm.never_fits(seq("a", range(10), max_new_tokens=6)) is None          # 16 tokens: 4 blocks
    assert bm.never_fits(seq("a", range(10), max_new_tokens=7)) == \
        "needs 17 tokens of KV cache; the cache budget is 16 tokens"
    bm.configure(prefix_caching=True, cache_tokens=32)
    assert bm.never_fits(seq("a", range(10), max_new_tokens=7)) is None


def test_a_lowered_budget_is_over_until_blocks_come_back():
    bm = manager()
    a = prefilled(bm, seq("a", range(12)))
    b = prefilled(bm, seq("b", range(100, 112)))
    assert bm.used == 6 and not bm.over_budget
    bm.configure(prefix_caching=True, cache_tokens=5 * BS)
    assert bm.over_budget and not bm.can_append(a, 1)        # nothing new while over
    bm.free(b)
    assert bm.used == 3 and not bm.over_budget
    assert bm.can_append(a, 8) and not bm.can_append(a, 9)   # two more blocks under the budget of five


def test_a_prefix_hit_that_would_pass_the_budget_is_not_taken():
    bm = manager()
    a = prefilled(bm, seq("a", range(9)))
    bm.free(a)                                               # blocks 0, 1 free but named
    bm.configure(prefix_caching=True, cache_tokens=2 * BS)
    hog = seq("hog", range(200, 208))
    assert bm.allocate(hog, 64) == 8 and hog.block_table == [3, 4]
    b = seq("b", range(9))                                   # reviving blocks 0, 1 would make four
    assert bm.allocate(b, 64) is None and b.num_computed == 0 and bm.used == 2
    assert bm.pool.ref[0] == bm.pool.ref[1] == 0


# ------------------------------------------------------------------ preemption
def test_a_preempted_request_comes_back_only_when_all_it_had_fits():
    """A request preempted after one output token (9 tokens) is readmitted on a chunk of 4
    only when the blocks for all 9 and its next token (3) are free, where a new request
    with the same chunk needs just one."""
    bm = manager(blocks=4)
    one = prefilled(bm, seq("one", range(200, 204)))
    prefilled(bm, seq("two", range(300, 304)))               # two blocks held: two free
    p = seq("p", range(100, 108))
    p.output_ids.append(1)
    p.preemptions = 1
    assert bm.allocate(p, 4) is None and p.block_table == [] and bm.used == 2
    fresh = seq("new", range(400, 409))                      # 9 tokens too, never preempted
    assert bm.allocate(fresh, 4) == 4 and len(fresh.block_table) == 1
    bm.free(fresh)
    assert bm.allocate(p, 4) is None                         # still two free
    bm.free(one)
    assert bm.allocate(p, 4) == 4 and len(p.block_table) == 1 and bm.used == 2   # three were free
    assert (p.num_computed, p.admitted_cached) == (0, 0)
    assert (bm.queries, bm.hits) == (4 + 4 + 9, 0)          # a readmission is not a new query


def test_a_readmission_keeps_its_first_hit_count_and_gives_back_refused_prefix_blocks():
    bm = manager(blocks=5)
    a = prefilled(bm, seq("a", range(10)))                   # blocks 0, 1 named
    b = seq("b", [*range(8), 60, 61, 62, 63])
    assert bm.allocate(b, 64) == 4 and b.cached_tokens == 8
    bm.free(b)
    b.output_ids.append(1)                                   # preempted after its first token
    b.preemptions = 1
    hog = seq("hog", range(200, 204))
    bm.allocate(hog, 64)                                     # one block free now
    assert bm.allocate(b, 4) is None                         # 13 tokens + 1: two fresh blocks needed
    assert refs(bm, a.block_table[:2]) == [1, 1] and b.block_table == [] and b.num_computed == 0
    bm.free(hog)
    assert bm.allocate(b, 4) == 4 and b.block_table[:2] == a.block_table[:2]
    assert (b.num_computed, b.admitted_cached, b.cached_tokens) == (8, 8, 8)
    assert (bm.queries, bm.hits) == (10 + 12 + 4, 8)


@pytest.mark.parametrize("prompt, cached", [(4, 0), (5, 4), (8, 4), (9, 8), (12, 8)])
def test_a_hit_covers_the_full_blocks_before_the_last_token(prompt, cached):
    bm = manager()
    prefilled(bm, seq("a", range(16)))
    b = seq("b", range(prompt))
    assert bm.allocate(b, 64) == prompt - cached and b.num_computed == cached
    assert bm.hits == cached and len(b.block_table) == -(-prompt // BS)


def test_block_pool_counts_shares_and_evicts_oldest_first():
    bm = BlockPool(block_size=4, num_blocks=4)
    ids = list(range(12))
    hashes = block_hashes(ids, 4)
    assert len(hashes) == 3 and len(set(hashes)) == 3
    assert block_hashes(ids[:8] + [99] * 4, 4)[:2] == hashes[:2]     # chained: same prefix, same names
    a = bm.allocate(3)
    for block, h in zip(a, hashes):
        bm.register(block, h)
    assert bm.used == 3 and bm.allocate(2) is None                    # only one block free
    assert bm.match(hashes[:2]) == a[:2] and bm.shared == 2           # a second user of two blocks
    bm.release(a[:2])
    bm.release(a)
    assert bm.used == 0 and bm.cached_free == 3                       # free, contents kept
    assert bm.match(hashes) == a and bm.used == 3                     # found again after release
    bm.release(a)
    fresh = bm.allocate(2)                                            # the never-used block, then the oldest freed
    assert fresh[0] == 3 and fresh[1] == a[0] and bm.match(hashes) == []   # a[0] evicted: chain broken at the start
    bm.block_budget = 2
    assert not bm.can_allocate(1) and bm.match(hashes[1:2]) is None   # reviving a block would pass the budget
    bm.release(fresh)
    assert bm.used == 0


def test_block_manager_gives_requests_their_blocks_and_prefix_hits():
    """On sequences: a prompt's blocks at admission, full prompt blocks findable once computed,
    a later request with the same prefix taking them, guesses' blocks given back, all freed."""
    blocks = BlockManager(BlockPool(block_size=4, num_blocks=8))
    a = seq("a", range(10))
    assert blocks.never_fits(a) is None and blocks.can_allocate(a, 16)
    assert blocks.allocate(a, 16) == 10 and len(a.block_table) == 3 and a.num_computed == 0
    blocks.computed(Segment(a, 0, 10, cached=True, logits=True))
    assert a.num_computed == 10 and blocks.pool.by_hash.keys() == set(block_hashes(range(10), 4))
    b = seq("b", [*range(8), 50, 51])
    assert blocks.allocate(b, 16) == 2                        # the two shared blocks found, two tokens left
    assert b.block_table[:2] == a.block_table[:2] and blocks.shared == 2
    assert (b.cached_tokens, blocks.queries, blocks.hits) == (8, 20, 8)
    # a decode with three guesses needs a fourth block; one guess accepted gives it back again
    assert blocks.can_append(a, 4)
    blocks.may_append(a, 4)
    assert len(a.block_table) == 4 and blocks.used == 5
    blocks.accepted(Segment(a, 10, 4, cached=True, logits=True, draft=(1, 2, 3)), 1)
    assert a.num_computed == 11 and len(a.block_table) == 3 and blocks.used == 4
    blocks.free(a)
    blocks.free(b)
    assert blocks.used == 0 and a.block_table == b.block_table == [] and blocks.cached_free == 2
    assert blocks.never_fits(seq("c", range(30), max_new_tokens=3)) == \
        "needs 33 tokens of KV cache; the cache budget is 32 tokens"
