package integration

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pullwise/pullwise/integration/daemon"
)

// TestGRPCTCPWithTLS checks that the replaced grpc-tcp server keeps
// upstream's behaviour: CRI on a TLS listener, through the same interceptor
// chain as the unix socket.
func TestGRPCTCPWithTLS(t *testing.T) {
	certPath, keyPath, pool := selfSigned(t)
	addr := freeLoopback(t)
	e := newEnv(t, envOptions{extraConfig: fmt.Sprintf(`
[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = false

[plugins."io.containerd.server.v1.grpc-tcp"]
  address = %q
  tls_cert = %q
  tls_key = %q
`, addr, certPath, keyPath)})

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const method = `pullwise_cri_requests_total{code="OK",method="/runtime.v1.RuntimeService/Version"}`
	before := e.metric(method)
	v, err := criapi.NewRuntimeServiceClient(conn).Version(ctx, &criapi.VersionRequest{})
	if err != nil {
		t.Fatalf("CRI Version over TLS tcp: %v", err)
	}
	if v.GetRuntimeName() != "containerd" {
		t.Fatalf("runtime name %q", v.GetRuntimeName())
	}
	if got := e.metric(method); got != before+1 {
		t.Fatalf("tcp request not seen by the interceptor chain: %v -> %v", before, got)
	}
}

func freeLoopback(t testing.TB) string { return daemon.FreeAddr(t) }

// selfSigned writes a certificate for 127.0.0.1 and returns its paths and a
// pool that trusts it.
func selfSigned(t *testing.T) (string, string, *x509.CertPool) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "pullwise-test"},
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:                  true,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certPath, keyPath := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return certPath, keyPath, pool
}
