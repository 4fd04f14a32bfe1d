# bench/lib/cluster.sh: a throwaway PostgreSQL cluster (15, Debian's, unless
# PGBIN names another, e.g. PostgreSQL 18 from test/pg-build) for bench/run
# and bench/demo.  Sourced, not run.
#
# PostgreSQL refuses to run as root, so the server runs as the "postgres" OS
# user with its data directory and Unix socket under a fresh /tmp directory,
# listening on loopback only.  Clients (psql, pgbench) may run as root: they
# connect through the socket as database superuser "postgres" (trust auth,
# which is fine for a cluster that lives in a private directory for minutes).
#
# The caller sets PGPORT and then calls cluster_init, cluster_conf,
# cluster_start; cluster_stop removes everything and is safe to call twice
# (call it from an EXIT trap).

PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
PGHOST_DIR=""			# set by cluster_init: the private directory
PGDATA_DIR=""

# as_postgres CMD...: run CMD as the postgres OS user (we are usually root)
as_postgres()
{
	if [ "$(id -u)" = 0 ]; then
		runuser -u postgres -- "$@"
	else
		"$@"
	fi
}

# cluster_init PREFIX: initdb into a new /tmp/PREFIX.XXXXXX directory.
# Data checksums stay off on every version: PostgreSQL 18's initdb turns
# them on by default (15's does not), and with them every hint bit set after
# a checkpoint writes a full-page image, which would measure the setting
# rather than the version.
cluster_init()
{
	local opts=()
	PGHOST_DIR=$(mktemp -d "/tmp/$1.XXXXXX")
	chmod 755 "$PGHOST_DIR"
	[ "$(id -u)" = 0 ] && chown postgres: "$PGHOST_DIR"
	PGDATA_DIR=$PGHOST_DIR/data
	"$PGBIN/initdb" --help | grep -q -- --no-data-checksums && opts+=(--no-data-checksums)
	as_postgres "$PGBIN/initdb" -D "$PGDATA_DIR" -U postgres --auth=trust \
		--encoding=UTF8 --locale=C.UTF-8 "${opts[@]}" >"$PGHOST_DIR/initdb.log" 2>&1 ||
		{ cat "$PGHOST_DIR/initdb.log" >&2; return 1; }
	export PGHOST=$PGHOST_DIR PGPORT PGUSER=postgres
	unset PGDATABASE PGPASSWORD PGSERVICE PGOPTIONS
}

# cluster_conf LINE...: append settings to postgresql.conf
cluster_conf()
{
	printf '%s\n' "$@" | as_postgres tee -a "$PGDATA_DIR/postgresql.conf" >/dev/null
}

cluster_start()
{
	as_postgres "$PGBIN/pg_ctl" -D "$PGDATA_DIR" -l "$PGHOST_DIR/server.log" \
		-o "-c listen_addresses=127.0.0.1 -c port=$PGPORT -c unix_socket_directories=$PGHOST_DIR" \
		-w -t 60 start >/dev/null ||
		{ tail -n 30 "$PGHOST_DIR/server.log" >&2; return 1; }
}

# cluster_stop: stop the server (fast, then immediate) and remove its files
cluster_stop()
{
	[ -n "$PGDATA_DIR" ] || return 0
	if [ -f "$PGDATA_DIR/postmaster.pid" ]; then
		as_postgres "$PGBIN/pg_ctl" -D "$PGDATA_DIR" -m fast -w -t 30 stop >/dev/null 2>&1 ||
			as_postgres "$PGBIN/pg_ctl" -D "$PGDATA_DIR" -m immediate -w stop >/dev/null 2>&1
	fi
	rm -rf "$PGHOST_DIR"
	PGDATA_DIR=""
}

# q DB SQL: run one SQL string, unaligned tuples only, stop on error
q()
{
	psql -X -q -v ON_ERROR_STOP=1 -At -d "$1" -c "$2"
}

# qf DB FILE [psql options]: run a SQL file, stop on error
qf()
{
	local db=$1 file=$2
	shift 2
	psql -X -q -v ON_ERROR_STOP=1 -At -d "$db" -f "$file" "$@"
}

# ensure_packages [DEBIAN_PACKAGE...]: what building pgjq and running these
# scripts needs (PostgreSQL 15 with pgbench, its server headers, a C
# toolchain) plus the named packages; as root, apt-get installs what is
# missing, otherwise name it and fail
ensure_packages()
{
	local need=() p
	{ [ -x "$PGBIN/postgres" ] && [ -x "$PGBIN/pgbench" ]; } || need+=(postgresql-15)
	command -v psql >/dev/null || need+=(postgresql-client-15)
	[ -f /usr/include/postgresql/15/server/postgres.h ] || need+=(postgresql-server-dev-15)
	{ command -v gcc >/dev/null && command -v make >/dev/null; } || need+=(build-essential)
	for p in "$@"; do
		dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
	done
	[ ${#need[@]} = 0 ] && return 0
	if [ "$(id -u)" != 0 ]; then
		echo "missing packages: ${need[*]} (run as root to have them installed)" >&2
		return 1
	fi
	echo "installing ${need[*]} (apt-get)"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
}

# build_pgjq LOGFILE [SCRATCH]: make && make install against $PGBIN's
# PostgreSQL whatever other versions are installed; from the repository root,
# or with SCRATCH (a new directory) from a copy of the sources there built
# from clean, so that a build for another major version never mixes its
# objects with the tree's (bench/run --pg 15,18)
build_pgjq()
{
	local root
	root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
	if [ -n "${2:-}" ]; then
		mkdir -p "$2" &&
			tar -C "$root" -cf - --exclude='*.o' --exclude='*.so' --exclude='*.bc' \
				Makefile pgjq.control src sql | tar -C "$2" -xf - || return 1
		root=$2
	fi
	(cd "$root" &&
		make -s -j"$(nproc)" PG_CONFIG="$PGBIN/pg_config" &&
		make -s PG_CONFIG="$PGBIN/pg_config" install) >"$1" 2>&1
}
