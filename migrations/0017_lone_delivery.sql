-- A delivery's opening in one statement: the closed steps among its forward commands'
-- step keys, read after their shared step-key locks are granted.
--
-- The read must see a compensation that committed while the lock was awaited, so it
-- cannot be part of the statement that waits (under READ COMMITTED a statement reads
-- one snapshot, taken when it starts). A VOLATILE SQL function takes a fresh snapshot
-- for each of its statements: called from the inbox insert's statement, it waits for
-- the locks in its first statement and reads in its second.
CREATE FUNCTION closed_steps_locked(keys text[], seed bigint) RETURNS SETOF text
LANGUAGE sql VOLATILE
BEGIN ATOMIC
    SELECT count(pg_advisory_xact_lock_shared(hashtextextended(k, seed)))
    FROM (SELECT DISTINCT unnest(keys) AS k ORDER BY 1) AS ordered;
    SELECT step_key FROM closed_steps WHERE step_key = ANY(keys);
END;
