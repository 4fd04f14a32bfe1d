
# Copyright (c) pgjq contributors
#
# Crash torture: producers and workers run against a preloaded server while
# it is killed and restarted at random moments, at least 20 times a run:
# kill -9 of the postmaster and all its children at once, of one client
# backend, of the pgjq worker (both a crash restart), a clean stop
# (-m fast) and an immediate stop.  Slots of a few hundred rows make the
# ring turn, relocate and truncate many times between the kills.
#
# The clients are forked Perl processes, each driving a psql co-process
# with a line protocol (every statement is followed by an \echo of psql's
# ERROR and SQLSTATE variables).  Each writes a ledger line after every
# statement: what it sent, when, and what came back, or "lost" when the
# connection died before the answer (then the statement may or may not
# have committed, and the checks accept either outcome).  Every job's
# payload carries a marker naming the enqueue that made it, so a job of a
# lost enqueue is recognised when it is claimed.
#
# Producers: enqueue_many and enqueue with delays (some longer than a ring
# turn), priorities (and, in queue tm, many distinct ones), fair keys,
# dedup keys, dependencies (after =>), small max_attempts, cancel; a cron
# schedule; a paused queue taking a job now and then.  Workers: claim 5-10,
# complete, fail with retry_in 0-1 s, snooze, cancel, abandon (the lease
# expires); a holder keeps one job on an 8 s lease across the kills.
#
# After each restart (with the clients held back) verify() must return no
# rows.  After the load, the queues are drained and the ledger is checked:
# every committed enqueue ends completed exactly once or in a terminal state
# the ledger explains; no acknowledged completion comes back; no two
# unexpired leases of one job; no job claimed before its run_at (or before
# a retry's or a snooze's delay ran out, or before its dependencies
# completed, or while its queue was paused); a valid lease's outcome is not
# refused as stale; every due job is handed out within a bound (lateness is
# measured from when the job was due, or from when the server was back if
# it was due before a restart); queue_stats agrees.
#
# Environment:
#   PGJQ_TORTURE_SEED=N      rerun a seed (printed at the start and the end)
#   PGJQ_TORTURE_MINUTES=M   soak: M minutes of load (restarts go on at the
#                            same pace)
#   PGJQ_TORTURE_RUNS=N      long mode: issue 28's finding 2 recipe N times
#                            (slots of 200 rows; 2 producers enqueue_many
#                            10-40, 10% delayed 0-1 s; 3 workers claim 5-10,
#                            5% fail with retry_in 0-1 s, 5% snooze; one
#                            job on an 8 s lease; a paused queue taking a
#                            job every 0.2 s; 10 kill -9s 0.3-0.7 s apart)
#   PGJQ_TORTURE_RESTARTS=N  restarts in the default mode (default 20)
#   PGJQ_TORTURE_LATE=S      lateness bound in seconds (default 10)
#   PGJQ_TORTURE_PRIORITIES=N  queue tm uses only N distinct priorities
#                            (default: up to 45 in one statement, hundreds
#                            in all)

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IO::Handle;
use IPC::Open3;
use List::Util ();
use POSIX ();
use Time::HiRes qw(time usleep);

my $seed = $ENV{PGJQ_TORTURE_SEED} // (int(time * 1000) ^ $$) % 2_000_000_000;
my $minutes = $ENV{PGJQ_TORTURE_MINUTES};
my $runs = $ENV{PGJQ_TORTURE_RUNS};
my $late_bound = $ENV{PGJQ_TORTURE_LATE} // 10;
# queue tm's priorities: as many distinct ones as it takes, or only N
my @prio_set = map { $_ * 7 - 50 } 0 .. ($ENV{PGJQ_TORTURE_PRIORITIES} // 0) - 1;
srand($seed);
diag "torture seed $seed (rerun with PGJQ_TORTURE_SEED=$seed)";

# What each mode runs: the load's mix, and the restarts.
my %mixed = (
	name => 'mixed',
	slot_rows => 200,
	producers => 2,
	workers => 3,
	paused_every => 0.5,
	mix => 1,    # priorities, fair and dedup keys, dependencies, tm, cancel
	p_fail => 0.04,
	p_snooze => 0.04,
	p_cancel => 0.02,
	p_abandon => 0.02,
	# the kinds of restart, in this proportion, shuffled
	deck => [
		qw(pm_all backend pgjq_worker fast pm_all immediate backend pm_all
		  pgjq_worker fast pm_all)
	],
	# short gaps, some in quick succession as in finding 2, some longer
	# than the lateness bound: a job stranded after a restart is not
	# rescued by the next one
	gap => sub {
		my $r = rand;
		return $r < 0.15 ? $late_bound + 1 + rand(2) : $r < 0.45 ? 0.3 + rand(0.4) : 1.5 + rand(3);
	},
	settle => 0,
	drain_secs => 60);
my %finding2 = (
	name => 'finding2',
	slot_rows => 200,
	producers => 2,
	workers => 3,
	paused_every => 0.2,
	mix => 0,
	p_fail => 0.05,
	p_snooze => 0.05,
	p_cancel => 0,
	p_abandon => 0,
	deck => [ ('pm_all') x 10 ],
	gap => sub { 0.3 + rand(0.4) },
	settle => 0,
	drain_secs => 60);

my $profile = $runs ? \%finding2 : \%mixed;
if (!$runs)
{
	my $n = $ENV{PGJQ_TORTURE_RESTARTS} // 20;
	my @base = @{ $mixed{deck} };
	$mixed{deck} = [ map { $base[ $_ % @base ] } 0 .. $n - 1 ];
}

my $node = PostgreSQL::Test::Cluster->new('torture');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'pgjq'
pgjq.database_names = 'postgres'
pgjq.max_sleep = '200ms'
pgjq.ring_slot_rows = $profile->{slot_rows}
restart_after_crash = on
max_connections = 40
log_min_messages = warning
log_statement = none
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION pgjq');

# the clients of the run under way: stopped if the test dies
my @all_kids;
my $parent = $$;
END
{
	if ($$ == $parent)
	{
		kill 'KILL', $_ for @all_kids;
	}
}

# SQL of the test itself that may fail when the server is broken: the
# error becomes an anomaly of the run, and the run goes on.
my @ctl_errors;

sub ctl_sql
{
	my ($sql, $what) = @_;
	my ($ret, $out, $err) = $node->psql('postgres', $sql);
	return $out if $ret == 0;
	$err =~ s/\n/ /g;
	push @ctl_errors, "$what failed: $err";
	return undef;
}

my $total_anomalies = 0;
my @summaries;
if ($runs)
{
	for my $run (1 .. $runs)
	{
		my $r = torture_run($profile, $run, undef);
		$total_anomalies += $r->{anomalies};
		push @summaries, $r->{summary};
	}
}
else
{
	my $r = torture_run($profile, 1, $minutes ? $minutes * 60 : undef);
	$total_anomalies += $r->{anomalies};
	push @summaries, $r->{summary};
}

is($total_anomalies, 0, 'no anomaly in any run');
diag $_ for @summaries;
diag "torture seed $seed";

$node->stop;
done_testing();

#--------------------------------------------------------------------------
# psql co-process: one connection, one statement at a time.

package TortureConn;

use IPC::Open3;
use Time::HiRes qw(time);

sub new
{
	my ($class, $node) = @_;
	return bless { host => $node->host, port => $node->port }, $class;
}

sub connected { return defined $_[0]->{pid} }

sub close
{
	my ($self) = @_;
	return unless defined $self->{pid};
	close $self->{wr};
	close $self->{rd};
	kill 'KILL', $self->{pid};
	waitpid($self->{pid}, 0);
	delete @$self{qw(pid wr rd)};
}

sub connect
{
	my ($self) = @_;
	$self->close;
	local $ENV{PGCONNECT_TIMEOUT} = 5;
	my ($wr, $rd);
	my $pid = open3($wr, $rd, undef, 'psql', '-XAtq', '-h', $self->{host}, '-p', $self->{port},
		'-d', 'postgres');
	@$self{qw(pid wr rd)} = ($pid, $wr, $rd);
	$wr->autoflush(1);
	my ($st) = $self->q('SELECT 1');
	return $st eq 'ok';
}

# q($sql): ('ok', [rows]), ('err', sqlstate, message) or ('lost'); the time
# it was sent and the time the answer came are in $self->{ts}, $self->{ta}.
sub q
{
	my ($self, $sql) = @_;
	$self->{ts} = time;
	$self->{ta} = undef;
	# not sent at all: the connection was already gone
	return ('unsent') unless defined $self->{pid};
	local $SIG{PIPE} = 'IGNORE';
	my $wr = $self->{wr};
	my $rd = $self->{rd};
	if (!print $wr "$sql;\n\\echo __END__ :ERROR :SQLSTATE\n")
	{
		# psql had exited: nobody read it
		$self->close;
		return ('unsent');
	}
	my (@rows, $msg);
	$msg = '';
	while (defined(my $l = <$rd>))
	{
		chomp $l;
		if ($l =~ /^__END__ (\w+) (\w*)$/)
		{
			my ($error, $sqlstate) = ($1, $2);
			# the connection died (psql goes on without one): the
			# statement may or may not have committed
			if ($error eq 'true' && ($sqlstate eq '' || $sqlstate =~ /^(57P0|08)/))
			{
				$self->close;
				return ('lost');
			}
			$self->{ta} = time;
			return $error eq 'true' ? ('err', $sqlstate, $msg) : ('ok', \@rows);
		}
		if ($l =~ /^psql:|^(ERROR|FATAL|WARNING|NOTICE|DETAIL|HINT|CONTEXT):/)
		{
			$msg .= "$l\n";
			next;
		}
		push @rows, $l;
	}
	$self->close;
	return ('lost');
}

package main;

#--------------------------------------------------------------------------
# One run: queues, clients, restarts, drain, checks.

sub sqlq
{
	my ($s) = @_;
	$s =~ s/'/''/g;
	return "'$s'";
}

sub torture_run
{
	my ($prof, $run, $load_secs) = @_;
	my $dir = PostgreSQL::Test::Utils::tempdir;
	my $sfx = $runs ? "_$run" : '';
	my %q = (
		main => "t$sfx",
		many => "tm$sfx",
		cron => "tc$sfx",
		paused => "tp$sfx");
	my $ctx = { dir => $dir, prof => $prof, queue => \%q, run => $run };

	$node->safe_psql(
		'postgres', qq{
SELECT pgjq.create_queue('$q{main}', lease => '2 s', max_attempts => 6,
                         backoff_base => '100 ms', backoff_max => '1 s');
SELECT pgjq.create_queue('$q{many}', lease => '2 s', max_attempts => 6,
                         backoff_base => '100 ms', backoff_max => '1 s');
SELECT pgjq.create_queue('$q{cron}', lease => '2 s', max_attempts => 6,
                         backoff_base => '100 ms', backoff_max => '1 s');
SELECT pgjq.create_queue('$q{paused}', lease => '2 s', max_attempts => 6,
                         backoff_base => '100 ms', backoff_max => '1 s');
SELECT pgjq.pause('$q{paused}');
});
	$node->safe_psql('postgres',
		"SELECT pgjq.schedule('tick$sfx', '* * * * *', '$q{cron}', '{\"m\": \"cron\"}')")
	  if $prof->{mix};

	# the clients
	my @kids;
	my $nkid = 0;
	my $spawn = sub {
		my ($role) = @_;
		my $idx = $nkid++;
		my $pid = fork();
		die "fork failed: $!" unless defined $pid;
		if ($pid == 0)
		{
			open STDOUT, '>>', "$dir/client.$idx.out" or POSIX::_exit(126);
			open STDERR, '>&', \*STDOUT or POSIX::_exit(126);
			my $rc = eval { client($ctx, $role, $idx); 0 } // do { print STDERR "client $role $idx: $@"; 1 };
			POSIX::_exit($rc);
		}
		push @kids, { pid => $pid, role => $role };
		push @all_kids, $pid;
	};
	$spawn->('producer') for 1 .. $prof->{producers};
	$spawn->('worker') for 1 .. $prof->{workers};
	$spawn->('holder');
	$spawn->('pauser');

	# the restarts
	open my $ctl, '>>', "$dir/controller.ledger" or die;
	$ctl->autoflush(1);
	my @deck = @{ $prof->{deck} };
	for my $i (reverse 1 .. $#deck)    # shuffle, seeded
	{
		my $j = int rand($i + 1);
		@deck[ $i, $j ] = @deck[ $j, $i ];
	}
	my $t0 = time;
	my @verify_fail;
	my %kinds;
	my $nrestart = 0;
	while (1)
	{
		my $kind;
		if (defined $load_secs)
		{
			last if time - $t0 > $load_secs;
			$kind = $prof->{deck}[ int rand(@{ $prof->{deck} }) ];
		}
		else
		{
			last unless @deck;
			$kind = shift @deck;
		}
		sleep_checking(\@kids, $prof->{gap}->());
		my ($down, $up, $how) = restart($ctx, $kind);
		$nrestart++;
		$kinds{$how}++;
		# verify() at once (the clients wait, the pgjq worker does not): a
		# settled ring hides what the first passes after a restart do
		Time::HiRes::sleep($prof->{settle}) if $prof->{settle};
		my ($ret, $out, $err) = $node->psql('postgres',
			q{SELECT concat_ws(' | ', area, object, expected, found) FROM pgjq.verify()});
		my $open = time;
		unlink "$dir/gate";
		printf $ctl "R\t%s\t%.6f\t%.6f\t%.6f\n", $how, $down, $up, $open;
		if ($ret != 0 || $out ne '')
		{
			my @rows = split /\n/, $out;
			push @verify_fail,
			  sprintf("verify after restart %d (%s): %d rows%s: %s", $nrestart, $how, scalar @rows,
				$ret ? " (error $err)" : '', join('; ', @rows[ 0 .. ($#rows < 4 ? $#rows : 4) ]));
		}
	}
	my $load_time = time - $t0;

	# drain: producers stop, the paused queue resumes, workers complete all
	touch("$dir/drain");
	ctl_sql("SELECT pgjq.unschedule('tick$sfx')", 'unschedule') if $prof->{mix};
	# the time the resume was sent: a claim may take the queue's jobs as soon
	# as it commits, before psql has returned its answer
	my $t_resume = time;
	ctl_sql("SELECT pgjq.resume('$q{paused}')", 'resume');
	printf $ctl "P\t%.6f\n", $t_resume;
	my $qlist = join ',', map { sqlq($_) } values %q;
	my $t_drain = time;
	my $left;
	while (1)
	{
		$left = ctl_sql(
			"SELECT coalesce(sum(ready + scheduled + running + waiting), 0) FROM pgjq.queue_stats WHERE queue IN ($qlist)",
			'the drain\'s queue_stats') // 'unknown';
		last if $left eq '0' || time - $t_drain > $prof->{drain_secs};
		usleep(200_000);
	}
	my $drain_time = time - $t_drain;
	diag "drain: $left jobs left after $prof->{drain_secs} s:\n"
	  . ($node->psql('postgres', "SELECT * FROM pgjq.queue_stats WHERE queue IN ($qlist)"))[1]
	  . "\n" . ($node->psql('postgres',
		"SELECT pid, application_name, state, wait_event_type, wait_event, left(query, 60) FROM pg_stat_activity WHERE application_name LIKE 'torture%'"))[1]
	  if $left ne '0';
	touch("$dir/stop");
	for my $k (@kids)
	{
		my $deadline = time + 10;
		usleep(50_000) while time < $deadline && waitpid($k->{pid}, POSIX::WNOHANG()) == 0;
		if (kill 0, $k->{pid})
		{
			diag "client $k->{role} (pid $k->{pid}) did not stop";
			kill 'KILL', $k->{pid};
			waitpid($k->{pid}, 0);
		}
	}
	my ($ret, $out, $err) = $node->psql('postgres',
		q{SELECT concat_ws(' | ', area, object, expected, found) FROM pgjq.verify()});
	push @verify_fail, "verify at the end: $out $err" if $ret != 0 || $out ne '';

	my $res = check_ledger($ctx, $load_time, $drain_time, $left, \@verify_fail, $nrestart, \%kinds);
	return $res;
}

sub touch
{
	open my $fh, '>', $_[0] or die "could not write $_[0]: $!";
	close $fh;
}

# Sleep, but say which client died meanwhile (a bug in this test).
sub sleep_checking
{
	my ($kids, $secs) = @_;
	Time::HiRes::sleep($secs);
	for my $k (@$kids)
	{
		next if $k->{reported};
		if (waitpid($k->{pid}, POSIX::WNOHANG()) == $k->{pid})
		{
			$k->{reported} = 1;
			diag "client $k->{role} (pid $k->{pid}) exited with $?";
		}
	}
}

sub postmaster_pid
{
	open my $fh, '<', $node->data_dir . '/postmaster.pid' or return undef;
	my $pm = <$fh>;
	close $fh;
	chomp $pm;
	return $pm;
}

# The postmaster's children as [pid, command line].
sub children
{
	my ($pm) = @_;
	return map { [ /^\s*(\d+)\s+(.*)$/ ] } grep { /\S/ } split /\n/, `ps -o pid=,args= --ppid $pm`;
}

sub wait_gone
{
	my @pids = @_;
	my $until = time + 60;
	usleep(20_000) while time < $until && grep { kill 0, $_ } @pids;
}

sub wait_up
{
	for (1 .. 600)
	{
		my ($ret, $out) = $node->psql('postgres', 'SELECT pgjq._preloaded()');
		return 1 if $ret == 0 && $out eq 't';
		usleep(100_000);
	}
	die 'the server did not come back';
}

# One restart of the given kind, with the clients held back from
# reconnecting (the gate file) until verify() has run.  Returns the time it
# went down, the time it was back and the kind (a single backend's or the
# worker's kill falls back to the postmaster's if there is none).
sub restart
{
	my ($ctx, $kind) = @_;
	touch("$ctx->{dir}/gate");
	my $pm = postmaster_pid();
	my @kids = children($pm);
	my $down = time;
	if ($kind eq 'backend' || $kind eq 'pgjq_worker')
	{
		my $re = $kind eq 'backend' ? qr/\[local\]/ : qr/pgjq worker/;
		my @c = grep { $_->[1] =~ $re } @kids;
		if (@c)
		{
			my $victim = $c[ int rand(@c) ][0];
			my $offset = -s $node->logfile;
			kill 'KILL', $victim;
			$node->wait_for_log(qr/all server processes terminated; reinitializing/, $offset);
			wait_up();
			return ($down, time, $kind);
		}
		$kind = 'pm_all';
	}
	if ($kind eq 'pm_all')
	{
		# the postmaster and all its children at once
		kill 'KILL', $pm, map { $_->[0] } @kids;
		$node->kill9;    # forgets the pid
		wait_gone($pm, map { $_->[0] } @kids);
	}
	elsif ($kind eq 'fast' || $kind eq 'immediate')
	{
		$node->stop($kind);
	}
	my $ok = 0;
	for (1 .. 30)
	{
		$ok = $node->start(fail_ok => 1) and last;
		sleep 1;
	}
	die 'the server did not start again' unless $ok;
	wait_up();
	return ($down, time, $kind);
}

#--------------------------------------------------------------------------
# The clients.

sub client
{
	my ($ctx, $role, $idx) = @_;
	srand($seed * 31 + $idx * 7919 + $ctx->{run} * 104729);
	$ENV{PGAPPNAME} = "torture_$role";
	open my $led, '>>', "$ctx->{dir}/$role.$idx.ledger" or die;
	$led->autoflush(1);
	my $c = TortureConn->new($node);
	my $st = { ctx => $ctx, led => $led, c => $c, idx => $idx, seq => 0, recent => [] };
	my $dir = $ctx->{dir};
	while (!-e "$dir/stop")
	{
		my $drain = -e "$dir/drain";
		last if $drain && $role ne 'worker';
		if (!$c->connected)
		{
			if (-e "$dir/gate" || !$c->connect)
			{
				usleep(50_000);
				next;
			}
		}
		if ($role eq 'producer') { producer_step($st) }
		elsif ($role eq 'worker') { worker_step($st, $drain) }
		elsif ($role eq 'holder') { holder_step($st) }
		else { pauser_step($st) }
	}
	$c->close;
	return 0;
}

sub led
{
	my ($st, @f) = @_;
	my $fh = $st->{led};
	print $fh join("\t", @f), "\n";
}

sub status_of
{
	my ($r) = @_;
	return $r->[0] eq 'err' ? "err:$r->[1]" : $r->[0];
}

# enqueue: ledger line E ts ta status queue delay prio maxatt dedup after
# ondep items, items "marker:fairkey:id" (id "?" unless acknowledged).
sub enqueue
{
	my ($st, %a) = @_;
	my $c = $st->{c};
	my $n = $a{n} // 1;
	my @m = map { sprintf('c%dr%ds%dj%d', $st->{idx}, $st->{ctx}{run}, $st->{seq}, $_) } 1 .. $n;
	$st->{seq}++;
	my @fk = map { $a{fair} ? $a{fair}->() : undef } 1 .. $n;
	my $delay = $a{delay} // 0;
	my $opts = '';
	$opts .= sprintf(", delay => '%.3f s'", $delay) if $delay;
	$opts .= ", priority => $a{prio}" if $a{prio};
	$opts .= ", max_attempts => $a{maxatt}" if $a{maxatt};
	$opts .= ", dedup_key => '$a{dedup}'" if $a{dedup};
	$opts .= ", on_dependency_failure => '$a{ondep}'" if $a{ondep};
	my $sql;
	if ($a{prios})
	{
		# one statement, a priority each
		$sql = sprintf(
			q{SELECT pgjq.enqueue('%s', jsonb_build_object('m', u.m), priority => u.p%s)
			    FROM unnest('{%s}'::text[], '{%s}'::int[]) WITH ORDINALITY u(m, p, o) ORDER BY u.o},
			$a{queue}, $opts, join(',', @m), join(',', @{ $a{prios} }));
	}
	elsif ($a{many})
	{
		my $fks = join ',', map { defined $_ ? "'$_'" : 'NULL' } @fk;
		$sql = sprintf("SELECT * FROM pgjq.enqueue_many('%s', ARRAY[%s]::jsonb[], fair_keys => ARRAY[%s]::text[]%s)",
			$a{queue}, join(',', map { qq{'{"m": "$_"}'} } @m), $fks, $opts);
	}
	else
	{
		$opts .= ", fair_key => '$fk[0]'" if defined $fk[0];
		$opts .= ", after => ARRAY[" . join(',', @{ $a{after} }) . ']::bigint[]' if $a{after};
		$sql = sprintf(qq{SELECT pgjq.enqueue('%s', '{"m": "%s"}'%s)}, $a{queue}, $m[0], $opts);
	}
	my @r = $c->q($sql);
	my @ids = $r[0] eq 'ok' ? @{ $r[1] } : ();
	my @items = map { join ':', $m[$_], $fk[$_] // '-', $ids[$_] // '?' } 0 .. $n - 1;
	led($st, 'E', sprintf('%.6f', $c->{ts}), $c->{ta} ? sprintf('%.6f', $c->{ta}) : '-',
		status_of(\@r), $a{queue}, $delay, $a{prios} ? 'each' : $a{prio} // 0, $a{maxatt} // '-', $a{dedup} // '-',
		$a{after} ? join(',', @{ $a{after} }) : '-', $a{ondep} // '-', join(',', @items));
	if ($r[0] eq 'ok' && $a{queue} eq $st->{ctx}{queue}{main})
	{
		push @{ $st->{recent} }, @ids;
		splice @{ $st->{recent} }, 0, @{ $st->{recent} } - 300 if @{ $st->{recent} } > 300;
	}
	return @r;
}

sub pick { return $_[ int rand(@_) ] }

sub producer_step
{
	my ($st) = @_;
	my $ctx = $st->{ctx};
	my $prof = $ctx->{prof};
	my $q = $ctx->{queue};
	my $fair = sub { pick('a', 'b', 'c', 'd', undef) };
	my $r = rand;
	if (!$prof->{mix})
	{
		# finding 2's producers: enqueue_many of 10-40, 10% delayed 0-1 s
		enqueue($st, queue => $q->{main}, many => 1, n => 10 + int rand(31),
			delay => rand() < 0.1 ? rand(1) : 0);
		usleep(20_000 + int rand(60_000));
		return;
	}
	my $delay = sub {
		my $d = rand;
		return $d < 0.70 ? 0 : $d < 0.85 ? rand(1) : $d < 0.95 ? 1 + rand(3) : 8 + rand(8);
	};
	if ($r < 0.50)
	{
		enqueue($st, queue => $q->{main}, many => 1, n => 10 + int rand(21), fair => $fair,
			prio => int rand(4), delay => $delay->());
	}
	elsif ($r < 0.66)
	{
		enqueue($st, queue => $q->{main}, fair => $fair, prio => int(rand(11)) - 5,
			dedup => 'd' . int(rand(15)), delay => $delay->(),
			maxatt => rand() < 0.3 ? 2 : undef);
	}
	elsif ($r < 0.78 && @{ $st->{recent} })
	{
		my @after = map { pick(@{ $st->{recent} }) } 1 .. 1 + int rand(2);
		enqueue($st, queue => $q->{main}, fair => $fair, after => \@after,
			ondep => rand() < 0.3 ? 'run' : undef, delay => rand() < 0.2 ? rand(1) : 0);
	}
	elsif ($r < 0.84)
	{
		# many distinct priorities
		enqueue($st, queue => $q->{many}, fair => $fair,
			prio => @prio_set ? pick(@prio_set) : int(rand(401)) - 200,
			delay => rand() < 0.2 ? rand(2) : 0, maxatt => rand() < 0.2 ? 2 : undef);
	}
	elsif ($r < 0.90)
	{
		# 5-45 jobs at as many distinct priorities in one statement (over
		# 32 at once fails with 54000 while the ring bounds them)
		my $n = 5 + int rand(41);
		$n = @prio_set if @prio_set && $n > @prio_set;
		my %p;
		$p{ @prio_set ? pick(@prio_set) : int(rand(2001)) - 1000 } = 1 while keys %p < $n;
		enqueue($st, queue => $q->{many}, n => $n, prios => [ List::Util::shuffle(sort { $a <=> $b } keys %p) ]);
	}
	elsif ($r < 0.96 && @{ $st->{recent} })
	{
		my $id = pick(@{ $st->{recent} });
		my $c = $st->{c};
		my @r = $c->q("SELECT pgjq.cancel($id)");
		led($st, 'X', sprintf('%.6f', $c->{ts}), $c->{ta} ? sprintf('%.6f', $c->{ta}) : '-',
			status_of(\@r), $id, $r[0] eq 'ok' ? $r[1][0] : '?');
	}
	else
	{
		enqueue($st, queue => $q->{main}, fair => $fair, prio => int rand(4), many => 1, n => 3);
	}
	usleep(30_000 + int rand(120_000));
}

sub pauser_step
{
	my ($st) = @_;
	enqueue($st, queue => $st->{ctx}{queue}{paused});
	Time::HiRes::sleep($st->{ctx}{prof}{paused_every});
}

# claim: ledger line C ts ta status lease items, items
# "id:token:attempt:lease_until:marker:queue".
sub claim
{
	my ($st, $queues, $n, $lease) = @_;
	my $c = $st->{c};
	my @r = $c->q(sprintf(
		q{SELECT c.id, c.token, c.attempt, extract(epoch FROM c.lease_until), c.payload->>'m'
		    FROM pgjq.claim(ARRAY[%s], %d, lease => '%d s') c},
		join(',', map { "'$_'" } @$queues), $n, $lease));
	my @jobs = $r[0] eq 'ok' ? map { [ split /\|/ ] } @{ $r[1] } : ();
	if ($r[0] ne 'ok' || @jobs)
	{
		led($st, 'C', sprintf('%.6f', $c->{ts}), $c->{ta} ? sprintf('%.6f', $c->{ta}) : '-',
			status_of(\@r), $lease, join(',', map { join ':', @$_ } @jobs));
	}
	return @jobs;
}

# outcomes in one statement: ledger line O ts ta status items, items
# "kind:id:token:arg:result" (kind c complete, f fail, s snooze).
sub outcomes
{
	my ($st, @o) = @_;
	return unless @o;
	my $c = $st->{c};
	my $sql = sprintf(
		q{SELECT u.i, CASE u.k WHEN 'c' THEN pgjq.complete(u.i, u.t)::text
		                        WHEN 'f' THEN pgjq.fail(u.i, u.t, 'torture', u.r)
		                        ELSE pgjq.snooze(u.i, u.t, u.r)::text END
		    FROM unnest('{%s}'::bigint[], '{%s}'::bigint[], '{%s}'::text[], '{%s}'::interval[])
		         WITH ORDINALITY u(i, t, k, r, o) ORDER BY u.o},
		join(',', map { $_->[1] } @o), join(',', map { $_->[2] } @o),
		join(',', map { $_->[0] } @o), join(',', map { "$_->[3] s" } @o));
	my @r = $c->q($sql);
	my @res = $r[0] eq 'ok' ? map { (split /\|/)[1] } @{ $r[1] } : ();
	led($st, 'O', sprintf('%.6f', $c->{ts}), $c->{ta} ? sprintf('%.6f', $c->{ta}) : '-',
		status_of(\@r), join(',', map { join ':', @{ $o[$_] }, $res[$_] // '?' } 0 .. $#o));
}

sub worker_step
{
	my ($st, $drain) = @_;
	my $ctx = $st->{ctx};
	my $prof = $ctx->{prof};
	# in a random order: no queue starves the others
	my @queues = List::Util::shuffle(sort values %{ $ctx->{queue} });
	my @jobs = claim($st, \@queues, 5 + int rand(6), 2);
	if (!@jobs)
	{
		usleep(20_000 + int rand(30_000));
		return;
	}
	usleep(int rand(20_000));    # the work
	my @o;
	for my $j (@jobs)
	{
		my ($id, $tok) = @$j;
		my $r = $drain ? 1 : rand;
		if ($r < $prof->{p_fail})
		{
			push @o, [ 'f', $id, $tok, sprintf('%.3f', rand(1)) ];
		}
		elsif (($r -= $prof->{p_fail}) < $prof->{p_snooze})
		{
			push @o, [ 's', $id, $tok, sprintf('%.3f', rand(1)) ];
		}
		elsif (($r -= $prof->{p_snooze}) < $prof->{p_cancel})
		{
			my $c = $st->{c};
			my @r = $c->q("SELECT pgjq.cancel($id)");
			led($st, 'X', sprintf('%.6f', $c->{ts}), $c->{ta} ? sprintf('%.6f', $c->{ta}) : '-',
				status_of(\@r), $id, $r[0] eq 'ok' ? $r[1][0] : '?');
			push @o, [ 'c', $id, $tok, 0 ];
		}
		elsif (($r -= $prof->{p_cancel}) < $prof->{p_abandon})
		{
			# no outcome: the lease expires
		}
		else
		{
			push @o, [ 'c', $id, $tok, 0 ];
		}
	}
	outcomes($st, @o);
}

# One job on an 8 s lease, kept 5-7 s (across restarts), then completed.
sub holder_step
{
	my ($st) = @_;
	my $dir = $st->{ctx}{dir};
	my @jobs = claim($st, [ $st->{ctx}{queue}{main} ], 1, 8);
	if (!@jobs)
	{
		usleep(200_000);
		return;
	}
	my $until = time + 5 + rand(2);
	usleep(100_000) while time < $until && !-e "$dir/drain" && !-e "$dir/stop";
	while (!-e "$dir/stop")
	{
		last if $st->{c}->connected;
		if (-e "$dir/gate" || !$st->{c}->connect)
		{
			usleep(50_000);
		}
	}
	outcomes($st, [ 'c', $jobs[0][0], $jobs[0][1], 0 ]);
}

#--------------------------------------------------------------------------
# The checks.

sub pct
{
	my ($p, @v) = @_;
	return 'n/a' unless @v;
	@v = sort { $a <=> $b } @v;
	return sprintf('%.3f', $v[ int($p * $#v + 0.5) ]);
}

sub check_ledger
{
	my ($ctx, $load_time, $drain_time, $left, $verify_fail, $nrestart, $kinds) = @_;
	my $dir = $ctx->{dir};
	my $prof = $ctx->{prof};
	my (@anom, %n);
	my $anomaly = sub { push @anom, join(' ', @_) };

	my (@windows, $resume);
	my (%marker, %job, @enq);
	for my $f (glob "$dir/*.ledger")
	{
		open my $fh, '<', $f or die;
		while (my $l = <$fh>)
		{
			chomp $l;
			my @f = split /\t/, $l, -1;
			my $t = shift @f;
			if ($t eq 'R')
			{
				push @windows, { how => $f[0], down => $f[1], up => $f[2], open => $f[3] };
			}
			elsif ($t eq 'P') { $resume = $f[0] }
			elsif ($t eq 'E')
			{
				my %e;
				@e{qw(ts ta st queue delay prio maxatt dedup after ondep items)} = @f;
				$e{items} = [ map { [ split /:/ ] } split /,/, $e{items} ];
				push @enq, \%e;
				$n{enqueue_calls}++;
				$n{"enqueue_$e{st}"}++ if $e{st} ne 'ok';
				for my $it (@{ $e{items} })
				{
					my ($m, $fk, $id) = @$it;
					$marker{$m} = { e => \%e, id => $id };
					next unless $e{st} eq 'ok';
					$n{jobs_acked}++;
					my $j = $job{$id} //= { id => $id, claims => [], outs => [], cancels => [], enq => [] };
					push @{ $j->{enq} }, \%e;
				}
			}
			elsif ($f[2] eq 'unsent')
			{
				$n{unsent}++;    # never reached the server
			}
			elsif ($t eq 'C')
			{
				my ($ts, $ta, $st, $lease, $items) = @f;
				$n{claim_calls}++;
				$n{"claim_$st"}++ if $st ne 'ok';
				for my $it (split /,/, $items)
				{
					my ($id, $tok, $att, $lu, $m) = split /:/, $it;
					$n{claims}++;
					my $j = $job{$id} //= { id => $id, claims => [], outs => [], cancels => [], enq => [] };
					push @{ $j->{claims} },
					  { ts => $ts, ta => $ta, tok => $tok, att => $att, lu => $lu, lease => $lease, mark => $m };
				}
			}
			elsif ($t eq 'O')
			{
				my ($ts, $ta, $st, $items) = @f;
				$n{outcome_calls}++;
				$n{"outcome_$st"}++ if $st ne 'ok';
				for my $it (split /,/, $items)
				{
					my ($k, $id, $tok, $arg, $res) = split /:/, $it;
					$res = '?' if $st ne 'ok';
					$res = substr($res, 0, 1) if $res eq 'true' || $res eq 'false';
					my $j = $job{$id} //= { id => $id, claims => [], outs => [], cancels => [], enq => [] };
					push @{ $j->{outs} },
					  { ts => $ts, ta => $ta, st => $st, k => $k, tok => $tok, arg => $arg, res => $res };
					$n{stale_refused}++
					  if ($k eq 'c' || $k eq 's') && $res eq 'f' || $k eq 'f' && $res eq 'stale';
					$n{completions}++ if $k eq 'c' && $res eq 't';
				}
			}
			elsif ($t eq 'X')
			{
				my ($ts, $ta, $st, $id, $res) = @f;
				$res = '?' if $st ne 'ok';
				$n{cancel_calls}++;
				my $j = $job{$id} //= { id => $id, claims => [], outs => [], cancels => [], enq => [] };
				push @{ $j->{cancels} }, { ts => $ts, ta => $ta, res => $res };
			}
		}
		close $fh;
	}
	$n{"enqueue_err:54000"} //= 0;
	@windows = sort { $a->{down} <=> $b->{down} } @windows;

	# claims name their enqueue by marker: a lost enqueue that committed
	for my $j (values %job)
	{
		for my $c (@{ $j->{claims} })
		{
			next if $c->{mark} eq 'cron';
			my $mk = $marker{ $c->{mark} };
			if (!$mk)
			{
				$anomaly->("job $j->{id}: claimed with marker $c->{mark} that no enqueue wrote");
				next;
			}
			my $e = $mk->{e};
			if ($e->{st} eq 'ok')
			{
				$anomaly->("job $j->{id}: claimed with the payload of job $mk->{id}")
				  if $mk->{id} ne $j->{id} && $e->{dedup} eq '-';
			}
			elsif ($e->{st} eq 'lost')
			{
				if (!@{ $j->{enq} })
				{
					push @{ $j->{enq} }, $e;
					$j->{lost_enq} = 1;
					$n{lost_enqueue_committed}++;
				}
			}
			else
			{
				$anomaly->("job $j->{id}: claimed, but its enqueue failed ($e->{st})");
			}
		}
	}

	# dedup: a key returned an id that was already completed
	my %done_ack;    # id -> earliest acknowledged completion
	for my $j (values %job)
	{
		for my $o (@{ $j->{outs} })
		{
			$done_ack{ $j->{id} } = $o->{ta}
			  if $o->{k} eq 'c' && $o->{res} eq 't'
			  && (!defined $done_ack{ $j->{id} } || $o->{ta} < $done_ack{ $j->{id} });
		}
	}
	for my $e (@enq)
	{
		next unless $e->{st} eq 'ok' && $e->{dedup} ne '-';
		my $id = $e->{items}[0][2];
		my $d = $done_ack{$id};
		$anomaly->("job $id: dedup key $e->{dedup} at $e->{ts} returned it, completed (acknowledged) at $d")
		  if defined $d && $d < $e->{ts};
	}

	# final states
	my @ids = sort { $a <=> $b } keys %job;
	my %final;
	my $no_final = 0;
	if (@ids)
	{
		# what job(id) says, read in bulk (a soak has hundreds of thousands
		# of ids; job() per id took minutes): pgjq.job first, then the
		# history, the completions, and job() itself for the rest (the ring)
		my $rows = ctl_sql(
			"WITH ids AS (SELECT DISTINCT x AS id FROM unnest('{"
			  . join(',', @ids) . "}'::bigint[]) x)," . q{
			  found AS (
			    SELECT 1 AS src, j.id, CASE j.state WHEN 's' THEN 'scheduled' WHEN 'w' THEN 'waiting' ELSE 'ready' END AS state,
			           j.attempt, j.max_attempts, q.name AS queue, j.last_error
			      FROM pgjq.job j JOIN ids USING (id) LEFT JOIN pgjq.queue q USING (queue_id) WHERE j.state <> 'n'
			    UNION ALL
			    SELECT 2, h.id, CASE h.state WHEN 'd' THEN 'dead' ELSE 'cancelled' END,
			           h.attempt, h.max_attempts, q.name, h.last_error
			      FROM pgjq.job_history h JOIN ids USING (id) LEFT JOIN pgjq.queue q USING (queue_id)
			    UNION ALL
			    SELECT 3, u.id, 'completed', u.attempt, NULL, q.name, NULL
			      FROM pgjq.job_done d CROSS JOIN LATERAL unnest(d.ids, d.attempts) u(id, attempt)
			      JOIN ids ON ids.id = u.id LEFT JOIN pgjq.queue q ON q.queue_id = d.queue_id),
			  firsts AS (SELECT DISTINCT ON (id) * FROM found ORDER BY id, src)
			SELECT id, state, attempt, max_attempts, queue, last_error FROM firsts
			UNION ALL
			SELECT u.id, j.state, j.attempt, j.max_attempts, j.queue, j.last_error
			  FROM ids u LEFT JOIN LATERAL pgjq.job(u.id) j ON true
			 WHERE NOT EXISTS (SELECT 1 FROM firsts f WHERE f.id = u.id)}, 'job()');
		$no_final = !defined $rows;    # reported as such, not job by job
		for (split /\n/, $rows // '')
		{
			my ($id, $state, $att, $max, $q, $err) = split /\|/, $_, 6;
			$final{$id} = { state => $state, att => $att, max => $max, queue => $q, err => $err };
		}
	}

	my (@late, @late_restart, %completed_per_q);
	for my $id (@ids)
	{
		my $j = $job{$id};
		my $f = $final{$id};
		my @claims = sort { $a->{tok} <=> $b->{tok} } @{ $j->{claims} };
		my @outs = @{ $j->{outs} };
		my $is_cron = grep { $_->{mark} eq 'cron' } @claims;
		next unless @{ $j->{enq} } || $is_cron;
		$n{cron_jobs}++ if $is_cron;
		my ($e) = sort { $a->{ts} <=> $b->{ts} } @{ $j->{enq} };

		# terminal state explained
		my @ack_done = grep { $_->{k} eq 'c' && $_->{res} eq 't' } @outs;
		my @lost_out = grep { $_->{res} eq '?' } @outs;
		my $state = $f->{state} // '';
		$completed_per_q{ $f->{queue} }++ if $state eq 'completed';
		if ($no_final)
		{
		}
		elsif ($state eq '')
		{
			$anomaly->("job $id: gone (pgjq.job() finds nothing) after a committed enqueue");
		}
		elsif ($state eq 'completed')
		{
			$anomaly->("job $id: completed " . scalar(@ack_done) . ' times (acknowledged)')
			  if @ack_done > 1;
			$anomaly->("job $id: completed without an acknowledged or attempted completion")
			  if !@ack_done && !grep { $_->{k} eq 'c' } @lost_out;
			my @cx = grep { $_->{res} eq 't' } @{ $j->{cancels} };
			$anomaly->("job $id: completed though cancel() said true at $cx[0]{ta}")
			  if @cx && @ack_done && $ack_done[0]{ts} > $cx[0]{ta};
		}
		elsif ($state eq 'dead')
		{
			$anomaly->("job $id: dead at attempt $f->{att} of $f->{max} without a fail that said dead ($f->{err})")
			  if $f->{att} < $f->{max}
			  && !grep { $_->{k} eq 'f' && ($_->{res} eq 'dead' || $_->{res} eq '?') } @outs;
		}
		elsif ($state eq 'cancelled')
		{
			$anomaly->("job $id: cancelled without a cancel ($f->{err})")
			  if !grep { $_->{res} eq 't' || $_->{res} eq '?' } @{ $j->{cancels} }
			  and ($f->{err} // '') !~ /^dependency \d+ ended/;
		}
		else
		{
			$anomaly->("job $id: $state after the drain (attempt $f->{att})");
		}
		$anomaly->("job $id: completion acknowledged at $ack_done[0]{ta}, but the job is $state")
		  if @ack_done && $state ne 'completed' && !$no_final;

		# claims: tokens, leases, run_at, completed jobs never come back
		my $prev;
		for my $c (@claims)
		{
			if ($prev && $prev->{tok} == $c->{tok})
			{
				$anomaly->("job $id: token $c->{tok} handed out twice");
				next;
			}
			for my $d (@ack_done)
			{
				$anomaly->(
					"job $id: claimed again (token $c->{tok}, attempt $c->{att}, at $c->{ts}) after its completion (token $d->{tok}) was acknowledged at $d->{ta}"
				) if $c->{ts} > $d->{ta} || $c->{tok} > $d->{tok};
			}
			my $start = $c->{lu} - $c->{lease};
			if ($prev && $start < $prev->{lu} - 0.005)
			{
				my $released = grep { $_->{tok} == $prev->{tok} && $_->{ts} < $c->{ta} } @outs;
				$anomaly->(
					sprintf('job %s: token %s leased from %.3f while token %s held it until %.3f',
						$id, $c->{tok}, $start, $prev->{tok}, $prev->{lu}))
				  unless $released;
			}
			# not before it was due
			my $not_before;
			my $me = $c->{mark} ne 'cron' && $marker{ $c->{mark} } ? $marker{ $c->{mark} }{e} : undef;
			if (!$prev && $me)
			{
				# the enqueue that made it (a dedup key's later ones made nothing)
				$not_before = $me->{ts} + $me->{delay};
				$not_before = $resume if $me->{queue} eq $ctx->{queue}{paused} && (!defined $resume || $resume > $not_before);
			}
			elsif ($prev)
			{
				my ($o) = grep { $_->{tok} == $prev->{tok} && $_->{st} eq 'ok' && ($_->{k} eq 'f' && $_->{res} eq 'retry' || $_->{k} eq 's' && $_->{res} eq 't') } @outs;
				$not_before = $o->{ts} + $o->{arg} if $o;
			}
			$anomaly->(sprintf('job %s: claimed (token %s) at %.3f, before it was due at %.3f',
					$id, $c->{tok}, $c->{ta}, $not_before))
			  if defined $not_before && defined $c->{ta} && $c->{ta} < $not_before - 0.002;
			$prev = $c;
		}
		# dependencies: never claimed before every dependency completed
		if ($e && $e->{after} ne '-' && @claims)
		{
			for my $dep (split /,/, $e->{after})
			{
				my $dj = $job{$dep};
				my $df = $final{$dep} // {};
				next if ($df->{state} // '') ne 'completed';
				my @dc = sort { $a <=> $b } map { $_->{ts} } grep { $_->{k} eq 'c' } @{ $dj->{outs} };
				$anomaly->(sprintf('job %s: claimed at %.3f before its dependency %s was completed (first try %s)',
						$id, $claims[0]{ta}, $dep, $dc[0] // 'never'))
				  if $claims[0]{ta} && (!@dc || $claims[0]{ta} < $dc[0]);
			}
		}
		# a valid lease's outcome is not refused as stale
		for my $o (@outs)
		{
			next unless $o->{st} eq 'ok' && ($o->{res} eq 'f' || $o->{res} eq 'stale');
			next if @{ $j->{cancels} };
			my ($c) = grep { $_->{tok} == $o->{tok} } @claims;
			next unless $c;
			my $newer = grep { $_->{tok} > $o->{tok} } @claims;
			$anomaly->(sprintf('job %s: %s of token %s refused as stale at %.3f, its lease valid until %.3f',
					$id, $o->{k}, $o->{tok}, $o->{ta}, $c->{lu}))
			  if $o->{ta} < $c->{lu} - 0.1 && !$newer;
		}

		# lateness: from when each claim was due (or when the server came
		# back, if it was due before a restart)
		$prev = undef;
		for my $c (@claims)
		{
			my $due;
			if (!$prev)
			{
				if ($e && $e->{st} eq 'ok' && $e->{after} eq '-' && $e->{dedup} eq '-')
				{
					$due = $e->{ta} + $e->{delay};
					$due = $resume if $e->{queue} eq $ctx->{queue}{paused};
				}
			}
			else
			{
				my @po = grep { $_->{tok} == $prev->{tok} } @outs;
				if (!@po)
				{
					# abandoned (or its holder's lease): expiry, then backoff
					$due = $prev->{lu} + 1.0;
				}
				elsif ($po[0]{st} eq 'ok' && ($po[0]{res} eq 'retry' || $po[0]{k} eq 's' && $po[0]{res} eq 't'))
				{
					$due = $po[0]{ta} + $po[0]{arg};
				}
			}
			$prev = $c;
			next unless defined $due && defined $c->{ta};
			# the time the server was down (or the clients held back) does
			# not count, but a job stranded before a restart does
			my $lat = $c->{ta} - $due;
			my $after_restart = 0;
			for my $w (@windows)
			{
				my ($lo, $hi) = ($w->{down} > $due ? $w->{down} : $due, $w->{open} < $c->{ta} ? $w->{open} : $c->{ta});
				next unless $hi > $lo;
				$lat -= $hi - $lo;
				$after_restart = 1;
			}
			$lat = 0 if $lat < 0;
			push @late, $lat;
			push @late_restart, $lat if $after_restart;
			$anomaly->(sprintf('job %s: handed out %.1f s after it was due (token %s, due %.3f%s)',
					$id, $lat, $c->{tok}, $due, $after_restart ? ', after a restart' : ''))
			  if $lat > $late_bound;
		}
	}

	# queue_stats against the ledger
	my $stats = ctl_sql(
		'SELECT queue, ready, scheduled, running, waiting, completed FROM pgjq.queue_stats WHERE queue IN ('
		  . join(',', map { sqlq($_) } values %{ $ctx->{queue} }) . ')', 'queue_stats') // '';
	for (split /\n/, $stats)
	{
		my ($qn, $ready, $sched, $running, $waiting, $completed) = split /\|/;
		$anomaly->("queue_stats $qn: ready $ready, scheduled $sched, running $running, waiting $waiting after the drain")
		  if $ready + $sched + $running + $waiting;
		$anomaly->("queue_stats $qn: completed $completed, but " . ($completed_per_q{$qn} // 0) . ' jobs are')
		  if $completed != ($completed_per_q{$qn} // 0);
	}
	$anomaly->("the drain left $left jobs unfinished") if $left ne '0';
	$anomaly->("the cron schedule fired no job in $load_time s")
	  if $prof->{mix} && !$n{cron_jobs} && $load_time > 70;
	my %seen;
	$anomaly->($_) for @$verify_fail, grep { !$seen{$_}++ } @ctl_errors;
	@ctl_errors = ();
	$anomaly->("only $nrestart restarts") if $nrestart < @{ $prof->{deck} } && !defined $minutes;

	my $summary = sprintf(
		'torture %s run %d (seed %d): %.0f s load, %.0f s drain; restarts %d (%s); enqueue calls %d (%d jobs acknowledged, %d lost calls of which %d seen committed, %d refused at 54000); claims %d in %d calls (%d lost); completions %d acknowledged; stale outcomes refused %d; outcome calls lost %d; cancels %d; cron jobs %d; lateness p50 %s p99 %s max %s s (after restarts: n %d, p99 %s, max %s); anomalies %d',
		$prof->{name}, $ctx->{run}, $seed, $load_time, $drain_time, $nrestart,
		join(' ', map { "$_ $kinds->{$_}" } sort keys %$kinds),
		$n{enqueue_calls} // 0, $n{jobs_acked} // 0, $n{enqueue_lost} // 0,
		$n{lost_enqueue_committed} // 0, $n{'enqueue_err:54000'},
		$n{claims} // 0, $n{claim_calls} // 0, $n{claim_lost} // 0, $n{completions} // 0,
		$n{stale_refused} // 0, $n{outcome_lost} // 0, $n{cancel_calls} // 0, $n{cron_jobs} // 0,
		pct(0.5, @late), pct(0.99, @late), pct(1, @late), scalar(@late_restart),
		pct(0.99, @late_restart), pct(1, @late_restart), scalar @anom);
	my @other_err = grep { /^(enqueue|claim|outcome)_err:/ && $_ ne 'enqueue_err:54000' } sort keys %n;
	$summary .= '; errors: ' . join(', ', map { "$_ $n{$_}" } @other_err) if @other_err;
	diag $summary;
	if (@anom)
	{
		# by kind (numbers left out), then the first ones, all in a file
		my %kind;
		for (@anom)
		{
			(my $k = $_) =~ s/\d[\d.]*/N/g;
			$kind{$k}++;
		}
		diag sprintf('%6d x %s', $kind{$_}, $_) for sort { $kind{$b} <=> $kind{$a} } keys %kind;
		open my $af, '>', "$dir/anomalies" or die;
		print $af "$_\n" for @anom;
		close $af;
		diag "anomaly: $_" for @anom[ 0 .. ($#anom < 40 ? $#anom : 40) ];
		diag '... ' . (@anom - 41) . ' more' if @anom > 41;
		diag "ledger kept in $dir";
	}
	ok(!@anom, "$prof->{name} run $ctx->{run}: no anomaly");
	return { anomalies => scalar @anom, summary => $summary };
}
