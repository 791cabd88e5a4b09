# no_leftovers WHAT HOLDER_PID: after a stop, nothing of the cluster is left on the host (compared
# with what up_test.sh recorded before the first start). Sourced after lib.sh.
links() { ip -o link | awk -F': ' '{print $2}' | sort; }
kube_rules() { (iptables-save; ip6tables-save) 2>/dev/null | grep -E 'KUBE-' | sort; }
no_leftovers() {
  local what=$1 holder=$2 left p args
  left=$(for p in /proc/[0-9]*; do
    mapfile -d '' args < "$p/cmdline" 2>/dev/null || continue
    # Ours name the cluster directory; the same binaries may run elsewhere (tests/scale's harness).
    case "${args[*]}" in *"$D/"*) echo "${p#/proc/}" ;; esac
  done)
  [ -z "$holder" ] || check "$what: the mount namespace holder ($holder) is gone" bash -c '! kill -0 "$1" 2>/dev/null' _ "$holder"
  check "$what: no cluster process left ($left)" [ -z "$left" ]
  check "$what: no mount under $D or on /var/lib/kubelet left" \
    bash -c '! grep -qE " ($1/|/var/lib/kubelet|/var/log/pods)" /proc/self/mountinfo' _ "$D"
  check "$what: network devices as before" [ "$(links)" = "$(cat "$STATE/links.before")" ]
  # The pod network (testing/k8s/cluster pod_network_up): its bridge, and libcni's cache, which the
  # mount namespace keeps off the host's /var/lib/cni (as it keeps containerd's netns pins off /run/netns).
  check "$what: the pod network's bridge gpulet-cni0 is gone" bash -c '! ip link show gpulet-cni0 >/dev/null 2>&1'
  check "$what: nothing of the pod network in the host's /var/lib/cni" bash -c '! grep -rqs gpulet-pods /var/lib/cni'
  check "$what: KUBE-* iptables rules as before" [ "$(kube_rules)" = "$(cat "$STATE/kube-rules.before")" ]
  check "$what: no kubepods cgroup left" bash -c '! ls -d /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods 2>/dev/null | grep -q .'
  check "$what: $D removed" [ ! -e "$D" ]
}

# own_containerd2_cluster OVERLAY: a containerd 2 cluster of this test's own, for a test that applies
# OVERLAY as an admin would: skips (77) without podman or while another cluster runs; records what
# no_leftovers compares with; sets $holder, $NS, $OVERLAY and $CONFIG (the cluster's config.toml);
# imports gpulet's image through containerd 2's own ctr; on exit deletes the overlay and stops the
# cluster. Its own cluster because the shared one runs containerd 1.6.
own_containerd2_cluster() {
  command -v podman >/dev/null || { echo "skipped: podman missing (the image is built with podman build)"; exit 77; }
  if [ -f "$D/admin.kubeconfig" ] && kc get --raw /readyz >/dev/null 2>&1; then
    echo "skipped: a cluster is running in $D (make cluster-down first; this test needs its own)"; exit 77
  fi
  rm -rf "$STATE"; mkdir -p "$STATE"
  links > "$STATE/links.before"
  kube_rules > "$STATE/kube-rules.before"
  GPULET_CLUSTER_RUNTIME=containerd2 "$cluster" up "$build" >/dev/null || { echo "FAIL: cluster up (containerd2)"; exit 1; }
  holder=$(cat "$D/pids/holder")
  NS=gpulet-system
  OVERLAY=$1
  CONFIG=$D/fixed/etc/containerd/config.toml
  trap 'kc delete -k "$OVERLAY" --ignore-not-found --wait=true --timeout=60s >/dev/null 2>&1; "$cluster" down "$build" >/dev/null 2>&1' EXIT
  default_sa
  ctr_k8s() { nsenter -t "$holder" -m -- env PATH="$build/k8s/containerd2/bin:$PATH" ctr --address "$D/containerd/containerd.sock" -n k8s.io "$@"; }
  gpulet_image "$STATE" || exit 1
}
