package compute

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
)

// Credentials mints and checks supervisor credentials. A credential is an HMAC
// of (sandbox, generation) under a secret the service keeps, so every start or
// resume gets a fresh one, the log never holds it, and any replica holding the
// secret can verify an attach without a lookup.
type Credentials struct {
	secret []byte
	bus    func(id string, gen int64) (string, error)
}

// NewCredentials returns Credentials under secret (at least 16 bytes).
func NewCredentials(secret []byte) (*Credentials, error) {
	if len(secret) < 16 {
		return nil, fmt.Errorf("credential secret has %d bytes, want 16 or more", len(secret))
	}
	return &Credentials{secret: secret}, nil
}

// NewSecret returns 32 random bytes for NewCredentials.
func NewSecret() ([]byte, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return nil, fmt.Errorf("credential secret: %w", err)
	}
	return b, nil
}

// Mint returns the credential of generation gen of sandbox id.
func (c *Credentials) Mint(id string, gen int64) string {
	m := hmac.New(sha256.New, c.secret)
	m.Write([]byte(id))
	m.Write([]byte{0})
	m.Write([]byte(strconv.FormatInt(gen, 10)))
	return hex.EncodeToString(m.Sum(nil))
}

// WithBus returns c that also mints each supervisor's NATS credentials
// (Start.BusCreds) with mint.
func (c *Credentials) WithBus(mint func(id string, gen int64) (string, error)) *Credentials {
	d := *c
	d.bus = mint
	return &d
}

// MintBus returns the NATS credentials of generation gen of sandbox id's
// supervisor, empty when c mints none.
func (c *Credentials) MintBus(id string, gen int64) (string, error) {
	if c.bus == nil {
		return "", nil
	}
	return c.bus(id, gen)
}

// Verify reports whether cred is the credential of generation gen of id.
func (c *Credentials) Verify(id string, gen int64, cred string) bool {
	return hmac.Equal([]byte(c.Mint(id, gen)), []byte(cred))
}
