-- How did each level-0 token's share of users move between two days? (hard assignment: rank 1)
-- Parameters: ds (the new day), prev_ds (the day to compare with).
WITH shares AS (
  SELECT ds, token, COUNT(*) / SUM(COUNT(*)) OVER (PARTITION BY ds) AS share
  FROM bom_tokens
  WHERE entity_type = 'user' AND bom_level = 0 AND rank = 1 AND ds IN (CAST(:ds AS DATE), CAST(:prev_ds AS DATE))
  GROUP BY ds, token
)
SELECT COALESCE(n.token, o.token) AS token,
       ROUND(COALESCE(o.share, 0), 4) AS prev_share,
       ROUND(COALESCE(n.share, 0), 4) AS share,
       ROUND(COALESCE(n.share, 0) - COALESCE(o.share, 0), 4) AS drift
FROM (SELECT * FROM shares WHERE ds = CAST(:ds AS DATE)) n
FULL OUTER JOIN (SELECT * FROM shares WHERE ds = CAST(:prev_ds AS DATE)) o ON n.token = o.token
ORDER BY ABS(drift) DESC, token
