--
-- The end of the regression group: whatever the files before did, shared
-- memory and the tables agree (verify() returns no rows).
--
SELECT * FROM pgjq.verify();
