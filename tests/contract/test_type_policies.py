"""Per-type policies: stored whole, by type, the last write winning, and kept across a reopen."""

from __future__ import annotations

from tests.contract.conftest import OpenStore


async def test_policies_are_stored_by_type_and_the_last_write_wins(open_store: OpenStore) -> None:
    async with open_store() as store:
        assert await store.type_policies() == {}
        await store.put_type_policy("email.send", '{"max_attempts": 5}')
        await store.put_type_policy("report", '{"concurrency": 2}')
        await store.put_type_policy("email.send", '{"max_attempts": 7}')
        assert await store.type_policies() == {
            "email.send": '{"max_attempts": 7}',
            "report": '{"concurrency": 2}',
        }
    async with open_store() as again:  # the same storage: durable
        assert (await again.type_policies())["email.send"] == '{"max_attempts": 7}'


async def test_the_shard_count_is_not_a_policy(open_store: OpenStore) -> None:
    async with open_store(num_shards=8) as store:
        await store.put_type_policy("num_shards", '{"concurrency": 1}')  # a type of that name
        assert await store.type_policies() == {"num_shards": '{"concurrency": 1}'}
    async with open_store(num_shards=8) as again:  # the stored shard count still checks
        assert list(await again.type_policies()) == ["num_shards"]


async def test_type_settings_are_rows_of_their_own_beside_the_policy(
    open_store: OpenStore,
) -> None:
    async with open_store() as store:
        assert await store.type_settings("rate") == {}
        await store.put_type_policy("email.send", '{"max_attempts": 5}')
        await store.put_type_setting("email.send", "rate", '{"rate": 50, "burst": null}')
        await store.put_type_setting("email.send", "paused", "true")
        await store.put_type_setting("report", "paused", "true")
        await store.put_type_setting("report", "paused", "false")  # the last write wins
        await store.put_type_policy("email.send", '{"max_attempts": 6}')  # touches neither
        assert await store.type_settings("rate") == {"email.send": '{"rate": 50, "burst": null}'}
        assert await store.type_settings("paused") == {"email.send": "true", "report": "false"}
        assert await store.type_policies() == {"email.send": '{"max_attempts": 6}'}
    async with open_store() as again:  # durable
        assert (await again.type_settings("paused"))["email.send"] == "true"
