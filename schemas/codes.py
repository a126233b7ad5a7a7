"""Small integer codes shared by the Spark jobs and the PyTorch model.

The neighbourhood table stores node and edge types as ints so that the model can embed them directly; these
dictionaries are the single source of truth for both sides. Code 0 is reserved for padding everywhere.
"""

from __future__ import annotations

# Canonical funnel stages. 'favourite' counts as upper funnel: it is plentiful and precedes conversion, and the
# student view of the model must see it (DESIGN.md: deep funnel = cart, purchase).
FUNNEL_STAGES: tuple[str, ...] = ("view", "favourite", "cart", "purchase")
FUNNEL_DEPTH: dict[str, str] = {"view": "upper", "favourite": "upper", "cart": "deep", "purchase": "deep"}
# Events that are real but carry no positive interest (REES46's remove_from_cart). They are kept in `events`
# with this stage so nothing is lost, and the graph ignores them.
NON_FUNNEL_STAGE = "removal"
ALL_STAGES: tuple[str, ...] = FUNNEL_STAGES + (NON_FUNNEL_STAGE,)
# A purchase outweighs a cart outweighs a favourite outweighs a view (the graph's edge weights and the baselines' histories); the same scale as hir_model.synthetic, and
# mild enough that a browsing session (Taobao: ~40 views per purchase) still counts.
DEFAULT_STAGE_WEIGHTS: dict[str, float] = {"view": 1.0, "favourite": 2.0, "cart": 3.0, "purchase": 5.0}

PAD = 0

NODE_TYPES: dict[str, int] = {"user": 1, "item": 2, "advertiser": 3, "category": 4}

# Directed edge types. Every relation has its reverse so items, advertisers and categories get neighbourhoods.
EDGE_TYPES: dict[str, int] = {
    "self": 1,  # the target token itself
    "user_view_item": 2,
    "user_favourite_item": 3,
    "user_cart_item": 4,
    "user_purchase_item": 5,
    "item_viewed_by_user": 6,
    "item_favourited_by_user": 7,
    "item_carted_by_user": 8,
    "item_purchased_by_user": 9,
    "item_in_category": 10,
    "category_has_item": 11,
    "item_of_advertiser": 12,
    "advertiser_has_item": 13,
    "category_child_of": 14,
    "category_parent_of": 15,
}

# user->item edge type per funnel stage, and the reverse item->user edge type.
STAGE_EDGE: dict[str, tuple[str, str]] = {
    "view": ("user_view_item", "item_viewed_by_user"),
    "favourite": ("user_favourite_item", "item_favourited_by_user"),
    "cart": ("user_cart_item", "item_carted_by_user"),
    "purchase": ("user_purchase_item", "item_purchased_by_user"),
}

DEEP_EDGE_TYPES: frozenset[str] = frozenset(
    {"user_cart_item", "user_purchase_item", "item_carted_by_user", "item_purchased_by_user"}
)

NUM_NODE_TYPES = max(NODE_TYPES.values()) + 1
NUM_EDGE_TYPES = max(EDGE_TYPES.values()) + 1
