from __future__ import annotations

import math

import pytest
import torch

from hir_model.quantiser import (
    LEGACY_TEMPERATURE,
    ResidualQuantiser,
    calibrated_temperature,
    code_alignment,
    code_entropy,
    code_usage,
    collision_rate,
    continue_codebooks,
    kmeans,
    purity,
    quantiser_report,
)


def gaussian_clusters(num_clusters: int = 8, per_cluster: int = 40, dim: int = 16, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    centres = torch.randn(num_clusters, dim, generator=generator) * 5.0
    labels = torch.arange(num_clusters).repeat_interleave(per_cluster)
    points = centres[labels] + 0.1 * torch.randn(len(labels), dim, generator=generator)
    return points, labels


def test_level_zero_recovers_well_separated_clusters() -> None:
    points, labels = gaussian_clusters()
    quantiser = ResidualQuantiser(levels=2, codes_per_level=8, seed=0).fit(points)
    codes = quantiser.encode(points)
    assert codes.shape == (len(points), 2)
    assert purity(codes[:, 0], labels) == pytest.approx(1.0)
    assert code_usage(codes, 8)[0] == pytest.approx(1.0)
    nats, normalised = code_entropy(codes, 8)[0]
    assert nats == pytest.approx(math.log(8), abs=1e-6) and normalised == pytest.approx(1.0)


def test_collision_rate_counts_entities_sharing_a_full_path() -> None:
    assert collision_rate(torch.tensor([[0, 1], [0, 2], [1, 1]])) == 0.0
    assert collision_rate(torch.tensor([[0, 1], [0, 1], [1, 1], [2, 2]])) == pytest.approx(0.5)
    # Points built as parent centre + one of 4 shared offsets: 4 x 4 codes give each of the 16 points its own path.
    generator = torch.Generator().manual_seed(0)
    parents, offsets = torch.randn(4, 8, generator=generator) * 10.0, torch.randn(4, 8, generator=generator)
    points = (parents[:, None, :] + offsets[None, :, :]).reshape(16, 8) + 0.01 * torch.randn(
        16, 8, generator=generator
    )
    codes = ResidualQuantiser(levels=2, codes_per_level=4, seed=0).fit(points).encode(points)
    assert collision_rate(codes) == 0.0
    assert collision_rate(codes[:, :1]) == 1.0, "level 0 alone puts 4 points on every path"
    report = quantiser_report(codes, 4)
    assert report["collision_rate"] == 0.0 and len(report["usage"]) == 2


def test_purity_against_labels_the_codes_ignore() -> None:
    codes = torch.tensor([0, 0, 1, 1])
    assert purity(codes, torch.tensor([5, 5, 6, 6])) == 1.0
    assert purity(codes, torch.tensor([5, 6, 5, 6])) == 0.5


def test_bag_weights_sum_to_one_per_level_and_rank_the_hard_code_first() -> None:
    points, _ = gaussian_clusters(dim=8)
    quantiser = ResidualQuantiser(levels=3, codes_per_level=8, seed=1).fit(points)
    codes, weights = quantiser.bag(points, top_n=3, temperature=0.5)
    assert codes.shape == weights.shape == (len(points), 3, 3)
    torch.testing.assert_close(weights.sum(dim=2), torch.ones(len(points), 3))
    assert (weights[:, :, :-1] >= weights[:, :, 1:]).all(), "weights are ranked strongest first"
    assert torch.equal(codes[:, :, 0], quantiser.encode(points))


def test_residual_levels_reduce_reconstruction_error() -> None:
    points, _ = gaussian_clusters(num_clusters=6, per_cluster=30, dim=8, seed=2)
    one = ResidualQuantiser(levels=1, codes_per_level=4, seed=0).fit(points)
    three = ResidualQuantiser(levels=3, codes_per_level=4, seed=0).fit(points)
    error_one = (one.reconstruct(one.encode(points)) - points).pow(2).sum(1).mean()
    error_three = (three.reconstruct(three.encode(points)) - points).pow(2).sum(1).mean()
    assert error_three < 0.5 * error_one


def test_fit_is_deterministic_and_round_trips_weights_only(tmp_path) -> None:
    points, _ = gaussian_clusters(dim=8)
    first = ResidualQuantiser(levels=2, codes_per_level=8, seed=3).fit(points)
    second = ResidualQuantiser(levels=2, codes_per_level=8, seed=3).fit(points)
    assert torch.equal(first.codebooks, second.codebooks)
    first.save(tmp_path / "quantiser.pt")
    loaded = ResidualQuantiser.load(tmp_path / "quantiser.pt")  # torch.load(weights_only=True) inside
    assert torch.equal(loaded.encode(points), first.encode(points))


def test_too_few_points_and_unfitted_use_are_refused() -> None:
    with pytest.raises(ValueError, match="N >= codes_per_level=8"):
        ResidualQuantiser(codes_per_level=8).fit(torch.randn(5, 3))
    with pytest.raises(RuntimeError, match="not fitted"):
        ResidualQuantiser().encode(torch.randn(5, 3))


def test_calibrated_temperature_makes_the_median_point_weigh_its_code_e_times_its_runner_up() -> None:
    """Hand check on one level: four centroids on a line, the temperature is the median nearest-gap, and the
    bag weights follow from it; a point on its centroid is far firmer than one halfway between two codes."""
    centroids = torch.tensor([[0.0], [1.0], [2.0], [3.0]])
    points = torch.tensor([[0.0], [0.1], [0.5], [1.2], [2.9]])
    # squared distances to nearest / second nearest: (0, 1), (0.01, 0.81), (0.25, 0.25), (0.04, 0.64), (0.01, 0.81)
    gaps = sorted([1.0, 0.80, 0.0, 0.60, 0.80])
    assert calibrated_temperature(points, centroids) == pytest.approx(gaps[2])
    quantiser = ResidualQuantiser(levels=1, codes_per_level=4, seed=0)
    quantiser.codebooks = centroids[None]
    quantiser.temperatures = torch.tensor([0.8])
    _, weights = quantiser.bag(points, top_n=2)
    firm, halfway = weights[0, 0], weights[2, 0]
    assert float(firm[0] / firm[1]) == pytest.approx(float(torch.exp(torch.tensor(1.0 / 0.8))), rel=1e-5)
    assert float(halfway[0]) == pytest.approx(0.5, abs=1e-6)
    # A fixed temperature overrides the calibrated one; a quantiser saved without temperatures keeps 0.1.
    _, fixed = quantiser.bag(points, top_n=2, temperature=0.1)
    assert float(fixed[0, 0, 0]) > float(firm[0])
    state = quantiser.state_dict()
    assert torch.equal(ResidualQuantiser.from_state_dict(state).temperatures, torch.tensor([0.8]))
    legacy = ResidualQuantiser.from_state_dict({k: v for k, v in state.items() if k != "temperatures"})
    assert legacy.level_temperatures() == [LEGACY_TEMPERATURE]


def test_fitted_bags_spread_their_weights_instead_of_splitting_evenly() -> None:
    """On clustered unit vectors, the calibrated bags give the hard code a clear majority at level 0 (a fixed
    0.1 split near evenly in a run on real embeddings: 0.345 / 0.333 / 0.322)."""
    points, _ = gaussian_clusters(dim=8)
    points = torch.nn.functional.normalize(points, dim=1)
    quantiser = ResidualQuantiser(levels=2, codes_per_level=8, seed=0).fit(points)
    assert quantiser.temperatures is not None and (quantiser.temperatures > 0).all()
    _, weights = quantiser.bag(points, top_n=3)
    assert float(weights[:, 0, 0].median()) > 0.5


def test_renamed_codes_change_ids_only_not_assignments_or_weights() -> None:
    points, _ = gaussian_clusters(num_clusters=6, per_cluster=20, dim=8, seed=2)
    quantiser = ResidualQuantiser(levels=2, codes_per_level=6, seed=0).fit(points)
    perms = [torch.tensor([3, 0, 5, 1, 4, 2]), torch.tensor([1, 0, 2, 3, 5, 4])]
    renamed = quantiser.permuted(perms)
    codes, weights = quantiser.bag(points, top_n=2)
    new_codes, new_weights = renamed.bag(points, top_n=2)
    for level in range(2):
        assert torch.equal(new_codes[:, level], perms[level][codes[:, level]])
    torch.testing.assert_close(new_weights, weights)
    torch.testing.assert_close(renamed.reconstruct(new_codes[:, :, 0]), quantiser.reconstruct(codes[:, :, 0]))
    with pytest.raises(ValueError, match="not a permutation"):
        quantiser.permuted([torch.tensor([0, 0, 1, 2, 3, 4]), perms[1]])


def test_alignment_gives_each_code_the_old_id_it_shares_most_members_with() -> None:
    # Yesterday: entities 0-3 in code 2, 4-7 in code 0, 8-9 in code 1. Today the same groups came out as codes
    # 0, 1 and 2, and entity 3 moved to the third group: the matching renames 0->2, 1->0, 2->1.
    old = torch.tensor([2, 2, 2, 2, 0, 0, 0, 0, 1, 1])
    new = torch.tensor([0, 0, 0, 2, 1, 1, 1, 1, 2, 2])
    perm = code_alignment(new, old, 3)
    assert perm.tolist() == [2, 0, 1]
    assert float((perm[new] == old).double().mean()) == pytest.approx(0.9)
    # A code no old member shares takes the id left over; an old id beyond today's codebook is never given.
    perm = code_alignment(torch.tensor([0, 0, 1]), torch.tensor([7, 7, 0]), 3)
    assert sorted(perm.tolist()) == [0, 1, 2] and perm[1] == 0


def test_fit_seeded_with_yesterdays_codebooks_keeps_code_ids() -> None:
    points, labels = gaussian_clusters(num_clusters=8, per_cluster=30, dim=8, seed=4)
    yesterday = ResidualQuantiser(levels=2, codes_per_level=8, seed=0).fit(points)
    moved = points + 0.05 * torch.randn(points.shape, generator=torch.Generator().manual_seed(9))
    # Another seed picks other k-means++ seeds, so the same clusters get other ids unless the fit starts from
    # yesterday's codebooks.
    cold = ResidualQuantiser(levels=2, codes_per_level=8, seed=5).fit(moved)
    warm = ResidualQuantiser(levels=2, codes_per_level=8, seed=5).fit(moved, init=yesterday)
    before = yesterday.encode(points)[:, 0]
    assert torch.equal(warm.encode(moved)[:, 0], before)
    assert not torch.equal(cold.encode(moved)[:, 0], before)
    with pytest.raises(ValueError, match="init codebooks"):
        ResidualQuantiser(levels=2, codes_per_level=4, seed=5).fit(moved, init=yesterday)


def test_yesterdays_codebooks_are_kept_while_they_fit_anchored_when_the_data_moved_and_refitted_past_that() -> (
    None
):
    points, _ = gaussian_clusters(num_clusters=8, per_cluster=30, dim=8, seed=4)
    yesterday = ResidualQuantiser(levels=2, codes_per_level=8, seed=0).fit(points)
    jitter = 0.05 * torch.randn(points.shape, generator=torch.Generator().manual_seed(9))
    steady = points + jitter
    kept, report = continue_codebooks(yesterday, steady, steady, tolerance=1.25)
    assert kept is yesterday and report["codebooks"] == "kept" and 0.5 < report["kept_error_ratio"] <= 1.25
    # Half the entities jump far away: yesterday's centroids no longer describe them.
    moved = steady.clone()
    moved[: len(moved) // 2] += 20.0
    by_hand = (
        (
            (
                moved
                - yesterday.codebooks[0][yesterday.encode(moved)[:, 0]]
                - yesterday.codebooks[1][yesterday.encode(moved)[:, 1]]
            )
            ** 2
        )
        .sum(dim=1)
        .mean()
    )
    assert yesterday.reconstruction_error(moved) == pytest.approx(float(by_hand), rel=1e-5)
    plain = ResidualQuantiser(levels=2, codes_per_level=8, seed=0).fit(moved, init=yesterday)
    refit_error = plain.reconstruction_error(moved)
    # Any tolerance below yesterday's ratio refuses the kept codebooks; a loose one takes an anchored refit,
    # whose error sits between the plain refit's and yesterday's, and a tight one the plain refit itself.
    _, report = continue_codebooks(yesterday, moved, moved, tolerance=1.0)
    assert report["codebooks"] == "refitted" and report["error_ratio"] == 1.0
    kept_ratio = report["kept_error_ratio"]
    assert kept_ratio == pytest.approx(float(by_hand) / refit_error, rel=1e-5) and kept_ratio > 1.25
    loose = 1.0 + 0.9 * (kept_ratio - 1.0)
    anchored, report = continue_codebooks(yesterday, moved, moved, tolerance=loose)
    assert report["codebooks"] == "anchored" and report["anchor_pull"] > 0
    assert 1.0 <= report["error_ratio"] <= loose
    assert report["error_ratio"] == pytest.approx(
        anchored.reconstruction_error(moved) / refit_error, rel=1e-5
    )
    with pytest.raises(ValueError, match="tolerance must be >= 1"):
        continue_codebooks(yesterday, moved, moved, tolerance=0.5)
    with pytest.raises(ValueError, match="embeddings' dimension"):
        continue_codebooks(yesterday, moved[:, :4], moved[:, :4], 1.25)


def test_an_anchored_centroid_is_the_mean_of_its_members_and_its_prior() -> None:
    # One code on the line: members at 1 and 3 (mean 2), yesterday's centroid at 0. With a pull of 2 points the
    # centroid is (1 + 3 + 2 * 0) / (2 + 2) = 1; with none it is the members' mean, 2.
    points = torch.tensor([[1.0], [3.0]])
    init = torch.tensor([[0.0]])
    generator = torch.Generator().manual_seed(0)
    anchored, _ = kmeans(points, 1, 10, generator, init=init, pull=2.0)
    plain, _ = kmeans(points, 1, 10, generator, init=init)
    assert float(anchored[0, 0]) == pytest.approx(1.0) and float(plain[0, 0]) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="needs init"):
        kmeans(points, 1, 10, generator, pull=2.0)


def line_quantiser() -> ResidualQuantiser:
    """Two levels of two codes on the x axis, temperature 1: level 0 at x = -1 and x = +1, level 1 at 0 and 1.1."""
    quantiser = ResidualQuantiser(levels=2, codes_per_level=2)
    quantiser.codebooks = torch.tensor([[[-1.0, 0.0], [1.0, 0.0]], [[0.0, 0.0], [1.1, 0.0]]])
    quantiser.temperatures = torch.tensor([1.0, 1.0])
    return quantiser


def test_sticky_codes_keep_yesterdays_code_within_the_margin_and_the_path_follows_it() -> None:
    quantiser = line_quantiser()
    # x = 0.1: squared distances 1.21 to code 0 and 0.81 to code 1, a gap of 0.4; x = 0.5: 2.25 and 0.25, gap 2.
    points = torch.tensor([[0.1, 0.0], [0.1, 0.0], [0.5, 0.0], [0.1, 0.0]])
    yesterday = torch.tensor([[0, 1], [0, 1], [0, 1], [-1, -1]])
    plain, _ = quantiser.bag(points, top_n=2)
    assert plain[:, 0, 0].tolist() == [1, 1, 1, 1]
    codes, weights = quantiser.bag(points, top_n=2, previous=yesterday, stickiness=0.5)
    # Kept where the gap (0.4) is within 0.5 temperatures; not at x = 0.5 (gap 2) nor without a code yesterday.
    assert codes[:, 0, 0].tolist() == [0, 0, 1, 1]
    assert codes[:, 0, 1].tolist() == [1, 1, 0, 0]
    # The weights stay the plain affinities: the kept code 0 weighs sigmoid(-0.4) = 0.4013 against code 1.
    assert weights[0, 0].tolist() == pytest.approx(
        [1 / (1 + math.exp(0.4)), 1 / (1 + math.exp(-0.4))], abs=1e-5
    )
    # Level 1 quantises what the kept code left: 0.1 - (-1) = 1.1 sits on level-1 code 1, where the plain path's
    # residual 0.1 - 1 = -0.9 sits nearest code 0.
    assert plain[0, 1, 0].item() == 0 and codes[0, 1, 0].item() == 1
    narrow, _ = quantiser.bag(points, top_n=2, previous=yesterday, stickiness=0.3)
    assert narrow[:, 0, 0].tolist() == [1, 1, 1, 1]
    with pytest.raises(ValueError, match="previous codes have 3 rows"):
        quantiser.bag(points, previous=yesterday[:3], stickiness=0.5)
