--
-- Included twice by security.sql (\i, from the project root, where
-- pg_regress runs): schema evil, whose functions, aggregate
-- and operators shadow pg_catalog's for a caller with evil first in
-- search_path and raise if ever called; and a public.now() that does too.
--
CREATE SCHEMA evil;
GRANT USAGE ON SCHEMA evil TO PUBLIC;
CREATE FUNCTION evil.trap() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	RAISE EXCEPTION 'trap: a shadowing object was called';
END
$$;
CREATE FUNCTION evil.now() RETURNS timestamptz LANGUAGE plpgsql AS
	$$ BEGIN PERFORM evil.trap(); RETURN NULL; END $$;
CREATE FUNCTION evil.clock_timestamp() RETURNS timestamptz LANGUAGE plpgsql AS
	$$ BEGIN PERFORM evil.trap(); RETURN NULL; END $$;
CREATE FUNCTION evil.jsonb_build_object(text, integer) RETURNS jsonb LANGUAGE plpgsql AS
	$$ BEGIN PERFORM evil.trap(); RETURN NULL; END $$;
CREATE FUNCTION evil.nextval(regclass) RETURNS bigint LANGUAGE plpgsql AS
	$$ BEGIN PERFORM evil.trap(); RETURN NULL; END $$;
CREATE FUNCTION evil.unnest(anyarray) RETURNS SETOF anyelement LANGUAGE plpgsql AS
	$$ BEGIN PERFORM evil.trap(); END $$;
CREATE FUNCTION evil.count_step(bigint) RETURNS bigint LANGUAGE plpgsql AS
	$$ BEGIN PERFORM evil.trap(); RETURN NULL; END $$;
CREATE AGGREGATE evil.count(*) (SFUNC = evil.count_step, STYPE = bigint, INITCOND = '0');
CREATE FUNCTION evil.eq8(bigint, bigint) RETURNS boolean LANGUAGE plpgsql AS
	$$ BEGIN PERFORM evil.trap(); RETURN NULL; END $$;
CREATE FUNCTION evil.eq4(integer, integer) RETURNS boolean LANGUAGE plpgsql AS
	$$ BEGIN PERFORM evil.trap(); RETURN NULL; END $$;
CREATE FUNCTION evil.eqtext(text, text) RETURNS boolean LANGUAGE plpgsql AS
	$$ BEGIN PERFORM evil.trap(); RETURN NULL; END $$;
CREATE FUNCTION evil.eqchar("char", "char") RETURNS boolean LANGUAGE plpgsql AS
	$$ BEGIN PERFORM evil.trap(); RETURN NULL; END $$;
CREATE FUNCTION evil.ge2(smallint, smallint) RETURNS boolean LANGUAGE plpgsql AS
	$$ BEGIN PERFORM evil.trap(); RETURN NULL; END $$;
CREATE FUNCTION evil.lets(timestamptz, timestamptz) RETURNS boolean LANGUAGE plpgsql AS
	$$ BEGIN PERFORM evil.trap(); RETURN NULL; END $$;
CREATE FUNCTION evil.pluststz(timestamptz, interval) RETURNS timestamptz LANGUAGE plpgsql AS
	$$ BEGIN PERFORM evil.trap(); RETURN NULL; END $$;
CREATE OPERATOR evil.= (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = evil.eq8);
CREATE OPERATOR evil.= (LEFTARG = integer, RIGHTARG = integer, FUNCTION = evil.eq4);
CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.eqtext);
CREATE OPERATOR evil.= (LEFTARG = "char", RIGHTARG = "char", FUNCTION = evil.eqchar);
CREATE OPERATOR evil.>= (LEFTARG = smallint, RIGHTARG = smallint, FUNCTION = evil.ge2);
CREATE OPERATOR evil.<= (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = evil.lets);
CREATE OPERATOR evil.< (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = evil.lets);
CREATE OPERATOR evil.+ (LEFTARG = timestamptz, RIGHTARG = interval, FUNCTION = evil.pluststz);
-- a public.now() too, for callers who put public first
CREATE FUNCTION public.now() RETURNS timestamptz LANGUAGE plpgsql AS
	$$ BEGIN PERFORM evil.trap(); RETURN NULL; END $$;

