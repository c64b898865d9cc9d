package transporttest

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"testing"
)

// The written files load the way dragonboat loads them (tls.LoadX509KeyPair
// and a pool from the CA file), and the leaf verifies against that pool
// only: a second CA's file must not accept it.
func TestWriteFiles(t *testing.T) {
	dir := t.TempDir()
	ca, other := NewCA(t), NewCA(t)
	f := ca.WriteFiles(dir, "peer-1")
	g := other.WriteFiles(dir, "peer-2")

	pair, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	verify := func(caFile string) error {
		raw, err := os.ReadFile(caFile)
		if err != nil {
			t.Fatal(err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(raw) {
			t.Fatalf("%s holds no certificate", caFile)
		}
		_, err = leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "127.0.0.1", KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
		return err
	}
	if err := verify(f.CAFile); err != nil {
		t.Fatalf("leaf does not verify against its CA file: %v", err)
	}
	if err := verify(g.CAFile); err == nil {
		t.Fatal("leaf verifies against another CA's file")
	}
	st, err := os.Stat(f.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	if perm := st.Mode().Perm(); perm != 0o600 {
		t.Fatalf("key file mode %v, want 0600", perm)
	}
}
