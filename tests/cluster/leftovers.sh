# no_leftovers WHAT HOLDER_PID: after a stop, nothing of the cluster is left on the host (compared
# with what up_test.sh recorded before the first start). Sourced after lib.sh.
links() { ip -o link | awk -F': ' '{print $2}' | sort; }
kube_rules() { (iptables-save; ip6tables-save) 2>/dev/null | grep -E 'KUBE-' | sort; }
no_leftovers() {
  local what=$1 holder=$2 left p args
  left=$(for p in /proc/[0-9]*; do
    mapfile -d '' args < "$p/cmdline" 2>/dev/null || continue
    case "${args[*]}" in *"$D/"*|*"$K/"*) echo "${p#/proc/}" ;; esac
  done)
  [ -z "$holder" ] || check "$what: the mount namespace holder ($holder) is gone" bash -c '! kill -0 "$1" 2>/dev/null' _ "$holder"
  check "$what: no cluster process left ($left)" [ -z "$left" ]
  check "$what: no mount under $D or on /var/lib/kubelet left" \
    bash -c '! grep -qE " ($1/|/var/lib/kubelet|/var/log/pods)" /proc/self/mountinfo' _ "$D"
  check "$what: network devices as before" [ "$(links)" = "$(cat "$STATE/links.before")" ]
  check "$what: KUBE-* iptables rules as before" [ "$(kube_rules)" = "$(cat "$STATE/kube-rules.before")" ]
  check "$what: no kubepods cgroup left" bash -c '! ls -d /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods 2>/dev/null | grep -q .'
  check "$what: $D removed" [ ! -e "$D" ]
}
