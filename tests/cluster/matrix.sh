#!/usr/bin/env bash
# The cluster tier on every Kubernetes minor still in support: for each
# version, the cluster comes up with that version's binaries, the
# scenarios, the security tests and the Helm charts' cluster tests run,
# and the cluster goes down; a table of what passed on which version ends
# it (the README's compatibility table is copied from it).
#
#   K8S_MATRIX="1.34=/opt/k8s-bin-1.34 1.35=/opt/k8s-bin-1.35 1.36=/opt/k8s-bin" \
#     bash tests/cluster/matrix.sh [PROGRAM...]
#
# Each folder is laid out as KUBE_BIN_DIR is (../shared/k8s/README.md):
# that minor's kube-apiserver, kube-controller-manager, kube-scheduler and
# kubelet, and the CSI sidecars. PROGRAM: scenarios, security, helm (all
# three when none is named). The real test cloud is brought up first
# (tests/openstack/cloud.py up all, idempotent) and left up. Unset
# K8S_MATRIX: the matrix says so and exits 3 (skipped, never passed); a
# folder without a binary is an error.
set -uo pipefail
cd "$(dirname "$0")/../.."

if [[ -z ${K8S_MATRIX:-} ]]; then
  echo "k8s matrix SKIPPED: K8S_MATRIX is unset (e.g. \"1.34=/opt/k8s-bin-1.34 1.35=/opt/k8s-bin-1.35 1.36=/opt/k8s-bin\")"
  exit 3
fi
programs=("$@")
((${#programs[@]})) || programs=(scenarios security helm)
for p in "${programs[@]}"; do
  [[ $p == scenarios || $p == security || $p == helm ]] || { echo "unknown program $p (scenarios, security, helm)" >&2; exit 2; }
done
for entry in $K8S_MATRIX; do
  dir=${entry#*=}
  for b in kube-apiserver kube-controller-manager kube-scheduler kubelet; do
    [[ -x $dir/kubernetes/bin/$b || -x $dir/$b ]] || { echo "$entry: no $b under $dir (nor its kubernetes/bin)" >&2; exit 1; }
  done
done

out=${MATRIX_OUT:-target/k8s-matrix}
mkdir -p "$out"
python3 tests/openstack/cloud.py up all >"$out/cloud-up.log" 2>&1 || { echo "the test cloud did not come up: $out/cloud-up.log" >&2; exit 1; }
# NAME=VALUE lines (a value may hold spaces), exported
export_lines() {
  local k v
  while IFS='=' read -r k v; do [[ -n $k ]] && export "$k=$v"; done
}
export_lines < <(python3 tests/openstack/cloud.py env)
cargo build -q -p cluster-tests --tests || exit 1

# "passed failed" of a test program's output (cargo's and charts.py's lines)
counts() {
  local passed failed
  passed=$(grep -cE '^test .* \.\.\. ok$' "$1")
  failed=$(grep -cE '^test .* \.\.\. FAILED$' "$1")
  echo "$passed $failed"
}

rows=()
rc=0
for entry in $K8S_MATRIX; do
  minor=${entry%%=*} dir=${entry#*=}
  apiserver=$dir/kubernetes/bin/kube-apiserver
  [[ -x $apiserver ]] || apiserver=$dir/kube-apiserver
  version=$("$apiserver" --version | awk '{print $2}')
  log="$out/$minor"
  mkdir -p "$log"
  echo "== Kubernetes $minor ($version, $dir)"
  python3 tests/cluster/cluster.py down >"$log/down-before.log" 2>&1 || true
  start=$SECONDS
  row="| $minor ($version) |"
  if ! KUBE_BIN_DIR=$dir python3 tests/cluster/cluster.py up >"$log/up.log" 2>&1; then
    echo "   the cluster did not come up: $log/up.log"
    row+=" did not come up |"
    rows+=("$row")
    rc=1
    python3 tests/cluster/cluster.py down >"$log/down.log" 2>&1 || true
    continue
  fi
  export_lines < <(KUBE_BIN_DIR=$dir python3 tests/cluster/cluster.py env)
  export KUBE_BIN_DIR=$dir
  for p in "${programs[@]}"; do
    t0=$SECONDS
    case $p in
      helm) python3 tests/helm/charts.py --cluster >"$log/$p.log" 2>&1 ;;
      *) cargo test -p cluster-tests --test "$p" -- --ignored --test-threads=1 --show-output >"$log/$p.log" 2>&1 ;;
    esac
    status=$?
    read -r passed failed < <(counts "$log/$p.log")
    ((status == 0)) || rc=1
    # a program that failed without a failed test (it did not run) says so
    if ((status != 0 && failed == 0)); then failed="exit $status"; fi
    echo "   $p: $passed passed, $failed failed, $((SECONDS - t0)) s ($log/$p.log)"
    grep -E '^test .* \.\.\. FAILED$' "$log/$p.log" | sed 's/^/     /'
    row+=" $passed passed, $failed failed |"
  done
  python3 tests/cluster/cluster.py down >"$log/down.log" 2>&1 || { echo "   cluster down failed: $log/down.log"; rc=1; }
  row+=" $((SECONDS - start)) s |"
  rows+=("$row")
  unset KUBE_BIN_DIR
done

echo
header="| Kubernetes |"
rule="| --- |"
for p in "${programs[@]}"; do header+=" $p |"; rule+=" --- |"; done
echo "$header time |"
echo "$rule --- |"
printf '%s\n' "${rows[@]}"
exit $rc
