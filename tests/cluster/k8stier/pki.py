"""The cluster's PKI (a CA, each component's certificate, kubeconfigs) and
kubectl against it."""

import ssl
import subprocess

from .config import HOST, PORTS, STATE, http, nodes, run


def openssl(*args):
    run(["openssl", *args])


def issue(name, cn, org=None, sans=(), server=False):
    """A certificate signed by the cluster CA (EC P-256)."""
    pki = STATE / "pki"
    key, csr, crt = pki / f"{name}.key", pki / f"{name}.csr", pki / f"{name}.crt"
    if crt.exists():
        return
    subj = f"/CN={cn}" + (f"/O={org}" if org else "")
    openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", key, "-out", csr, "-subj", subj)
    ext = pki / f"{name}.ext"
    lines = ["basicConstraints=CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment",
             f"extendedKeyUsage={'serverAuth' if server else 'clientAuth'}"]
    if sans:
        lines.append("subjectAltName=" + ",".join(sans))
    ext.write_text("\n".join(lines) + "\n")
    openssl("x509", "-req", "-in", csr, "-CA", pki / "ca.crt", "-CAkey", pki / "ca.key", "-CAcreateserial",
            "-days", "30", "-out", crt, "-extfile", ext)
    csr.unlink()
    ext.unlink()
    key.chmod(0o600)


def kubeconfig(name, user):
    pki = STATE / "pki"
    path = STATE / f"{name}.kubeconfig"
    path.write_text(f"""apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    certificate-authority: {pki / 'ca.crt'}
    server: https://{HOST}:{PORTS['apiserver']}
users:
- name: {user}
  user:
    client-certificate: {pki / (user + '.crt')}
    client-key: {pki / (user + '.key')}
contexts:
- name: test
  context:
    cluster: test
    user: {user}
current-context: test
""")
    path.chmod(0o600)
    return path


def setup_pki():
    pki = STATE / "pki"
    pki.mkdir(parents=True, exist_ok=True)
    if not (pki / "ca.crt").exists():
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                "-keyout", pki / "ca.key", "-out", pki / "ca.crt", "-days", "30", "-subj", "/CN=k8s-test-ca")
        (pki / "ca.key").chmod(0o600)
    issue("apiserver", "kube-apiserver", sans=[
        "IP:127.0.0.1", "IP:10.96.0.1", "DNS:localhost", "DNS:kubernetes", "DNS:kubernetes.default",
        "DNS:kubernetes.default.svc", "DNS:kubernetes.default.svc.cluster.local"], server=True)
    issue("admin", "kubernetes-admin", "system:masters")
    issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", "system:masters")
    for node in nodes():
        issue(node.kubelet_user, f"system:node:{node.name}", "system:nodes")
    issue("kube-controller-manager", "system:kube-controller-manager")
    issue("kube-scheduler", "system:kube-scheduler")
    if not (pki / "sa.key").exists():
        openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-out", pki / "sa.key")
        openssl("pkey", "-in", pki / "sa.key", "-pubout", "-out", pki / "sa.pub")
        (pki / "sa.key").chmod(0o600)
    for user in ("admin", "kube-controller-manager", "kube-scheduler", *(n.kubelet_user for n in nodes())):
        kubeconfig(user, user)


def kubectl(*args, check=True, input=None, timeout=300):
    cmd = ["kubectl", f"--kubeconfig={STATE / 'admin.kubeconfig'}", *args]
    if check:
        return run(cmd, input=input, timeout=timeout)
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, input=input, timeout=timeout)


def api_ready(port=PORTS["apiserver"], check="readyz"):
    ctx = ssl.create_default_context(cafile=str(STATE / "pki" / "ca.crt"))
    ctx.load_cert_chain(str(STATE / "pki" / "admin.crt"), str(STATE / "pki" / "admin.key"))
    # kms-providers included: Secrets cannot be written before
    status, _, _ = http("GET", f"https://{HOST}:{port}/{check}", context=ctx, timeout=3)
    return status == 200
