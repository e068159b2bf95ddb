#!/usr/bin/env bash
# Runs every test of the suite: formatting, lints, the unit, integration,
# binary and conformance tests against the OpenStack emulator (the
# root-only ones use real loop devices and mounts, and clean up after
# themselves), then the real tier against a real OpenStack (with Ceph)
# brought up on loopback by tests/openstack/cloud.py, then the cluster
# tier (deploy/suite from our images in a real single-node Kubernetes,
# tests/cluster/cluster.py), and takes both down again.
#
# Everything is compiled once: one `cargo test --no-run` of the workspace
# (the same profile and features as the binaries the tests start), whose
# test programs every phase then runs directly; the container images are
# made from the same binaries. The closing line counts
# each test once: passed, failed, or skipped (ignored in every phase that
# ran it).
#
# The cloud's state stays in .openstack-cloud (databases, Ceph's sparse
# OSD file, logs: about 400 MB) so that the next run starts faster;
# `python3 tests/openstack/cloud.py down --purge` removes it.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $(id -u) != 0 ]]; then
  echo "scripts/test.sh needs root: loop devices, mounts, mount namespaces, and the test cloud's services" >&2
  echo "(without root, \`cargo test --workspace\` fails the tests that need root; TESTS_WITHOUT_ROOT=skip makes them say they skipped)" >&2
  exit 2
fi

cloud_profile=${OS_TEST_CLOUD_PROFILE:-all}
work=$(mktemp -d)
log=$work/tests.log
cloud_started=
cluster_started=
cleanup() {
  # everything here is tried, whatever fails: after a TERM to the run's
  # process group the processes it stops may be gone already
  set +e
  local lane
  if [[ -z $run_finished ]]; then
    echo "the run ended early, after $SECONDS s (the phases still running are not in the timeline)"
    time_and_failures || true
    # what was still running, in any lane, and what a lane had seen fail
    # (the main lane's failures are printed above; lanes number their
    # phases from 1000)
    [[ -e $work/step.running ]] && echo "running: $(cat "$work/step.running") (a step of the run)"
    local f
    for f in "$work"/phase-*.out.running "$work"/phase-[1-9]???.out.failed; do
      [[ -e $f ]] || continue
      echo "${f##*.out.}: $(cat "${f%.*}.name" 2>/dev/null); its last lines:"
      grep -E -A3 '\.\.\. FAILED$|panicked at' "${f%.*}" 2>/dev/null | head -n 12 | sed 's/^/   | /'
      tail -n 6 "${f%.*}" 2>/dev/null | sed 's/^/   | /'
    done
  fi
  for lane in "${!lane_pid[@]}"; do kill -- "${lane_pid[$lane]}" 2>/dev/null; done
  if [[ -n ${disk_sampler_pid:-} ]]; then
    kill -STOP "$disk_sampler_pid" 2>/dev/null
    pkill -P "$disk_sampler_pid" sleep 2>/dev/null
    kill -KILL "$disk_sampler_pid" 2>/dev/null
    disk_summary
  fi
  # a cloud still coming up is waited for, then taken down below
  [[ -n ${cloud_up_pid:-} ]] && wait "$cloud_up_pid" 2>/dev/null
  if [[ -n $cluster_started ]]; then
    # the cluster's containers' logs (every plugin, sidecar and mount pod
    # still there, and each container's previous run), which `down`
    # removes with the pods: kept with the plugins' logs of a failed run
    if ((${#failed_phases[@]})); then
      keep_cluster_logs "$work/logs/cluster" || true
    fi
    python3 tests/cluster/cluster.py down || true
  fi
  if [[ -n $cloud_started ]]; then
    python3 tests/openstack/cloud.py down || true
  fi
  # the plugins' logs of a failed run are kept for whoever reads it
  if ((${#failed_phases[@]})) && [[ -d $work/logs ]] && [[ -n $(ls -A "$work/logs") ]]; then
    rm -rf target/test-logs && mkdir -p target && cp -r "$work/logs" target/test-logs
    echo "the plugins' logs of this failed run: target/test-logs"
  fi
  rm -rf "$work"
}
# keep_cluster_logs DIR: kubelet's container logs of every node (its
# podLogsDir, <namespace>_<pod>_<uid>/<container>/<restart>.log)
keep_cluster_logs() {
  local dir=$1 state=${K8S_TEST_CLUSTER_DIR:-.k8s-cluster} logs node
  while IFS= read -r logs; do
    node=$(basename "$(dirname "$logs")")
    [[ $logs == "$state/pod-logs" ]] && node=a
    mkdir -p "$dir/$node" && cp -rL "$logs/." "$dir/$node/" 2>/dev/null
  done < <(find "$state" -maxdepth 3 -type d -name pod-logs 2>/dev/null)
}
trap cleanup EXIT
# a run stopped from outside (CI's time limit, ^C) still ends through
# cleanup, which then says where the time went and what had failed: the
# tail of a cut-off CI log is the only part some readers get
trap 'exit 143' TERM
trap 'exit 130' INT
run_finished=
# where the run's time went, and each failed phase's last lines
time_and_failures() {
  echo "where the time went (start, end in s from the run's start; lanes overlap):"
  sort -n "$work/timeline" 2>/dev/null | sed 's/^/   /'
  local i
  for i in "${!failed_phases[@]}"; do
    echo "failed: ${failed_phases[$i]}; what failed, and its last lines:"
    # (a campaign's seed first: it replays the run)
    { grep -E '^campaign seed' "${failed_outs[$i]}" | head -n 2 || true
      grep -E -A3 '\.\.\. FAILED$|panicked at|left behind|[Ee]rror:' "${failed_outs[$i]}" | head -n 16 || true
      echo "..."
      tail -n 4 "${failed_outs[$i]}"; } 2>/dev/null | sed 's/^/   | /'
  done
}
failed_phases=()
# each failed phase's output, in the order of failed_phases
failed_outs=()
# the tests' plugin logs go here, not into /tmp
export TEST_LOG_DIR=$work/logs

# background_job FUNCTION: test phases run beside the next ones (CPU-bound
# phases beside ones that mostly wait on kubelet, the controllers or the
# cloud); FUNCTION calls `tests` for each; their output and verdicts come
# at await_background. A second job (second_lane, await_second_lane) runs
# beside the first where three things wait on different services.
declare -A lane_pid=()
failed_background=0
lane_job() {
  local lane=$1; shift
  # phase numbers of their own: their output files are known, and no
  # other phase's
  ( phases=$((lane * 1000)); "$@" ) >"$work/background-$lane.out" 2>&1 &
  lane_pid[$lane]=$!
}
lane_await() {
  local lane=$1 failed rc=0
  # its phases record their own failures and the job goes on: a job that
  # ends non-zero died outside them (an error of the script, a signal),
  # and may have lost phases it never ran
  wait "${lane_pid[$lane]}" || rc=$?
  unset "lane_pid[$lane]"
  if ((rc)); then
    failed_phases+=("a background job ended with status $rc outside its phases (phases after it never ran)")
    cp "$work/background-$lane.out" "$work/failed-background-$((++failed_background)).out"
    failed_outs+=("$work/failed-background-$failed_background.out")
  fi
  cat "$work/background-$lane.out"
  for failed in "$work"/phase-"$lane"???.out.failed; do
    [[ -e $failed ]] || continue
    # kept aside: a later background job's phases reuse these numbers
    cp "${failed%.failed}" "$work/failed-background-$((++failed_background)).out"
    failed_phases+=("$(cat "${failed%.failed}.name")")
    failed_outs+=("$work/failed-background-$failed_background.out")
    rm -f "$failed"
  done
}
background_job() { lane_job 1 "$@"; }
# background_tests NAME COMMAND...: one test phase so
background_tests() { background_job tests "$@"; }
await_background() { lane_await 1; }
second_lane() { lane_job 2 "$@"; }
await_second_lane() { lane_await 2; }

phase() {
  local name=$1; shift
  local start=$SECONDS
  echo "== $name"
  echo "$name" >"$work/step.running"
  "$@"
  rm -f "$work/step.running"
  echo "== $name: $((SECONDS - start)) s"
  timeline "$start" "$name"
}
# timeline START NAME: when a phase ran, in seconds from the run's start
# (its lane's phases too: a subshell's SECONDS goes on counting), printed
# at the end, sorted: where a run's time went
timeline() { printf '%5d %5d  %.70s\n' "$1" "$SECONDS" "$2" >>"$work/timeline"; }

# A test phase: a failure is recorded and the run goes on, so that one
# failing test does not hide the others; the run fails at the end, and
# repeats the last lines of each failed phase there (a CI log that keeps
# only its head and tail still shows why).
phases=0
tests() {
  local name=$1; shift
  local start=$SECONDS out=$work/phase-$((++phases)).out
  echo "== $name"
  echo "$name" >"$out.name"
  rm -f "$out.failed"
  touch "$out.running"
  { "$@" || touch "$out.failed"; } 2>&1 | tee "$out"
  rm -f "$out.running"
  if [[ -e $out.failed ]]; then
    failed_phases+=("$name")
    failed_outs+=("$out")
  fi
  # this tier's own count (the closing line counts each test once)
  local passed failed ignored
  passed=$(grep -c -E '^test .* \.\.\. ok$' "$out" || true)
  failed=$(grep -c -E '^test .* \.\.\. FAILED$' "$out" || true)
  ignored=$(grep -c -E '^test .* \.\.\. ignored' "$out" || true)
  timeline "$start" "$name"
  if ((passed + failed + ignored > 0)); then
    echo "== $name: $((SECONDS - start)) s; $passed passed, $failed failed, $ignored not run here"
    return
  fi
  # not a test program: say what it did (suite-walk's steps), or that its
  # exit status is its verdict
  local steps_ok steps_failed steps_skipped verdict=passed
  [[ -e $out.failed ]] && verdict=failed
  steps_ok=$(grep -c -E '^  ok    ' "$out" || true)
  steps_failed=$(grep -c -E '^  FAIL  ' "$out" || true)
  steps_skipped=$(grep -c -E '^  skip  ' "$out" || true)
  if ((steps_ok + steps_failed + steps_skipped > 0)); then
    echo "== $name: $((SECONDS - start)) s; $verdict: $steps_ok steps passed, $steps_failed failed, $steps_skipped skipped"
  else
    echo "== $name: $((SECONDS - start)) s; $verdict (a step of the run, not a test program: its exit status is the verdict)"
  fi
}

# Skips a tier declares: test-name prefixes (one per line) whose skips are
# expected; any other test skipped in every phase fails the run. The
# community csi-sanity runs judge their own skips (each must have a known
# reason, or its test fails).
echo "csi-sanity-" >"$work/declared-skips"
# a smaller test cloud is a choice stated here: its contract tests count
# as skipped (declared), never as passed
if [[ -n ${OPENSTACK_TEST_MISSING_SERVICES:-} ]]; then
  echo "OPENSTACK_TEST_MISSING_SERVICES=$OPENSTACK_TEST_MISSING_SERVICES: the contract tests that need those services count as skipped"
  echo "openstack-client/contract::" >>"$work/declared-skips"
fi

# Builds every test program and bench once; writes "package target path
# dir" lines (benches apart: they run in their own phase, quick).
build_tests() {
  cargo test --workspace --locked --no-run --tests --benches --message-format=json-render-diagnostics >"$work/build.json"
  python3 - "$work/build.json" "$work/benches" >"$work/programs" <<'EOF'
import json, os, sys
benches = open(sys.argv[2], "w")
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        pkg = m["package_id"].split("#")[0].rstrip("/").rsplit("/", 1)[-1].split("@")[0]
        if "#" in m["package_id"] and "@" in m["package_id"].split("#")[1]:
            pkg = m["package_id"].split("#")[1].split("@")[0]
        out = benches if "bench" in m["target"]["kind"] else sys.stdout
        print(pkg, m["target"]["name"], m["executable"], os.path.dirname(m["manifest_path"]), file=out)
EOF
  echo "$(wc -l <"$work/programs") test programs, $(wc -l <"$work/benches") benches"
}

# run_bench PACKAGE TARGET: one bench in its quick mode (a handful of
# iterations: it must run through; its figures are printed, not judged),
# counted as the test bench/PACKAGE/TARGET.
run_bench() {
  local pkg=$1 target=$2 p t exe dir
  while read -r p t exe dir; do
    [[ $p == "$pkg" && $t == "$target" ]] || continue
    echo "     Running bench $p/$t (BENCH_QUICK=1)"
    if (cd "$dir" && BENCH_QUICK=1 "$exe" </dev/null) 2>&1 | sed 's/^/   | /'; then
      echo "test bench/$p/$t ... ok" | tee -a "$log"
      return 0
    fi
    echo "test bench/$p/$t ... FAILED" | tee -a "$log"
    return 1
  done <"$work/benches"
  echo "no bench $pkg/$target" >&2
  return 1
}
# every bench but the cluster's (which needs the cluster: its own phase)
quick_benches() {
  local failed=0 p t rest
  while read -r p t rest; do
    [[ $p == cluster-tests ]] && continue
    run_bench "$p" "$t" || failed=1
  done <"$work/benches"
  return $failed
}

# run_tests PACKAGE TARGET [ARGS...]: one test program (from its package's
# directory, as cargo runs it); "all" runs every program. Test lines in the
# log carry the program's name.
run_tests() {
  local pkg=$1 target=$2; shift 2
  local found= failed=0
  while read -r p t exe dir; do
    [[ $pkg == all || ($p == "$pkg" && $t == "$target") ]] || continue
    found=1
    echo "     Running $p/$t"
    (cd "$dir" && "$exe" "$@" </dev/null) 2>&1 \
      | sed -u -e "s|^test \([^ ]*\) \.\.\. |test $p/$t::\1 ... |" \
          -e "s|^---- \([^ ]*\) stdout ----\$|---- $p/$t::\1 stdout ----|" | tee -a "$log" || failed=1
  done <"$work/programs"
  [[ -n $found ]] || { echo "no test program $pkg/$target" >&2; return 1; }
  return $failed
}

# run_tests_of in|out "PKG/TARGET ...": every test program named in the
# list (in), or every one not named there (out)
run_tests_of() {
  local which=$1 list=" $2 " p t exe dir failed=0 named found=" "
  while read -r p t exe dir; do
    named=out
    [[ $list == *" $p/$t "* ]] && named=in && found+="$p/$t "
    [[ $named == "$which" ]] || continue
    run_tests "$p" "$t" || failed=1
  done <"$work/programs"
  # a program of the list renamed or gone would run in neither lane
  [[ $which == in ]] && for named in $2; do
    [[ $found == *" $named "* ]] || { echo "no test program $named (named in the emulator tier's lanes)" >&2; failed=1; }
  done
  return $failed
}

# fuzzing: each target of fuzz/ for a bounded time over its committed
# seeds (what it finds goes to a scratch corpus), without a sanitizer (the
# code is safe Rust; the targets' assertions are the oracles); a crash
# fails the run, and each target counts as a test in the summary
# (FUZZ_TOOLS_DIR, FUZZ_TARGET_DIR: where cargo-fuzz is installed and the
# targets are built; .ci/run keeps both on the machine between fresh clones)
fuzzing() {
  local version=0.13.2 failed=0 t
  local tools=${FUZZ_TOOLS_DIR:-$PWD/target/tools} build=${FUZZ_TARGET_DIR:-$PWD/fuzz/target}
  export PATH=$tools/bin:$PATH
  if [[ $(cargo-fuzz --version 2>/dev/null) != "cargo-fuzz $version" ]]; then
    echo "installing cargo-fuzz $version into $tools"
    cargo install --quiet --locked --version "$version" --root "$tools" cargo-fuzz
  fi
  (cd fuzz && cargo fuzz build -s none --target-dir "$build") || return 1
  for t in $(cd fuzz && cargo fuzz list); do
    mkdir -p "$work/fuzz/$t" "$work/fuzz/tmp"
    # the targets' fixtures go under TMPDIR: removed with $work
    if (cd fuzz && TMPDIR="$work/fuzz/tmp" cargo fuzz run -s none --target-dir "$build" "$t" "$work/fuzz/$t" "seeds/$t" \
          -- -max_total_time="${FUZZ_SECONDS:-20}") >"$work/fuzz-$t.log" 2>&1; then
      echo "test fuzz/$t ... ok" | tee -a "$log"
      grep -E '^Done [0-9]+ runs' "$work/fuzz-$t.log" || true
    else
      echo "test fuzz/$t ... FAILED" | tee -a "$log"
      grep -E -A8 'panicked at|^ERROR|^SUMMARY' "$work/fuzz-$t.log" | head -n 40
      grep -E 'Test unit written to' "$work/fuzz-$t.log" || true
      failed=1
    fi
  done
  return $failed
}

# free disk where the build, the cloud and the cluster keep their state,
# in MiB: sampled through the run, its lowest printed at the end (a CI
# machine has run out of space twice: the figure says how near each run
# comes)
free_disk_mib() { df -Pm . | awk 'NR == 2 { print $4 }'; }
disk_at_start=$(free_disk_mib)
echo "disk: $disk_at_start MiB free at the start (df -m .)"
# what held the space near the lowest point: the places the run fills,
# measured again each time the free space fell another 512 MiB
disk_holders() {
  nice -n 19 du -smx target/debug target/release target/images .openstack-cloud \
    .k8s-cluster "${FUZZ_TARGET_DIR:-fuzz/target}" 2>/dev/null |
    awk '{ printf "%s%s %s MiB", sep, $2, $1; sep = ", " }'
}
(
  lowest=$disk_at_start
  measured=$disk_at_start
  while sleep 5; do
    now=$(free_disk_mib)
    ((now < lowest)) || continue
    lowest=$now
    echo "$lowest" >"$work/disk-lowest"
    if ((measured - now >= 512)); then
      measured=$now
      echo "$(disk_holders) (at $now MiB free)" >"$work/disk-holders"
    fi
  done
) &
disk_sampler_pid=$!
# killed at the end without a word from the shell's job control
disown "$disk_sampler_pid"
disk_summary() {
  local lowest
  lowest=$(cat "$work/disk-lowest" 2>/dev/null || echo "$disk_at_start")
  echo "disk: $disk_at_start MiB free at the start, $lowest MiB at the lowest (the run took up to $((disk_at_start - lowest)) MiB)"
  [[ -s $work/disk-holders ]] && echo "disk, where it went: $(cat "$work/disk-holders")"
}

phase "prerequisites" bash scripts/install-test-deps.sh
# the test cloud comes up beside the build and the emulator tier (its
# services mostly wait on their own start, and on cargo's lock for its
# two binaries); its output and verdict come where the real tier starts
cloud_started=1
# (its status also in a file: the cluster's lane waits for it there)
(
  rc=0
  python3 tests/openstack/cloud.py up "$cloud_profile" >"$work/cloud-up.out" 2>&1 || rc=$?
  echo "$rc" >"$work/cloud-up.rc"
  exit "$rc"
) &
cloud_up_pid=$!
cloud_up() {
  local rc=0
  wait "$cloud_up_pid" || rc=$?
  cloud_up_pid=
  cat "$work/cloud-up.out"
  return $rc
}
phase "cargo fmt --check" cargo fmt --all -- --check
phase "cargo fmt --check (fuzz/)" cargo fmt --manifest-path fuzz/Cargo.toml -- --check
phase "manifests (deploy/)" python3 deploy/validate.py
# the charts through Helm's own engine (no cluster): lint, renderings
# with upstream-shaped values, and the default one against deploy/
tests "Helm charts (charts/: lint, renderings, no drift from deploy/)" python3 tests/helm/charts.py
phase "build the tests once" build_tests
# the tests start the binaries of that build (no cargo run inside a test)
export CSI_SANITY_PLUGIN_DIR=$PWD/target/debug
# the cluster tier: deploy/suite from the images of this build in a real
# Kubernetes of three nodes on this cloud (A in the host's namespaces, B
# and C each in their own; C in the second zone); without Kubernetes
# binaries (KUBE_BIN_DIR) it says so and its scenarios count as skipped
cluster_up() {
  local rc=0
  python3 tests/cluster/cluster.py up || rc=$?
  if ((rc == 3)); then
    echo "cluster tier SKIPPED: its inputs are missing (see above); its scenarios count as skipped"
    echo "cluster-tests/" >>"$work/declared-skips"
    return 0
  fi
  ((rc == 0)) && touch "$work/cluster-up"
  return $rc
}
# its first phases run in a lane of their own from the end of the build,
# beside the emulator and real tiers: the container images, then (the
# cloud up) the cluster, its KMS phase and the KMS chart's cold start.
# Those need only Keystone and Barbican of the cloud (the real tier's
# faults and outages are Cinder's and Manila's; its fault rules match
# POSTs and DELETEs of volumes, shares and attachments, which the cluster
# makes none of then) and restart the cluster's apiservers, or its whole
# control plane, so they cannot run beside the cluster's other phases;
# they mostly wait on those restarts and on kubelet
cluster_lane() {
  unset OPENSTACK_TEST_BACKEND
  tests "the container images (deploy/images), checked against deploy/suite" \
    env IMAGE_PROFILE=debug IMAGE_BASE_CACHE="${IMAGE_BASE_CACHE:-$PWD/target/image-bases}" \
    bash deploy/images/build.sh target/images
  while [[ ! -e $work/cloud-up.rc ]]; do sleep 2; done
  # the node set-up over what an earlier cluster left (CI's clones meet
  # a cut-off run's namespaces): before `up`, which needs node B's names
  # free
  tests "cluster tier: a node's namespaces left by an earlier checkout are made again" \
    python3 tests/cluster/namespaces_test.py
  tests "cluster tier: Kubernetes v1.36 up, deploy/suite applied" cluster_up
  [[ -e $work/cluster-up ]] || return 0
  tests "cluster tier: KMS rotation, restarts and two control-plane nodes" \
    run_tests cluster-tests kms --ignored --test-threads=1 --show-output
  tests "cluster tier: the KMS chart serving an apiserver, through a cold start of the control plane" \
    python3 tests/helm/charts.py --cluster the_kms_charts_plugin_serves_the_apiserver
  # then, once the real tier is done with Cinder (its faults, an outage of
  # Cinder's API, csi-sanity's counts of the project's volumes), the
  # migrations from upstream's Cinder release and manifests, beside the
  # real tier's Manila phases: they use Cinder alone, and the cluster
  # (they replace its drivers for a while), which nothing else uses then
  while [[ ! -e $work/real-cinder-done ]]; do sleep 2; done
  # (they need upstream's charts/ and manifests/)
  [[ -n ${UPSTREAM_CPO_DIR:-} ]] || echo "helm/in-cluster/upstream-" >>"$work/declared-skips"
  tests "cluster tier: upstream's Cinder release and manifests replaced in place under writers, and back" \
    python3 tests/helm/charts.py --cluster upstream
}
cluster_started=1
second_lane cluster_lane
# the emulator tier in two lanes: its longest programs (csi-sanity's 44 s,
# then 21, 19, 16 and 7 s; they mostly wait on the emulator's realistic
# delays, not on the CPU) beside all the others (two lanes of 91 and
# 136 s with the first three alone)
emulator_long_programs="csi-sanity/drivers openstack-client/throttling csi-cinder/faults csi-cinder/controller csi-common/pre_stop"
background_tests "emulator tier (its longest programs)" run_tests_of in "$emulator_long_programs"
tests "emulator tier (every other test program)" run_tests_of out "$emulator_long_programs"
await_background
tests "benches, quick (each runs through; figures printed, not judged)" quick_benches
tests "doc tests" bash -o pipefail -c 'cargo test --workspace --locked --doc 2>&1 | tee -a "$0"' "$log"
# the community's csi-sanity, v5.4.0 and master, against each driver on
# the emulator; each of their specs is counted in the summary below
community_csi_sanity() {
  # the binaries are supplied by whoever runs the tests (CSI_SANITY_DIR:
  # csi-sanity-v5.4.0 and csi-sanity-master); without the variable this
  # tier says so and declares its tests skipped, as the cluster tier does;
  # a folder given that lacks one of them fails the run
  local dir=${CSI_SANITY_DIR:-} v missing=()
  if [[ -z $dir ]]; then
    echo "community csi-sanity SKIPPED: CSI_SANITY_DIR is not set;"
    echo "  its tests count as skipped (README: \"Supplying the Kubernetes and csi-sanity binaries\")"
    echo "csi-sanity/community::" >>"$work/declared-skips"
    return 0
  fi
  for v in v5.4.0 master; do
    [[ -x $dir/csi-sanity-$v ]] || missing+=("$dir/csi-sanity-$v")
  done
  if ((${#missing[@]})); then
    echo "community csi-sanity FAILED: CSI_SANITY_DIR=$dir lacks ${missing[*]}"
    return 1
  fi
  # two drivers at a time: each test has its own emulator, driver and
  # folders (Cinder's two runs take as long as Manila's four)
  local rc=0
  CSI_SANITY_RESULTS=$work/community.results \
    run_tests csi-sanity community --ignored --test-threads=2 --show-output || rc=$?
  [[ -f $work/community.results ]] && cat "$work/community.results" >>"$log"
  return $rc
}
community_phase="community csi-sanity v5.4.0 and master (Cinder, Manila NFS, Manila CephFS; emulator)"

phase "real OpenStack up ($cloud_profile; started with the run)" cloud_up
export OPENSTACK_TEST_BACKEND=real
# (their output shown: a test that skips at run time, for a service
# OPENSTACK_TEST_MISSING_SERVICES names, says so there, and is counted as
# skipped, not passed)
tests "contract tests (real OpenStack)" run_tests openstack-client contract --show-output
# (the tests that inject faults always use the emulator: not run again)
tests "KMS plugin against real Keystone + Barbican" run_tests kms-barbican plugin --skip _on_the_emulator
# Cinder's real-cloud phases (Cinder, Nova, the test server's loop
# devices) run beside Manila's (Manila, Ceph, Ganesha): they share no
# resource but Keystone, and each mostly waits on its services
cinder_on_the_real_cloud() {
  local rc=0
  run_tests csi-sanity drivers --ignored cinder_conforms_on_the_real_cloud --nocapture || rc=1
  run_tests csi-sanity drivers --ignored cinder_credentials_rotate_on_the_real_cloud --nocapture || rc=1
  run_tests csi-cinder real_cloud_faults --ignored --test-threads=1 || rc=1
  # the cluster's lane waits for this before it uses Cinder: what the
  # cluster must not meet is done (csi-sanity's counts of the project's
  # volumes, the fault proxy's rules, Cinder's outage); the rest makes
  # and checks volumes of its own only (its orphan report is of another
  # cluster's name), beside the cluster's first use of Cinder
  touch "$work/real-cinder-done"
  run_tests csi-cinder real_cloud --ignored || rc=1
  return $rc
}
background_tests "Cinder CSI on real Cinder + Nova (conformance, credentials rotated, zones, stuck attachments, throttled, lost answers, a late detach, an outage)" \
  cinder_on_the_real_cloud
tests "Manila CSI on real Manila + Ceph (ceph-fuse)" run_tests csi-manila real_cloud --ignored
tests "Manila CSI: read-only volumes backed by a snapshot (real Manila + Ceph, ceph-fuse)" \
  run_tests csi-manila real_cloud_backed --ignored --nocapture
tests "Manila CSI: group snapshots through share groups (real Manila + Ceph, ceph-fuse)" \
  run_tests csi-manila real_cloud_groups --ignored --nocapture
tests "Manila CSI conformance (real Manila + Ceph)" \
  run_tests csi-sanity drivers --ignored manila_cephfs_conforms_on_the_real_cloud --nocapture
tests "Manila NFS on real Manila + NFS-Ganesha (libnfs, stand-in mount.nfs)" \
  run_tests csi-manila real_cloud_nfs --ignored
tests "Manila NFS conformance (real Manila + NFS-Ganesha)" \
  run_tests csi-sanity drivers --ignored manila_nfs_conforms_on_the_real_cloud --nocapture
await_background
# after Cinder's fault tests: both set and clear the one fault proxy's rules
tests "Manila CSI on real Manila under faults (throttled, a lost answer, an outage; each fault shown served)" \
  run_tests csi-manila real_cloud_faults --ignored --test-threads=1
tests "preflight of the real cloud (suite-walk)" \
  target/debug/suite-walk --cloud-config .openstack-cloud/cloud-member.conf \
  --server "$(cat .openstack-cloud/test-server-id)" --share-type default
unset OPENSTACK_TEST_BACKEND
await_second_lane

dead_node=a_dead_nodes_pods_run_elsewhere_once_it_is_out_of_service_and_a_new_node_waits_for_its_drivers
fuzz_phase="fuzzing (each target ${FUZZ_SECONDS:-20} s over its seeds)"
lints_phase="cargo clippy (every target, warnings denied)"
lints=(cargo clippy --workspace --all-targets --locked -- -D warnings)
# the phases that need neither cloud nor cluster and mostly use the CPU:
# the lints, fuzzing and the community csi-sanity (clippy's own check of
# every crate, the fuzz targets' build and runs, csi-sanity's drivers and
# emulators: 72, 263 and 109 s beside the scenarios in one run)
cpu_phases() {
  tests "$lints_phase" "${lints[@]}"
  tests "$community_phase" community_csi_sanity
  # last: on a machine without the fuzz targets' build (its dependencies
  # compiled with the fuzzing flags: 19 min niced, cold) it goes on
  # beside the benches and the charts
  tests "$fuzz_phase" fuzzing
}
# with the cluster up they run niced beside its phases, which mostly
# wait on kubelet, the controllers and the cloud: they take what those
# leave (their own tests have timeouts of minutes, csi-sanity's too), in
# a lane of their own, awaited at the cluster's end
cpu_phases_niced() {
  renice -n 10 -p "$BASHPID" >/dev/null
  cpu_phases
}
# The cluster tests that only make objects of their own (a namespace,
# claims, pods placed where they say, a class or account of their own)
# and restart, cordon, taint, fill or reconfigure nothing: they run side
# by side, one per program at a time and the programs at once; every
# other cluster test runs alone. PROGRAM:TEST, by exact name.
side_by_side=(
  scenarios:cinder_volumes_keep_data_grow_snapshot_restore_serve_raw_block_and_go
  scenarios:cephfs_shares_are_shared_by_pods_read_only_where_asked_and_their_key_dies_with_them
  scenarios:backed::a_read_only_claim_backed_by_a_cephfs_snapshot_reads_the_snapshot_and_keeps_it
  scenarios:attributes::a_volume_attributes_class_changes_a_written_volumes_cinder_metadata_without_a_retype
  scenarios:groups::a_group_snapshot_of_a_share_groups_claims_restores_each_member_and_leaves_nothing
  nodes:a_cephfs_share_is_read_on_every_node_at_once_each_with_its_own_mount
  nodes:volumes_live_and_attach_only_in_their_zone_and_restores_never_lie_about_it
  security:a_cephfs_node_plugins_token_starts_real_mount_pods_on_its_node_and_nothing_else
  security:a_node_plugins_roles_confine_whoever_holds_them_under_any_name
)
# side_by_side_of PROGRAM exact|skip: the side-by-side tests of a program,
# as libtest arguments (to run them alone, or to leave them out)
side_by_side_of() {
  local program=$1 how=$2 entry
  for entry in "${side_by_side[@]}"; do
    [[ ${entry%%:*} == "$program" ]] || continue
    [[ $how == exact ]] && printf '%s\n' "${entry#*:}" || printf -- '--skip\n%s\n' "${entry#*:}"
  done
}
cluster_side_by_side() {
  local program rc=0 pids=() names
  for program in scenarios nodes security; do
    mapfile -t names < <(side_by_side_of "$program" exact)
    # each program's output kept whole, printed once all are done
    run_tests cluster-tests "$program" --ignored --exact --show-output "${names[@]}" \
      >"$work/side-by-side-$program.out" 2>&1 &
    pids+=($!)
  done
  for program in "${!pids[@]}"; do wait "${pids[$program]}" || rc=1; done
  cat "$work"/side-by-side-{scenarios,nodes,security}.out
  # a name that matches no test any more would pass by running nothing
  local ran expected=${#side_by_side[@]}
  ran=$(cat "$work"/side-by-side-*.out | grep -c -E '^test .* \.\.\. (ok|FAILED)$' || true)
  ((ran == expected)) || { echo "side by side: $ran tests ran, $expected named"; rc=1; }
  return $rc
}
if [[ -e $work/cluster-up ]]; then
  lane_job 3 cpu_phases_niced
  tests "cluster tier: the tests that touch nothing of another's, side by side (Cinder, CephFS, zones, accounts)" \
    cluster_side_by_side
  mapfile -t alone < <(side_by_side_of scenarios skip)
  tests "cluster tier: scenarios through kubectl and app pods" \
    run_tests cluster-tests scenarios --ignored --test-threads=1 --show-output "${alone[@]}"
  mapfile -t alone < <(side_by_side_of security skip)
  tests "cluster tier: what a plugin's own token may do (security)" \
    run_tests cluster-tests security --ignored --test-threads=1 --show-output "${alone[@]}"
  mapfile -t alone < <(side_by_side_of nodes skip)
  tests "cluster tier: many nodes (volumes follow their pods, shares on every node, limits steer)" \
    run_tests cluster-tests nodes --ignored --test-threads=1 --show-output --skip "$dead_node" "${alone[@]}"
  tests "cluster tier: production faults (a seeded campaign, every fault class once; its checks)" \
    run_tests cluster-tests campaign --ignored --test-threads=1 --show-output
  # the dead node (B, which it kills and replaces) beside the quick
  # figures of the single-node pods (all on A): the scenario mostly waits
  # for the node controller and podgc; the quick figures are only run
  # through, not read (the controller's time summed counts the
  # scenario's attaches too)
  background_tests "cluster tier: a node dies, a new one joins" \
    run_tests cluster-tests nodes --ignored --exact "$dead_node" --show-output
  tests "cluster tier: figures bench, quick" run_bench cluster-tests figures
  await_background
  # the scale bench's quick mode (its pods on A alone) beside the
  # many-node figures (moves and drains of B); both only run through
  background_tests "cluster tier: scale bench, quick (bursts, an attach wave, churn, snapshots and expansion, each through once)" \
    run_bench cluster-tests scale
  tests "cluster tier: many-node figures bench, quick" run_bench cluster-tests nodes
  await_background
  # last: it replaces deploy/suite with the charts for a while (and puts
  # it back); the KMS chart's test and the migrations from upstream's ran
  # in the cluster's first lane
  tests "cluster tier: the Helm charts (through the apiserver, install, upgrade under writers, rollback, uninstall)" \
    python3 tests/helm/charts.py --cluster --skip=the_kms_charts --skip=upstream
  lane_await 3
fi
# without the cluster, they have nothing to run beside
[[ -e $work/cluster-up ]] || cpu_phases
# the containers' logs of a failed run, before `down` removes them with
# the pods (the cleanup's copy comes only when the run ends early)
if ((${#failed_phases[@]})) && [[ -e $work/cluster-up ]]; then
  keep_cluster_logs "$work/logs/cluster" || true
fi
# down fails when anything of the cluster is left on the machine
tests "cluster tier down (nothing left)" python3 tests/cluster/cluster.py down
cluster_started=
phase "real OpenStack down" python3 tests/openstack/cloud.py down
cloud_started=

# each test once: passed if it passed in any phase, skipped if only ever
# ignored (or filtered out), failed if it failed anywhere
awk -v declared="$work/declared-skips" '
  BEGIN { while ((getline line < declared) > 0) if (line != "") d[++nd] = line }
  /^test .* \.\.\. ok$/      { s[$2] = (s[$2] == "failed") ? "failed" : "passed" }
  /^test .* \.\.\. FAILED$/  { s[$2] = "failed" }
  /^test .* \.\.\. ignored/  { if (!($2 in s)) { s[$2] = "skipped"; i = index($0, "... ignored"); r[$2] = substr($0, i + 13) } }
  # a test that passed by skipping at run time (its shown output says so)
  /^---- .* stdout ----$/    { shown = $2 }
  /^test result: /           { shown = "" }
  /\(OPENSTACK_TEST_MISSING_SERVICES\)$/ { if (shown != "") runtime[shown] = 1 }
  END {
    for (t in runtime) if (s[t] == "passed") { s[t] = "skipped"; r[t] = "skipped at run time: OPENSTACK_TEST_MISSING_SERVICES" }
    # benches and fuzz targets are not tests: counted on lines of their own
    for (t in s) {
      kind = (index(t, "bench/") == 1) ? "bench" : (index(t, "fuzz/") == 1) ? "fuzz" : "test"
      c[kind, s[t]]++
    }
    for (t in s) if (s[t] == "skipped") {
      ok = 0
      for (i = 1; i <= nd; i++) if (index(t, d[i]) == 1) ok = 1
      if (!ok) undeclared++
      printf "skipped: %s%s%s\n", t, (r[t] == "" ? "" : " (" r[t] ")"), (ok ? "" : " UNDECLARED")
    }
    printf "benches (quick, figures not judged): %d ran through, %d failed\n", c["bench", "passed"], c["bench", "failed"]
    printf "fuzz targets: %d found nothing, %d found a crash\n", c["fuzz", "passed"], c["fuzz", "failed"]
    printf "tests: %d passed, %d failed, %d skipped\n", c["test", "passed"], c["test", "failed"], c["test", "skipped"]
    if (undeclared) { printf "%d skipped without a tier declaring it (UNDECLARED above)\n", undeclared; exit 1 }
  }' "$log" | tee "$work/summary.out" || {
  failed_phases+=("summary: tests skipped that no tier declared")
  grep UNDECLARED "$work/summary.out" >"$work/summary.failed" || true
  failed_outs+=("$work/summary.failed")
}
run_finished=1
time_and_failures
((${#failed_phases[@]} == 0)) || exit 1
