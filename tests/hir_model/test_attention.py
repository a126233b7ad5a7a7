from __future__ import annotations

import pytest
import torch

from hir_model.attention import HierarchicalAttention, build_layout, resolve_backend, tree_visibility
from hir_model.batch import TokenBatch
from hir_model.synthetic import random_tree_batch
from schemas.codes import NUM_EDGE_TYPES

DIM, HEADS, MAX_HOP, RECENCY = 16, 2, 2, 16


def make_attention(seed: int = 0, with_bias: bool = True) -> HierarchicalAttention:
    torch.manual_seed(seed)
    attention = HierarchicalAttention(
        DIM, HEADS, NUM_EDGE_TYPES, MAX_HOP, RECENCY, use_attention_bias=with_bias
    )
    with torch.no_grad():  # biases start at zero; give them values so they matter in the tests
        attention.edge_hop_bias.normal_(std=1.0)
        attention.recency_bias.normal_(std=1.0)
    return attention


def layout(batch: TokenBatch, backend: str = "sdpa", hierarchy: bool = True):
    return build_layout(batch, backend, hierarchy, NUM_EDGE_TYPES, MAX_HOP, RECENCY)


def small_tree() -> TokenBatch:
    """target 0; hop-1 tokens 1, 2; hop-2 tokens 3 (under 1) and 4 (under 2); positions 5, 6 padding."""
    return random_tree_batch(1, 7, seed=0).replace(
        hop=torch.tensor([[0, 1, 1, 2, 2, 0, 0]]),
        parent_pos=torch.tensor([[-1, 0, 0, 1, 2, -1, -1]]),
        node_type=torch.tensor([[1, 2, 2, 4, 4, 0, 0]]),
        num_tokens=torch.tensor([5]),
    )


def test_visibility_follows_the_tree() -> None:
    batch = small_tree()
    visible = tree_visibility(batch.parent_pos, batch.is_real)[0].int()
    expected = torch.tensor(
        [  # key:  0  1  2  3  4  5  6
            [1, 1, 1, 1, 1, 0, 0],  # target sees every real token
            [1, 1, 0, 1, 0, 0, 0],  # hop-1 token 1: itself, target (its parent), its child 3
            [1, 0, 1, 0, 1, 0, 0],
            [1, 1, 0, 1, 0, 0, 0],  # hop-2 token 3: itself, its parent 1, the target; not its cousin 4
            [1, 0, 1, 0, 1, 0, 0],
            [0, 0, 0, 0, 0, 1, 0],  # padding: only itself, so its softmax row is never empty
            [0, 0, 0, 0, 0, 0, 1],
        ]
    )
    assert torch.equal(visible, expected)
    flat = tree_visibility(batch.parent_pos, batch.is_real, use_hierarchy_mask=False)[0].int()
    assert flat[:5, :5].all() and not flat[:5, 5:].any() and not flat[5:, :5].any()


@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_a_token_ignores_what_it_cannot_see(backend: str) -> None:
    batch = small_tree()
    attention = make_attention()
    x = torch.randn(1, 7, DIM)
    perturbed = x.clone()
    perturbed[0, 4] += 10.0  # token 4 is outside token 3's view (a cousin)
    with torch.no_grad():
        out, out_perturbed = (
            attention(x, layout(batch, backend)),
            attention(perturbed, layout(batch, backend)),
        )
    torch.testing.assert_close(out_perturbed[0, [1, 3]], out[0, [1, 3]], atol=1e-6, rtol=0)
    assert (out_perturbed[0, 0] - out[0, 0]).abs().max() > 1e-3, "the target should see token 4"
    assert (out_perturbed[0, 2] - out[0, 2]).abs().max() > 1e-3, "token 2 should see its child 4"


def test_padding_never_influences_real_tokens() -> None:
    batch = random_tree_batch(4, 12, seed=3, min_tokens=2)
    attention = make_attention()
    x = torch.randn(4, 12, DIM)
    noisy = torch.where(batch.is_real[..., None], x, torch.randn_like(x) * 100)
    with torch.no_grad():
        out, out_noisy = attention(x, layout(batch)), attention(noisy, layout(batch))
    real = batch.is_real
    torch.testing.assert_close(out_noisy[real], out[real], atol=1e-5, rtol=0)
    assert torch.isfinite(out).all(), "padding rows must not produce NaN"


def test_biases_change_the_output_and_switching_them_off_removes_them() -> None:
    batch = random_tree_batch(4, 12, seed=4, min_tokens=4)
    x = torch.randn(4, 12, DIM)
    with_bias, without_bias = make_attention(seed=1), make_attention(seed=1, with_bias=False)
    with torch.no_grad():
        out_bias, out_plain = with_bias(x, layout(batch)), without_bias(x, layout(batch))
        with_bias.edge_hop_bias.zero_()
        with_bias.recency_bias.zero_()
        out_zeroed = with_bias(x, layout(batch))
    real = batch.is_real
    assert (out_bias[real] - out_plain[real]).abs().max() > 1e-2
    torch.testing.assert_close(out_zeroed, out_plain, atol=1e-6, rtol=0)
    assert without_bias.key_bias(layout(batch)) is None


def test_key_bias_is_looked_up_by_the_keys_edge_type_hop_and_recency() -> None:
    batch = random_tree_batch(2, 6, seed=5, min_tokens=6)
    attention = make_attention(seed=2)
    bias = attention.key_bias(layout(batch))  # (B, H, L)
    b, h, j = 1, 1, 3
    expected = (
        attention.edge_hop_bias[h, batch.edge_type[b, j], batch.hop[b, j]]
        + attention.recency_bias[h, batch.recency[b, j]]
    )
    assert bias.shape == (2, HEADS, 6)
    torch.testing.assert_close(bias[b, h, j], expected)


@pytest.mark.parametrize("hierarchy", [True, False])
def test_flex_and_sdpa_agree_on_random_trees_with_padding(hierarchy: bool) -> None:
    # fp32 on CPU: both compute softmax(QK^T/sqrt(d) + bias) V; observed differences are ~1e-7, tolerance 1e-5.
    batch = random_tree_batch(6, 40, seed=6)
    attention = make_attention(seed=3)
    x = torch.randn(6, 40, DIM)
    with torch.no_grad():
        sdpa = attention(x, layout(batch, "sdpa", hierarchy))
        flex = attention(x, layout(batch, "flex", hierarchy))
    real = batch.is_real
    torch.testing.assert_close(flex[real], sdpa[real], atol=1e-5, rtol=0)


def test_backend_is_chosen_by_device_unless_forced() -> None:
    assert resolve_backend("auto", "cpu") == "sdpa"
    assert resolve_backend("auto", "cuda") == "flex"
    assert resolve_backend("auto", torch.device("cuda", 0)) == "flex"
    assert resolve_backend("flex", "cpu") == "flex"
    assert resolve_backend("sdpa", "cuda") == "sdpa"
    with pytest.raises(ValueError, match="attention backend"):
        resolve_backend("dense", "cpu")


def test_flex_on_cpu_refuses_to_train_with_a_clear_message() -> None:
    batch = random_tree_batch(2, 8, seed=7)
    attention = make_attention()
    with pytest.raises(NotImplementedError, match="attention_backend='sdpa'"):
        attention(torch.randn(2, 8, DIM), layout(batch, "flex"))
