-- What does a token mean? Its label, parent, size, and its most typical members (strongest weights first).
-- Parameters: token, ds.
SELECT v.token, v.label, v.parent_token, v.size, t.entity_type, t.raw_id, ROUND(CAST(t.weight AS DOUBLE), 4) AS weight
FROM bom_vocab v
JOIN bom_tokens t ON t.token = v.token AND t.ds = v.ds AND t.rank = 1
WHERE v.token = :token AND v.ds = CAST(:ds AS DATE)
ORDER BY t.weight DESC, t.raw_id
LIMIT 20
