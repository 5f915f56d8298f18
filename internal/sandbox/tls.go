package sandbox

import (
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
	"time"
)

// TLSFiles names the PEM files of a throwaway certificate authority and the
// two certificates it signed: one for a server on 127.0.0.1, ::1 and
// localhost, and one for a client.
type TLSFiles struct {
	Dir string // the directory holding them

	CA string // the CA certificate: what a client must trust

	ServerCert, ServerKey string
	ClientCert, ClientKey string
}

// WriteTLSFiles generates a new CA, a server and a client certificate signed
// by it, valid from an hour ago for a day, and writes them to dir as PEM
// (keys unencrypted, mode 0600). Every call makes a different CA, so files
// of two calls do not trust each other.
func WriteTLSFiles(dir string) (TLSFiles, error) {
	f := TLSFiles{
		Dir:        dir,
		CA:         filepath.Join(dir, "ca.pem"),
		ServerCert: filepath.Join(dir, "server.pem"),
		ServerKey:  filepath.Join(dir, "server-key.pem"),
		ClientCert: filepath.Join(dir, "client.pem"),
		ClientKey:  filepath.Join(dir, "client-key.pem"),
	}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return TLSFiles{}, fmt.Errorf("generate CA key: %w", err)
	}
	ca := &x509.Certificate{
		Subject:               pkix.Name{CommonName: "cdc-relay test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := sign(ca, ca, caKey, caKey)
	if err != nil {
		return TLSFiles{}, fmt.Errorf("sign CA certificate: %w", err)
	}
	if ca, err = x509.ParseCertificate(caDER); err != nil {
		return TLSFiles{}, fmt.Errorf("parse CA certificate: %w", err)
	}
	if err := writePEM(f.CA, "CERTIFICATE", caDER); err != nil {
		return TLSFiles{}, err
	}
	leaves := []struct {
		cert, key string
		tmpl      *x509.Certificate
	}{
		{f.ServerCert, f.ServerKey, &x509.Certificate{
			Subject:     pkix.Name{CommonName: "localhost"},
			DNSNames:    []string{"localhost"},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		}},
		{f.ClientCert, f.ClientKey, &x509.Certificate{
			Subject:     pkix.Name{CommonName: "cdc-relay test client"},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}},
	}
	for _, l := range leaves {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return TLSFiles{}, fmt.Errorf("generate key for %s: %w", l.cert, err)
		}
		l.tmpl.NotBefore, l.tmpl.NotAfter = ca.NotBefore, ca.NotAfter
		l.tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		der, err := sign(l.tmpl, ca, key, caKey)
		if err != nil {
			return TLSFiles{}, fmt.Errorf("sign %s: %w", l.cert, err)
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return TLSFiles{}, fmt.Errorf("encode key of %s: %w", l.cert, err)
		}
		if err := writePEM(l.cert, "CERTIFICATE", der); err != nil {
			return TLSFiles{}, err
		}
		if err := writePEM(l.key, "PRIVATE KEY", keyDER); err != nil {
			return TLSFiles{}, err
		}
	}
	return f, nil
}

// sign issues tmpl for key's public half, signed by parent's key.
func sign(tmpl, parent *x509.Certificate, key, parentKey *ecdsa.PrivateKey) ([]byte, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, fmt.Errorf("draw serial number: %w", err)
	}
	tmpl.SerialNumber = serial
	return x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
}

// writePEM writes one PEM block to path, readable by the owner only.
func writePEM(path, blockType string, der []byte) error {
	b := pem.EncodeToMemory(&pem.Block{Type: blockType, Bytes: der})
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// serverConfig is the TLS config of a server presenting f's server
// certificate, requiring a client certificate signed by f's CA when
// clientAuth is set.
func (f TLSFiles) serverConfig(clientAuth bool) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(f.ServerCert, f.ServerKey)
	if err != nil {
		return nil, fmt.Errorf("load server certificate: %w", err)
	}
	c := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if clientAuth {
		pool, err := f.caPool()
		if err != nil {
			return nil, err
		}
		c.ClientCAs = pool
		c.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return c, nil
}

// ClientConfig returns a TLS client config that trusts f's CA and presents
// f's client certificate.
func (f TLSFiles) ClientConfig() (*tls.Config, error) {
	pool, err := f.caPool()
	if err != nil {
		return nil, err
	}
	cert, err := tls.LoadX509KeyPair(f.ClientCert, f.ClientKey)
	if err != nil {
		return nil, fmt.Errorf("load client certificate: %w", err)
	}
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// caPool returns a pool holding f's CA.
func (f TLSFiles) caPool() (*x509.CertPool, error) {
	b, err := os.ReadFile(f.CA)
	if err != nil {
		return nil, fmt.Errorf("read CA certificate: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("read CA certificate: no PEM certificate in %s", f.CA)
	}
	return pool, nil
}
