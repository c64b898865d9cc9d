package transporttest

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
)

// PEMFiles names the PEM files WriteFiles wrote for one peer.
type PEMFiles struct {
	// CAFile holds the issuing CA's certificate.
	CAFile string
	// CertFile holds the peer's leaf certificate.
	CertFile string
	// KeyFile holds the peer's private key (PKCS #8).
	KeyFile string
}

// CertPEM returns this CA's certificate, PEM-encoded.
func (ca *CA) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw})
}

// EncodePEM returns the leaf certificate and private key of cert,
// PEM-encoded, for code that loads them with tls.X509KeyPair.
func EncodePEM(cert tls.Certificate) (certPEM, keyPEM []byte, err error) {
	der, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		return nil, nil, err
	}
	for _, c := range cert.Certificate {
		certPEM = append(certPEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c})...)
	}
	return certPEM, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// WriteFiles issues a certificate for name, as Certificate does, and writes
// it, its key and this CA's certificate into dir as name-cert.pem,
// name-key.pem and name-ca.pem. Libraries that read their TLS material from
// files (dragonboat's mutual TLS, for one) need this; give each test its
// own dir, typically tb.TempDir(). The key file is readable by its owner
// only.
func (ca *CA) WriteFiles(dir, name string) PEMFiles {
	ca.tb.Helper()
	certPEM, keyPEM, err := EncodePEM(ca.Certificate(name))
	if err != nil {
		ca.tb.Fatalf("transporttest: encode key for %s: %v", name, err)
	}
	f := PEMFiles{
		CAFile:   filepath.Join(dir, name+"-ca.pem"),
		CertFile: filepath.Join(dir, name+"-cert.pem"),
		KeyFile:  filepath.Join(dir, name+"-key.pem"),
	}
	for _, w := range []struct {
		path string
		data []byte
		perm os.FileMode
	}{
		{f.CAFile, ca.CertPEM(), 0o644},
		{f.CertFile, certPEM, 0o644},
		{f.KeyFile, keyPEM, 0o600},
	} {
		if err := os.WriteFile(w.path, w.data, w.perm); err != nil {
			ca.tb.Fatalf("transporttest: write %s: %v", w.path, err)
		}
	}
	return f
}
