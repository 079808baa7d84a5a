"""The torch.distributed backend "gradstream" in real processes: every collective and dtype
exact (reduce and all-to-all among them), point-to-point messages, async work completing by
itself, more groups, clear errors, a dead rank."""
import pytest


@pytest.mark.parametrize("n", [2, 3])
def test_every_collective_and_dtype_is_exact(ranks, n):
    out = ranks(n, "collectives").check()
    assert out.results[0]["checked"] > 50


@pytest.mark.parametrize("shm", ["1", "0"])
def test_async_work_completes_without_wait_and_groups_are_separate(ranks, shm):
    out = ranks(3, "asynchronous", env={"GS_SHM": shm}).check()
    assert out.results[0]["order"] == list(range(6))


@pytest.mark.parametrize("n", [2, 3])
def test_reduce_all_to_all_and_barrier_are_exact(ranks, n):
    out = ranks(n, "rooted_and_alltoall").check()
    assert out.results[0]["checked"] == 7 * n * 3


@pytest.mark.parametrize("n, shm", [(2, "1"), (3, "1"), (3, "0")])
def test_point_to_point_is_exact_in_order_and_does_not_deadlock(ranks, n, shm):
    out = ranks(n, "p2p", env={"GS_SHM": shm}).check()
    for r, res in enumerate(out.results):
        assert res["checked"] >= 2 * (n - 1) + 12, (r, res)


def test_point_to_point_floats_go_through_the_codec(ranks):
    out = ranks(2, "p2p_codec", env={"GS_CODEC": "bf16"}).check()
    assert all(0 < res["max_rel_error"] <= 2 ** -8 for res in out.results), out.results


@pytest.mark.parametrize("n", [2, 3])
def test_a_count_mismatch_raises_on_both_ranks(ranks, n):
    out = ranks(n, "p2p_mismatch", timeout=90, env={"GS_TEST_PG_TIMEOUT": "20"}).check()
    for r in (0, 1):
        res = out.results[r]
        assert "1000" in res["message"] and "1001" in res["message"], res["message"]
        assert res["elapsed"] < 20, res
    assert all(res["destroy"] < 15 for res in out.results), out.results


def test_a_communicator_splits_into_halves(ranks):
    out = ranks(3, "comm_split").check()
    assert [r["size"] for r in out.results] == [2, 1, 2]


def test_bad_input_raises_a_clear_error(ranks):
    ranks(2, "bad_input").check()


def test_a_dead_rank_raises_in_the_others_within_the_timeout(ranks):
    out = ranks(3, "dead_rank", timeout=90, env={"GS_TEST_PG_TIMEOUT": "20"})
    assert out.codes[2] == 3, out.outputs[2][-2000:]
    for r in (0, 1):
        assert out.codes[r] == 0, out.outputs[r][-4000:]
        res = out.results[r]
        assert res["elapsed"] < 20, res
        assert res["destroy"] < 15, res
        assert "rank 2" in res["message"], res["message"]


@pytest.mark.parametrize("n, shm", [(1, "1"), (2, "1"), (3, "1"), (4, "0")])
def test_gather_and_scatter_move_only_the_roots_blocks(ranks, n, shm):
    out = ranks(n, "gather_scatter", env={"GS_SHM": shm}).check()
    for r, res in enumerate(out.results):
        assert res["checked"] == 4 * n + 7 + (1 if r == 0 else 0), (r, res)
