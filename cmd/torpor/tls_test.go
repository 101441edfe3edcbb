package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/internal/busauth"
	torpor "github.com/torpor/torpor/sdk/go"
	"github.com/torpor/torpor/services/compute/vm"
)

// testPKI is a CA made for one test and a certificate it signed for
// 127.0.0.1 and localhost, as PEM files under a temp dir.
type testPKI struct {
	CA, Cert, Key string
	pool          *x509.CertPool
}

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "torpor test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "torpor"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.IPv6loopback},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	p := testPKI{CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "cert.pem"), Key: filepath.Join(dir, "key.pem"), pool: x509.NewCertPool()}
	p.pool.AddCert(caCert)
	for file, block := range map[string]*pem.Block{
		p.CA:   {Type: "CERTIFICATE", Bytes: caDER},
		p.Cert: {Type: "CERTIFICATE", Bytes: der},
		p.Key:  {Type: "EC PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(file, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// TestHTTPOverTLS: with --tls-cert and --tls-key the API is served over
// TLS only; a client that trusts the CA (the SDK with its http.Client, the
// CLI with --ca or $TORPOR_CA) gets through, one that does not is refused by
// its own verification, and plain HTTP gets nothing from the port.
func TestHTTPOverTLS(t *testing.T) {
	pki := newTestPKI(t)
	a := startApp(t, "", func(c *serveConfig) { c.TLSCert, c.TLSKey = pki.Cert, pki.Key })
	if !strings.HasPrefix(a.HTTPURL(), "https://") {
		t.Fatalf("HTTPURL %s: want https", a.HTTPURL())
	}
	ctx := context.Background()
	trusting := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pki.pool}}}
	c := torpor.New(a.HTTPURL(), trusting).WithToken(a.AdminToken())
	v, err := c.Create(ctx, torpor.CreateRequest{Name: "secure", Driver: "sim"}, "")
	if err != nil {
		t.Fatalf("create over TLS: %v", err)
	}
	mustWait(t, c, v.ID, events.PhaseReady)

	untrusting := torpor.New(a.HTTPURL(), &http.Client{Transport: &http.Transport{}}).WithToken(a.AdminToken())
	if _, err := untrusting.Get(ctx, v.ID); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("a client that does not trust the CA: %v, want a certificate error", err)
	}
	if _, err := torpor.New("http://"+a.HTTPAddr(), trusting).WithToken(a.AdminToken()).Get(ctx, v.ID); err == nil {
		t.Error("plain HTTP to the TLS port answered")
	}

	srv := a.HTTPURL()
	tok := "TORPOR_TOKEN=" + a.AdminToken()
	if code, out, stderr := torporRun(t, srv, []string{tok}, "--ca", pki.CA, "get", "secure", "-o", "name"); code != 0 || strings.TrimSpace(out) != "secure" {
		t.Errorf("torpor --ca get: exit %d %q %s", code, out, stderr)
	}
	if code, out, stderr := torporRun(t, srv, []string{tok, "TORPOR_CA=" + pki.CA}, "get", "secure", "-o", "name"); code != 0 || strings.TrimSpace(out) != "secure" {
		t.Errorf("TORPOR_CA torpor get: exit %d %q %s", code, out, stderr)
	}
	if code, _, stderr := torporRun(t, srv, []string{tok}, "get", "secure"); code == 0 || !strings.Contains(stderr, "certificate") {
		t.Errorf("torpor get without the CA: exit %d %s; want a certificate error", code, stderr)
	}
	if code, _, stderr := torporRun(t, srv, []string{tok}, "--ca", pki.Key, "get", "secure"); code != 2 || !strings.Contains(stderr, "INVALID_ARGUMENT") {
		t.Errorf("torpor --ca KEYFILE: exit %d %s; want 2 INVALID_ARGUMENT", code, stderr)
	}

	for _, c := range []struct {
		name string
		mod  func(*serveConfig)
	}{
		{"a certificate without its key", func(c *serveConfig) { c.TLSCert = pki.Cert }},
		{"a key that is no certificate", func(c *serveConfig) { c.TLSCert, c.TLSKey = pki.Key, pki.Key }},
	} {
		cfg := serveConfig{Data: t.TempDir(), HTTP: "127.0.0.1:0", NATSListen: "127.0.0.1:0", Fsync: "interval", Node: "local", Deadline: time.Minute, DuplicateWindow: time.Minute, HeartbeatLimit: time.Second}
		c.mod(&cfg)
		if _, err := start(ctx, cfg, zerolog.New(zerolog.NewTestWriter(t)).Level(testLogLevel)); events.CodeOf(err) != events.CodeInvalidArgument {
			t.Errorf("%s: %v, want INVALID_ARGUMENT", c.name, err)
		}
	}
}

// TestNATSOverTLS: with --tls-cert the embedded NATS server takes TLS
// clients only, with the same certificate: a client (with a user of the
// bus) that trusts the CA connects, one that does not is refused by its own
// verification, and a process sandbox's supervisor, which the driver tells
// to trust the certificate, attaches over TLS (the sandbox gets ready).
func TestNATSOverTLS(t *testing.T) {
	pki := newTestPKI(t)
	kernel := os.Getenv(vm.KernelEnv)
	if kernel == "" {
		kernel = "/var/lib/torpor/vm/vmlinuz"
	}
	a, _, dir := processApp(t, 15*time.Second, func(c *serveConfig) {
		c.TLSCert, c.TLSKey, c.VMKernel = pki.Cert, pki.Key, kernel
		// A TCG guest boots in about 4 s on an idle host, and took more
		// than the tests' 10 s deadline on a busy one (CI).
		c.Deadline = time.Minute
	})
	t.Cleanup(func() { deleteVMSandboxes(t, dir) })
	c := torpor.New(a.HTTPURL(), &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pki.pool}}}).WithToken(a.AdminToken())
	opts, err := a.NATSOptionsAs(busauth.Grant{Role: busauth.Dashboard})
	if err != nil {
		t.Fatal(err)
	}
	if nc, err := nats.Connect(a.NATSURL(), opts...); err == nil {
		nc.Close()
		t.Error("a client that does not trust the CA connected")
	} else if !strings.Contains(err.Error(), "certificate") {
		t.Errorf("a client that does not trust the CA: %v, want a certificate error", err)
	}
	nc, err := nats.Connect(a.NATSURL(), append(opts, nats.RootCAs(pki.CA))...)
	if err != nil {
		t.Fatalf("a client that trusts the CA: %v", err)
	}
	defer nc.Close()
	if !nc.TLSRequired() {
		t.Error("the connection is not TLS")
	}
	ctx := context.Background()
	v, err := c.Create(ctx, torpor.CreateRequest{Name: "tls-proc", Driver: "process", Command: []string{"sh", "-c", "sleep 600"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	mustWait(t, c, v.ID, events.PhaseReady)
	// A vm sandbox's supervisor, inside the guest, is handed the CA too
	// and attaches over TLS; so does its next generation after a resume.
	t.Run("vm", func(t *testing.T) {
		vmKernel(t) // skips (fails under CI=true) without QEMU or the kernel
		v, err := c.Create(ctx, torpor.CreateRequest{Name: "tls-vm", Driver: "vm", Command: []string{"sh", "-c", "sleep 600"}}, "")
		if err != nil {
			t.Fatal(err)
		}
		mustWait(t, c, v.ID, events.PhaseReady)
		if _, err := c.Suspend(ctx, v.ID); err != nil {
			t.Fatal(err)
		}
		mustWait(t, c, v.ID, events.PhaseSuspended)
		if _, err := c.Resume(ctx, v.ID, torpor.ResumeOptions{}, ""); err != nil {
			t.Fatal(err)
		}
		if got := mustWait(t, c, v.ID, events.PhaseReady); got.Generation != 2 {
			t.Errorf("resumed under generation %d, want 2", got.Generation)
		}
	})
}
