-- Users whose bag contains a token (any rank), strongest first: an audience for that interest.
-- Parameters: token (e.g. L0:12), ds.
SELECT raw_id AS user_id, rank, ROUND(CAST(weight AS DOUBLE), 4) AS weight, path
FROM bom_tokens
WHERE entity_type = 'user' AND token = :token AND ds = CAST(:ds AS DATE)
ORDER BY weight DESC, user_id
