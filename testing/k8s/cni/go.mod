// Test peer only: the CNI plugins of the cluster's pod network (bridge, host-local, loopback). A
// module of its own, beside ../go.mod, so that their requirements never move the Kubernetes pins.
// Pin: CNI_PLUGINS_VERSION in ../build.
module gpulet.test/k8s/cni

go 1.24.2

require github.com/containernetworking/plugins v1.9.1

require (
	github.com/alexflint/go-filemutex v1.3.0 // indirect
	github.com/containernetworking/cni v1.3.0 // indirect
	github.com/coreos/go-iptables v0.8.0 // indirect
	github.com/networkplumbing/go-nft v0.4.0 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/safchain/ethtool v0.6.2 // indirect
	github.com/vishvananda/netlink v1.3.1 // indirect
	github.com/vishvananda/netns v0.0.5 // indirect
	golang.org/x/sys v0.35.0 // indirect
	sigs.k8s.io/knftables v0.0.18 // indirect
)
