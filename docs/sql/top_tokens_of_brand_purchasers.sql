-- Which interests (level-0 Bag-of-Meaning tokens) do the purchasers of a brand share?
-- Parameters: brand (lower case, as in entities.brand), ds (the embedding day).
-- hir sql --warehouse warehouse/rees46 -f docs/sql/top_tokens_of_brand_purchasers.sql -p brand=samsung -p ds=2019-10-01
WITH purchasers AS (
  SELECT DISTINCT e.source, e.user_id
  FROM events e
  JOIN (SELECT DISTINCT source, entity_id FROM entities WHERE brand = :brand) b
    ON b.source = e.source AND b.entity_id = e.item_id
  WHERE e.funnel_stage = 'purchase' AND e.ds <= CAST(:ds AS DATE)
)
SELECT t.token, v.label, COUNT(DISTINCT t.node_id) AS purchasers, ROUND(SUM(t.weight), 3) AS total_weight
FROM bom_tokens t
JOIN purchasers p ON p.user_id = t.raw_id
JOIN bom_vocab v ON v.token = t.token AND v.ds = t.ds
WHERE t.entity_type = 'user' AND t.bom_level = 0 AND t.ds = CAST(:ds AS DATE)
GROUP BY t.token, v.label
ORDER BY purchasers DESC, total_weight DESC, t.token
LIMIT 10
