from __future__ import annotations

import dataclasses

import torch

from hir_model.batch import ContentTable, TokenBatch, batch_from_columns
from hir_model.config import ModelConfig
from hir_model.encoder import HIREncoder, hash_node_ids
from hir_model.synthetic import random_tree_batch
from schemas.codes import EDGE_TYPES, NODE_TYPES


def test_output_is_one_unit_vector_per_target(tiny_config: ModelConfig) -> None:
    batch = random_tree_batch(5, 16, seed=0)
    embedding = HIREncoder(tiny_config)(batch)
    assert embedding.shape == (5, tiny_config.dim)
    torch.testing.assert_close(embedding.norm(dim=1), torch.ones(5))


def test_id_hash_is_deterministic_spread_and_type_aware() -> None:
    ids = torch.arange(1, 20_001, dtype=torch.long) * 7919  # 20k distinct ids
    types = torch.full_like(ids, 2)
    first, second = hash_node_ids(ids, types, 2**18, salt=0), hash_node_ids(ids, types, 2**18, salt=1)
    assert torch.equal(first, hash_node_ids(ids, types, 2**18, salt=0))
    assert first.min() >= 0 and first.max() < 2**18
    # One hash: birthday collisions are expected (~2.8% of ids at 20k / 262k); both hashes together almost never.
    single = 1 - first.unique().numel() / ids.numel()
    both = 1 - torch.unique(first * 2**18 + second).numel() / ids.numel()
    assert single < 0.05 and both < 1e-3
    other_type = hash_node_ids(ids, torch.full_like(ids, 1), 2**18, salt=0)
    assert (other_type == first).float().mean() < 0.01, "the same raw id of another node type must hash apart"
    negative = hash_node_ids(torch.tensor([-(2**63), -1]), torch.tensor([1, 1]), 1000)
    assert negative.min() >= 0 and negative.max() < 1000


def test_padding_and_its_length_do_not_change_embeddings(tiny_config: ModelConfig) -> None:
    encoder = HIREncoder(tiny_config).eval()
    batch = random_tree_batch(4, 10, seed=1)
    longer = batch_padded_to(batch, 16)
    junk = longer.replace(node_id=torch.where(longer.is_real, longer.node_id, 12345))
    junk = junk.replace(recency=torch.where(junk.is_real, junk.recency, 7))
    with torch.no_grad():
        reference = encoder(batch)
        torch.testing.assert_close(encoder(longer), reference, atol=1e-6, rtol=0)
        torch.testing.assert_close(encoder(junk), reference, atol=1e-6, rtol=0)


def batch_padded_to(batch, max_tokens: int):
    extra = max_tokens - batch.max_tokens
    pads = {
        "node_id": 0,
        "node_type": 0,
        "edge_type": 0,
        "hop": 0,
        "parent_pos": -1,
        "recency": 0,
        "weight": 0.0,
    }
    fields = {k: torch.nn.functional.pad(getattr(batch, k), (0, extra), value=v) for k, v in pads.items()}
    fields["is_deep"] = torch.nn.functional.pad(batch.is_deep, (0, extra), value=False)
    return batch.replace(**fields)


def test_one_layer_encoder_target_sees_all_but_leaves_see_only_their_branch(tiny_config: ModelConfig) -> None:
    config = dataclasses.replace(tiny_config, layers=1)
    encoder = HIREncoder(config).eval()
    batch = random_tree_batch(1, 16, seed=2, min_tokens=16)
    hop2 = (batch.hop[0] == 2).nonzero().flatten().tolist()
    cousin, leaf = next(
        (a, b) for a in hop2 for b in hop2 if batch.parent_pos[0, a] != batch.parent_pos[0, b]
    )
    changed = batch.replace(node_id=batch.node_id.clone())
    changed.node_id[0, cousin] += 1
    with torch.no_grad():
        before, after = encoder.encode_tokens(batch), encoder.encode_tokens(changed)
    torch.testing.assert_close(after[0, leaf], before[0, leaf], atol=1e-6, rtol=0)
    assert (after[0, 0] - before[0, 0]).abs().max() > 1e-4


def test_ablation_switches_change_the_model(tiny_config: ModelConfig) -> None:
    batch = random_tree_batch(4, 16, seed=3, min_tokens=8)
    torch.manual_seed(0)
    full = HIREncoder(tiny_config).eval()
    for block in full.blocks:
        torch.nn.init.normal_(block.attn.edge_hop_bias)
    flat = HIREncoder(dataclasses.replace(tiny_config, use_hierarchy_mask=False)).eval()
    no_bias = HIREncoder(dataclasses.replace(tiny_config, use_attention_bias=False)).eval()
    flat.load_state_dict(full.state_dict())
    no_bias.load_state_dict(full.state_dict())
    with torch.no_grad():
        reference = full(batch)
        assert (flat(batch) - reference).abs().max() > 1e-4
        assert (no_bias(batch) - reference).abs().max() > 1e-4
    assert HIREncoder(dataclasses.replace(tiny_config, use_content=False)).features.content_proj is None


def test_content_counts_only_where_a_token_has_it(tiny_config: ModelConfig) -> None:
    encoder = HIREncoder(tiny_config).eval()
    batch = random_tree_batch(3, 16, seed=4)
    target_ids = batch.node_id[:, 0].numpy()
    table = ContentTable(target_ids[:1], torch.randn(1, tiny_config.content_dim).numpy())
    with_content = table.attach(batch)
    with torch.no_grad():
        plain, enriched = encoder(batch), encoder(with_content)
    assert (enriched[0] - plain[0]).abs().max() > 1e-4
    torch.testing.assert_close(enriched[1:], plain[1:], atol=1e-6, rtol=0)


def _rows(rows: list[list[tuple[int, str, str, int, int]]]) -> TokenBatch:
    """A batch from rows of (node id, node type, edge type, hop, parent position) tokens, weight 1 each."""
    width = max(len(row) for row in rows)

    def column(field: int, pad, code=None):
        return [
            [code[token[field]] if code else token[field] for token in row] + [pad] * (width - len(row))
            for row in rows
        ]

    return batch_from_columns(
        {
            "token_node_id": column(0, 0),
            "token_node_type": column(1, 0, NODE_TYPES),
            "token_edge_type": column(2, 0, EDGE_TYPES),
            "token_hop": column(3, 0),
            "token_parent_pos": column(4, -1),
            "token_recency": [[0] * width for _ in rows],
            "token_weight": [[1.0] * width for _ in rows],
            "token_is_deep": [[False] * width for _ in rows],
            "num_tokens": [len(row) for row in rows],
        }
    )


def test_neighbourhood_bag_scores_the_nodes_two_rows_share(tiny_config: ModelConfig) -> None:
    # A user who viewed items 10 and 11; user 2 also viewed 10, and 11 is in category 100. Item 20 was viewed by
    # user 2 and is in category 100: co-visited and in the user's category, though the user never saw it. Item 21
    # shares nothing with the user's row. 256 dims: random id vectors are then nearly orthogonal.
    config = dataclasses.replace(tiny_config, dim=256, heads=4, id_buckets=2**16)
    user_row = [
        (1, "user", "self", 0, -1),
        (10, "item", "user_view_item", 1, 0),
        (11, "item", "user_view_item", 1, 0),
        (2, "user", "item_viewed_by_user", 2, 1),
        (100, "category", "item_in_category", 2, 2),
    ]

    def item_row(item: int, user: int, category: int) -> list:
        return [
            (item, "item", "self", 0, -1),
            (user, "user", "item_viewed_by_user", 1, 0),
            (category, "category", "item_in_category", 1, 0),
            (item + 10, "item", "user_view_item", 2, 1),
        ]

    batch = _rows([user_row, item_row(20, 2, 100), item_row(21, 3, 101), item_row(10, 1, 100)])
    torch.manual_seed(0)
    encoder = HIREncoder(config).eval()
    items_only = HIREncoder(dataclasses.replace(config, bag_scope="items")).eval()
    items_only.load_state_dict(encoder.state_dict(), strict=False)
    with torch.no_grad():
        encoder.bag_slot_scale.copy_((encoder.bag_slot_scale != 0).float())  # every slot at weight 1
        bag = encoder.neighbourhood_bag(batch)
        scores = bag[1:] @ bag[0]
        items_bag = items_only.item_bag(batch)
        item_scores = items_bag[1:] @ items_bag[0]
    shared, unrelated, repeat = scores.tolist()
    assert shared > 0.5 * repeat > 0 and abs(unrelated) < 0.1 * shared, scores
    # The items-only bag sees the repeat and nothing else: the co-visited item scores as the unrelated one.
    assert abs(item_scores[0] - item_scores[1]) < 0.1 * (item_scores[2] - item_scores[0]), item_scores


def test_configs_written_before_the_bag_scope_have_the_items_bag(tiny_config: ModelConfig) -> None:
    legacy = {k: v for k, v in tiny_config.to_dict().items() if k != "bag_scope"}
    assert ModelConfig.from_dict(legacy).bag_scope == "items"
    assert ModelConfig.from_dict(tiny_config.to_dict()).bag_scope == "neighbourhood"
    assert HIREncoder(ModelConfig.from_dict(legacy)).bag_slot_scale is None
