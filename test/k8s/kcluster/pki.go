package kcluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
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

// certSpec is one certificate the cluster's CA signs.
type certSpec struct {
	name   string // file stem: <name>.crt, <name>.key
	cn     string
	org    string
	server bool // serverAuth, else clientAuth
	ips    []net.IP
	dns    []string
}

// writePKI makes the cluster's CA, the service-account signing key and the
// certificates of the components, as PEM files in dir. ECDSA P-256 keys
// throughout: every component takes them, and they take no time to make.
func writePKI(dir, node string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	now := time.Now().Add(-time.Hour)
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "gpulet-test-k8s-ca"},
		NotBefore: now, NotAfter: now.Add(48 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true, IsCA: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	if err := writeCertKey(dir, "ca", caDER, caKey); err != nil {
		return err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	if err := writeKey(filepath.Join(dir, "sa.key"), saKey); err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o600); err != nil {
		return err
	}
	loopback := []net.IP{net.ParseIP("127.0.0.1")}
	specs := []certSpec{
		// 10.96.0.1 is the kubernetes Service's address in the service range
		{name: "apiserver", cn: "kube-apiserver", server: true, ips: append(loopback, net.ParseIP("10.96.0.1")),
			dns: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"}},
		{name: "apiserver-kubelet-client", cn: "kube-apiserver-kubelet-client", org: "system:masters"},
		{name: "admin", cn: "admin", org: "system:masters"},
		{name: "controller-manager", cn: "system:kube-controller-manager"},
		{name: "scheduler", cn: "system:kube-scheduler"},
		// the Node authorizer knows a kubelet by this name and group
		{name: "kubelet", cn: "system:node:" + node, org: "system:nodes"},
		{name: "kubelet-serving", cn: node, server: true, ips: loopback, dns: []string{"localhost"}},
	}
	for i, s := range specs {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(int64(i + 2)), Subject: pkix.Name{CommonName: s.cn},
			NotBefore: now, NotAfter: now.Add(48 * time.Hour),
			KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
			IPAddresses: s.ips, DNSNames: s.dns,
		}
		if s.org != "" {
			tmpl.Subject.Organization = []string{s.org}
		}
		if s.server {
			tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return fmt.Errorf("signing %s: %w", s.name, err)
		}
		if err := writeCertKey(dir, s.name, der, key); err != nil {
			return err
		}
	}
	return nil
}

func writeCertKey(dir, name string, der []byte, key *ecdsa.PrivateKey) error {
	if err := os.WriteFile(filepath.Join(dir, name+".crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return err
	}
	return writeKey(filepath.Join(dir, name+".key"), key)
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	b, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: b}), 0o600)
}
