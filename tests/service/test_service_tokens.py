"""The token store's digest cache: it saves hashing, never decides. A rotated token fails
from the moment it is rotated, whether or not its digest was cached, and random tokens
leave the cache at its bound."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bursar.broker.service.auth import DIGEST_CACHE_SIZE, DigestCache, TokenStore, digest
from bursar.broker.service.errors import Unauthenticated

ADMIN = "admin-token-0123456789"


def test_a_rotated_token_fails_at_once_though_its_digest_was_cached(tmp_path: Path) -> None:
    store = TokenStore(tmp_path, ADMIN)
    try:
        old = store.issue("sci", 1.0)
        for _ in range(3):  # cached from the first call on
            assert store.authenticate(old).campaign == "sci"
        new = store.rotate("sci", 2.0)
        with pytest.raises(Unauthenticated):
            store.authenticate(old)
        assert store.authenticate(new).campaign == "sci"
        assert store.authenticate(ADMIN).admin
        # Issuing again (as a campaign's re-creation does) retires the rotated token too.
        newer = store.issue("sci", 3.0)
        with pytest.raises(Unauthenticated):
            store.authenticate(new)
        assert store.authenticate(newer).campaign == "sci"
    finally:
        store.close()


def test_random_tokens_are_refused_and_the_cache_stays_bounded(tmp_path: Path) -> None:
    store = TokenStore(tmp_path, ADMIN)
    try:
        good = store.issue("sci", 1.0)
        for i in range(DIGEST_CACHE_SIZE + 50):
            with pytest.raises(Unauthenticated):
                store.authenticate(f"bsr_random{i}")
        assert len(store.digest) == DIGEST_CACHE_SIZE
        assert store.authenticate(good).campaign == "sci"  # evicted or not, still valid
    finally:
        store.close()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=20), max_size=60), st.integers(1, 8))
def test_cached_digests_are_the_digests(tokens: list[str], size: int) -> None:
    cache = DigestCache(size)
    for t in tokens:
        assert cache(t) == digest(t)
        assert len(cache) <= size
