# pgjq: PGXS build.  `make test` runs every test group on throwaway clusters
# (see test/run); `make demo` and `make bench` start their own clusters too.

EXTENSION = pgjq
EXTVERSION := $(shell sed -n "s/^default_version = '\(.*\)'/\1/p" pgjq.control)

MODULE_big = pgjq
OBJS = $(patsubst %.c,%.o,$(sort $(wildcard src/*.c src/*/*.c)))

DATA_built = sql/$(EXTENSION)--$(EXTVERSION).sql
DATA = $(filter-out sql/$(EXTENSION).sql sql/$(EXTENSION)--$(EXTVERSION).sql,$(wildcard sql/$(EXTENSION)--*.sql))

PG_CPPFLAGS = -I$(srcdir)/src -DPGJQ_VERSION=\"$(EXTVERSION)\"
PG_CFLAGS = -Wall -Wextra -Werror=implicit-function-declaration -Wno-unused-parameter -Wno-missing-field-initializers -Wno-sign-compare -Wno-clobbered $(PGJQ_CFLAGS)

# Tests (run them all with `make test`).  installcheck starts its own
# preloaded servers (--temp-instance); the isolation database gets the
# extension created for it, regress tests create it themselves.  Expected
# output of both lives in expected/ (test/expected links to it).
REGRESS = $(patsubst test/sql/%.sql,%,$(sort $(wildcard test/sql/*.sql)))
REGRESS_OPTS = --inputdir=test --temp-config=test/pgjq.conf --temp-instance=tmp_check
ISOLATION = $(patsubst test/specs/%.spec,%,$(sort $(wildcard test/specs/*.spec)))
ISOLATION_OPTS = --inputdir=test --temp-config=test/pgjq.conf --temp-instance=tmp_check_iso --load-extension=pgjq
PROVE_TESTS := $(sort $(wildcard test/t/*.pl))
TAP_TESTS := $(if $(PROVE_TESTS),1)

EXTRA_CLEAN = sql/$(EXTENSION)--$(EXTVERSION).sql results regression.diffs regression.out output_iso tmp_check tmp_check_iso log

PG_CONFIG ?= pg_config

# The major versions built and tested (README's Install); any other stops
# here, before a compiler error could say it less plainly.
PGJQ_SUPPORTED_MAJORS = 15 18
PG_MAJOR := $(shell $(PG_CONFIG) --version 2>/dev/null | sed -n 's/^PostgreSQL \([0-9][0-9]*\).*/\1/p')
ifeq ($(PG_MAJOR),)
$(error pgjq: $(PG_CONFIG) not found or not a PostgreSQL pg_config (set PG_CONFIG=/path/to/pg_config))
endif
ifeq ($(filter $(PG_MAJOR),$(PGJQ_SUPPORTED_MAJORS)),)
$(error pgjq supports PostgreSQL 15 and 18; $(PG_CONFIG) is PostgreSQL $(PG_MAJOR))
endif

PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# PGXS does not track headers: rebuild every object when one changes.
$(OBJS): $(wildcard src/*.h src/*/*.h)

sql/$(EXTENSION)--$(EXTVERSION).sql: sql/$(EXTENSION).sql pgjq.control
	cp $< $@

.PHONY: test demo bench indent indent-check

# Everything: build with -Werror, regress, isolation, TAP and pgTAP, each on
# its own throwaway cluster.  As root it first installs missing packages.
test:
	test/run

demo:
	bench/demo

bench:
	bench/run

indent:
	test/indent-check --fix

indent-check:
	@test/indent-check
