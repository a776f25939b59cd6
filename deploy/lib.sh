# Shell functions the local service scripts share (deploy/kafka/local.sh, deploy/schema-registry/local.sh).
# Sourced, never run. Each function takes what differs between the services as arguments, so a script keeps
# its own names, paths and messages; what is the same (a Maven resolve with its output kept for a failure,
# a pid file checked against the process it names, a TERM then KILL bounded stop, a status line) lives here
# once.

die() { echo "local.sh: $*" >&2; exit 1; }

maven_copy() {
  # maven_copy POM REPO OUTDIR WHAT [MAVEN ARGS...]: copy POM's dependencies into OUTDIR through the local
  # Maven repository REPO; on failure print Maven's output and die naming WHAT.
  local pom="$1" repo="$2" outdir="$3" what="$4" out
  shift 4
  command -v mvn >/dev/null 2>&1 || die "mvn not found: install Maven (Debian package 'maven')"
  out="$(dirname "$pom")/.fetch.out"
  if ! mvn -q -B -f "$pom" -Dmaven.repo.local="$repo" \
      dependency:copy-dependencies -DoutputDirectory="$outdir" "$@" >"$out" 2>&1; then
    cat "$out" >&2
    die "resolving $what from Maven Central failed (see the Maven output above)"
  fi
  rm -f "$out"
}

fetch_marker() {
  # fetch_marker DIR POM: the marker a complete fetch leaves in DIR, named by POM's digest (a changed pom.xml
  # fetches again; an interrupted fetch left no marker and is retried).
  echo "$1/.complete-$(sha256sum "$2" | cut -c1-16)"
}

pid_from_file() {
  # pid_from_file PIDFILE PATTERN: prints the pid PIDFILE names when that process is alive and its command
  # line contains PATTERN (a pid reused by another program does not count).
  [ -f "$1" ] || return 1
  local pid
  pid="$(cat "$1")"
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  grep -q -- "$2" "/proc/$pid/cmdline" 2>/dev/null || return 1
  echo "$pid"
}

stop_pid() {
  # stop_pid NAME PID PIDFILE TIMEOUT_S WHERE: SIGTERM (a clean shutdown), SIGKILL after TIMEOUT_S seconds,
  # then the pid file removed. Polls every 0.1 s, so a quick shutdown returns at once.
  local name="$1" pid="$2" pidfile="$3" timeout_s="$4" where="$5" waited=0
  kill -TERM "$pid" 2>/dev/null || true
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$waited" -ge $((timeout_s * 10)) ]; then
      echo "$name: no clean shutdown after ${timeout_s} s, killing pid $pid" >&2
      kill -KILL "$pid" 2>/dev/null || true
      break
    fi
    sleep 0.1
    waited=$((waited + 1))
  done
  rm -f "$pidfile"
  echo "$name: stopped ($where)"
}
