#!/usr/bin/env python3
"""Prints an engine's effective GPU-relevant configuration as JSON, for runtime_configure.sh.

usage: effective_config.py containerd DUMP.toml   (`containerd --config F config dump` output)
       effective_config.py docker DAEMON.json
       effective_config.py crio MAIN.toml DROPIN_DIR   (CRI-O merges crio.conf.d/*.toml over the file)
containerd: the CRI plugin's runtimes, default runtime and CDI settings (1.x `grpc.v1.cri` and
2.x `cri.v1.runtime` layouts); docker: runtimes, default-runtime, features; crio: crio.runtime.
"""
import glob
import json
import os
import sys
import tomllib


def merge(a, b):
    for k, v in b.items():
        if isinstance(v, dict) and isinstance(a.get(k), dict):
            merge(a[k], v)
        else:
            a[k] = v
    return a


def main():
    kind = sys.argv[1]
    if kind == "containerd":
        with open(sys.argv[2], "rb") as f:
            d = tomllib.load(f)
        p = d.get("plugins", {})
        if "io.containerd.cri.v1.runtime" in p:  # containerd 2.x
            cri = p["io.containerd.cri.v1.runtime"]
        else:
            cri = p["io.containerd.grpc.v1.cri"]
        c = cri.get("containerd", {})
        out = {"default_runtime_name": c.get("default_runtime_name"), "runtimes": c.get("runtimes", {}),
               "enable_cdi": cri.get("enable_cdi"), "cdi_spec_dirs": cri.get("cdi_spec_dirs")}
    elif kind == "docker":
        with open(sys.argv[2]) as f:
            d = json.load(f)
        out = {k: d.get(k) for k in ("runtimes", "default-runtime", "features")}
    elif kind == "crio":
        with open(sys.argv[2], "rb") as f:
            d = tomllib.load(f)
        for name in sorted(glob.glob(os.path.join(sys.argv[3], "*.toml"))):
            with open(name, "rb") as f:
                merge(d, tomllib.load(f))
        out = d.get("crio", {}).get("runtime", {})
    else:
        sys.exit(f"effective_config.py: unknown engine {kind}")
    print(json.dumps(out, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
