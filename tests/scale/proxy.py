#!/usr/bin/env python3
"""TCP forwarders of the scale harness's fault scenarios (tests/scale/run, SCALE_EXTENDER_REPLICAS):

  proxy.py leader --listen HOST:PORT --replica NAME=PORT ... --server URL --ca F --cert F --key F
               --lease NAMESPACE/NAME
      What the extender's Service does in a cluster (deploy/components/vgpu: it selects the pod the
      leader labels): each new connection goes to the replica the Lease names as its holder, read
      every 0.3 s; with no holder, to the first replica (which answers 503 as a follower would).
      kube-scheduler's extender calls come through it, TLS passed through untouched.
  proxy.py cut --listen HOST:PORT --to HOST:PORT --seconds S
      The extender's way to the API server, which a fault can break: on SIGUSR1 every open
      connection is closed and new ones are refused (accepted, then closed at once) for S seconds,
      as when a network path or the API server's load balancer drops.

Standard library only; one thread per connection direction (a harness has a few dozen).
"""
import argparse
import json
import os
import signal
import socket
import ssl
import sys
import threading
import time
import urllib.parse
import urllib.request


def pump(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    for s in (src, dst):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class Forwarder:
    def __init__(self, listen, target):
        host, port = listen.rsplit(":", 1)
        self.sock = socket.create_server((host, int(port)), reuse_port=False)
        self.target = target  # () -> (host, port) or None (refuse)
        self.open = set()
        self.lock = threading.Lock()

    def drop_all(self):
        with self.lock:
            conns, self.open = self.open, set()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()

    def serve(self):
        while True:
            client, _ = self.sock.accept()
            to = self.target()
            if to is None:
                client.close()
                continue
            try:
                upstream = socket.create_connection(to, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.open.update((client, upstream))
            threading.Thread(target=pump, args=(client, upstream), daemon=True).start()
            threading.Thread(target=pump, args=(upstream, client), daemon=True).start()


def leader(a):
    replicas = dict(r.split("=", 1) for r in a.replica)
    first = next(iter(replicas))
    holder = {"name": first}
    ctx = ssl.create_default_context(cafile=a.ca)
    ctx.load_cert_chain(a.cert, a.key)
    ns, name = a.lease.split("/", 1)
    url = f"{a.server}/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}"

    def follow():
        while True:
            try:
                with urllib.request.urlopen(url, context=ctx, timeout=2) as r:
                    h = json.load(r).get("spec", {}).get("holderIdentity") or first
                holder["name"] = h if h in replicas else first
            except Exception:  # noqa: BLE001 - no Lease yet, or the API server restarting
                pass
            time.sleep(0.3)

    threading.Thread(target=follow, daemon=True).start()
    f = Forwarder(a.listen, lambda: ("127.0.0.1", int(replicas[holder["name"]])))
    print(f"proxy leader: {a.listen} -> the holder of {a.lease} among {replicas}", flush=True)
    f.serve()


def cut(a):
    host, port = a.to.rsplit(":", 1)
    refused_until = [0.0]
    f = Forwarder(a.listen, lambda: None if time.time() < refused_until[0] else (host, int(port)))

    def on_cut(*_):
        refused_until[0] = time.time() + a.seconds
        f.drop_all()
        print(f"proxy cut: connections to {a.to} dropped, new ones refused for {a.seconds} s", flush=True)

    signal.signal(signal.SIGUSR1, on_cut)
    print(f"proxy cut: {a.listen} -> {a.to}", flush=True)
    f.serve()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["leader", "cut"])
    p.add_argument("--listen", required=True)
    p.add_argument("--replica", action="append", default=[])
    p.add_argument("--server")
    p.add_argument("--ca")
    p.add_argument("--cert")
    p.add_argument("--key")
    p.add_argument("--lease", default="scale/gpulet-scheduler")
    p.add_argument("--to")
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--pidfile", help="written with this process's pid (the harness finds its processes by its directory in their command lines)")
    a = p.parse_args()
    if a.pidfile:
        with open(a.pidfile, "w") as f:
            f.write(f"{os.getpid()}\n")
    if a.mode == "leader" and not a.replica:
        sys.exit("proxy.py leader: give at least one --replica NAME=PORT")
    (leader if a.mode == "leader" else cut)(a)


if __name__ == "__main__":
    main()
