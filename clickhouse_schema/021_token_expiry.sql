-- When a token stops being valid (NULL: never). `loom token mint --expires-in 30d` sets
-- it; an expired token is refused like a revoked one (401), before any body is read.
ALTER TABLE tokens {on_cluster} ADD COLUMN IF NOT EXISTS expires_at Nullable(DateTime64(3, 'UTC')) DEFAULT NULL;
