"""The fake API server's reference, checked on the real one: tests/k8s/api_probe.py runs its
scenarios (create, get, list with label and field selectors, merge/strategic/JSON patches and their
conflicts and content types, what the main resource and /status may change, binding, watch starts and
selector transitions, graceful and immediate deletes, events, resource.k8s.io claims) against
kube-apiserver as the cluster admin and compares the transcript with tests/k8s/api_probe.expected,
which the fake must also answer (ctest k8s_api_probe_fake). A difference here means kube-apiserver
changed: the expected file and the fake follow it."""
import harness as h


def test_kube_apiserver_answers_as_the_fakes_reference(kube):
    pki = h.D / "pki"
    rc, out = h.sh("python3", h.SRC / "tests/k8s/api_probe.py", "--url",
                   f"https://127.0.0.1:{h.API_PORT}", "--ca", pki / "ca.crt", "--cert",
                   pki / "admin.crt", "--key", pki / "admin.key", "--expect",
                   h.SRC / "tests/k8s/api_probe.expected")
    print("\n".join("  " + line for line in out.splitlines()))
    assert rc == 0, "kube-apiserver answers as tests/k8s/api_probe.expected says"
