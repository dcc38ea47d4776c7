"""Pinned blocks: free, but handed out only once no unpinned free block is left, until their pin
ends (then first); at most PIN_CAP of the pool pinned; a prefix hit takes a pinned block back."""

from __future__ import annotations

from argosy.server.engine.block_pool import PIN_CAP, BlockPool


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def cached_blocks(pool: BlockPool, count: int) -> list[int]:
    """`count` blocks holding cached contents, still taken."""
    ids = pool.allocate(count)
    for i in ids:
        pool.register(i, f"h{i}".encode())
    return ids


def test_pinned_blocks_go_last_and_keep_their_contents():
    pool = BlockPool(8, enable_caching=True, clock=Clock())
    pinned = cached_blocks(pool, 3)
    pool.release(pinned, pin_until=10.0)
    assert pool.num_free == 8 and pool.num_pinned == 3
    others = pool.allocate(5)  # every unpinned block first
    assert not set(others) & set(pinned)
    assert all(pool.lookup(f"h{i}".encode()) == i for i in pinned)
    assert pool.allocate(1)[0] == pinned[0] and pool.lookup(f"h{pinned[0]}".encode()) is None  # then the pins


def test_a_pin_that_ends_makes_its_blocks_the_first_to_go():
    clock = Clock()
    pool = BlockPool(6, enable_caching=True, clock=clock)
    pinned = cached_blocks(pool, 2)
    plain = cached_blocks(pool, 2)
    pool.release(plain)
    pool.release(pinned, pin_until=5.0)
    clock.now = 5.0
    assert pool.num_pinned == 0
    assert pool.allocate(2) == pinned[::-1]  # ahead of the never-used and the plainly freed blocks


def test_at_most_the_cap_is_pinned_and_a_plain_release_pins_nothing():
    pool = BlockPool(10, enable_caching=True, clock=Clock())
    ids = cached_blocks(pool, 8)
    pool.release(ids[:2])
    assert pool.num_pinned == 0
    pool.release(ids[2:], pin_until=10.0)
    assert pool.num_pinned == int(PIN_CAP * 10) == 5 and pool.num_free == 10
    uncached = pool.allocate(1)  # a block without a hash (a partial tail) is not worth a pin
    pool.release(uncached, pin_until=10.0)
    assert pool.num_pinned == 5


def test_a_prefix_hit_takes_a_pinned_block_back():
    pool = BlockPool(4, enable_caching=True, clock=Clock())
    [block] = cached_blocks(pool, 1)
    pool.release([block], pin_until=10.0)
    pool.share([block])
    assert pool.num_pinned == 0 and pool.num_free == 3 and pool.ref_count(block) == 1
    pool.release([block])
    assert pool.num_free == 4 and pool.reset_cache() and pool.lookup(b"h0") is None


def test_resetting_the_cache_unpins():
    pool = BlockPool(4, enable_caching=True, clock=Clock())
    pool.release(cached_blocks(pool, 2), pin_until=10.0)
    assert pool.reset_cache() and pool.num_pinned == 0 and pool.num_free == 4


def test_pins_end_each_at_its_own_time_in_any_order():
    clock = Clock()
    pool = BlockPool(8, enable_caching=True, clock=clock)
    late, early = cached_blocks(pool, 1), cached_blocks(pool, 1)
    pool.release(late, pin_until=10.0)
    pool.release(early, pin_until=5.0)
    clock.now = 7.0
    assert pool.num_pinned == 1
    clock.now = 10.0
    assert pool.num_pinned == 0 and pool.num_free == 8
