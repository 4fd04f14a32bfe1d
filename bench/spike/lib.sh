# bench/spike/lib.sh: shared by bench/spike/check and bench/spike/run.
# Sourced, not run.  Uses bench/lib/cluster.sh for the throwaway cluster.
#
# PG_CONFIG (or PGJQ_PG_CONFIG) names the PostgreSQL 15 to build against and
# run; default /usr/lib/postgresql/15/bin/pg_config.

SPIKE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BENCH_DIR=$(dirname "$SPIKE_DIR")
PG_CONFIG=${PG_CONFIG:-${PGJQ_PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}}
PGBIN=$("$PG_CONFIG" --bindir)
export PATH="$PGBIN:$PATH"
# shellcheck source=../lib/cluster.sh
. "$BENCH_DIR/lib/cluster.sh"

# free_port: a TCP port nobody listens on now (loopback)
free_port()
{
	python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# build_spike LOG: build and install pgjq_spike into $PG_CONFIG's tree
build_spike()
{
	(cd "$SPIKE_DIR" && make -s PG_CONFIG="$PG_CONFIG" && make -s PG_CONFIG="$PG_CONFIG" install) >"$1" 2>&1
}

# spike_cluster PREFIX [SETTING...]: initdb, the settings bench/run uses, the
# spike preloaded, start on a free loopback port
spike_cluster()
{
	local prefix=$1
	shift
	PGPORT=$(free_port)
	cluster_init "$prefix"
	cluster_conf \
		"shared_buffers = 1GB" \
		"synchronous_commit = on" \
		"fsync = on" \
		"full_page_writes = on" \
		"wal_level = replica" \
		"autovacuum = on" \
		"checkpoint_timeout = 30min" \
		"max_wal_size = 8GB" \
		"max_connections = 100" \
		"shared_preload_libraries = 'pgjq_spike'" \
		"$@"
	cluster_start
}
